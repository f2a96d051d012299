{{/* Names. */}}
{{- define "jetraft.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "jetraft.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "jetraft.headless" -}}
{{- printf "%s-headless" (include "jetraft.fullname" .) -}}
{{- end -}}

{{- define "jetraft.clusterName" -}}
{{- default .Release.Name .Values.cluster.name -}}
{{- end -}}

{{- define "jetraft.selectorLabels" -}}
app.kubernetes.io/name: {{ include "jetraft.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "jetraft.labels" -}}
{{ include "jetraft.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Pod i's name and its stable DNS name through the headless service. */}}
{{- define "jetraft.podName" -}}
{{- printf "%s-%d" (include "jetraft.fullname" .root) (int .ordinal) -}}
{{- end -}}

{{- define "jetraft.podHost" -}}
{{- printf "%s.%s.%s.svc.%s" (include "jetraft.podName" .) (include "jetraft.headless" .root) .root.Release.Namespace .root.Values.clusterDomain -}}
{{- end -}}

{{/* A Raft majority of the nodes. */}}
{{- define "jetraft.quorum" -}}
{{- add (div (int .Values.replicas) 2) 1 -}}
{{- end -}}

{{/* The stream replica count placement must satisfy (0 in values: min(replicas, 3)). */}}
{{- define "jetraft.maxStreamReplicas" -}}
{{- $r := int .Values.jetstream.maxStreamReplicas -}}
{{- if eq $r 0 -}}{{- min (int .Values.replicas) 3 -}}{{- else -}}{{- $r -}}{{- end -}}
{{- end -}}

{{/* Node i's zone: byOrdinal[i].zone, else zones[i mod len], else "". */}}
{{- define "jetraft.zone" -}}
{{- $v := .root.Values.serverTags -}}
{{- $o := index ($v.byOrdinal | default dict) (toString .ordinal) | default dict -}}
{{- if $o.zone -}}
{{- $o.zone -}}
{{- else if $v.zones -}}
{{- index $v.zones (mod (int .ordinal) (len $v.zones)) -}}
{{- end -}}
{{- end -}}

{{/* Node i's server_tags as a JSON list: common, the zone tag, then its own. */}}
{{- define "jetraft.tags" -}}
{{- $v := .root.Values.serverTags -}}
{{- $tags := list -}}
{{- range $v.common -}}{{- $tags = append $tags . -}}{{- end -}}
{{- $zone := include "jetraft.zone" . -}}
{{- if $zone -}}{{- $tags = append $tags (printf "%s:%s" $v.zoneTagKey $zone) -}}{{- end -}}
{{- $o := index ($v.byOrdinal | default dict) (toString .ordinal) | default dict -}}
{{- range ($o.tags | default list) -}}{{- $tags = append $tags . -}}{{- end -}}
{{- $tags | uniq | toJson -}}
{{- end -}}

{{/*
Checks a values file must pass; each failure names the value to change.
values.schema.json catches shapes and enums first; these catch combinations
(and the enums again when schema validation is skipped).
*/}}
{{- define "jetraft.validate" -}}
{{- $v := .Values -}}
{{- $n := int $v.replicas -}}
{{- if not (has $n (list 1 3 5)) -}}
{{- fail (printf "replicas must be 1, 3 or 5 (got %d): Raft needs a majority, and an even count tolerates no more failures than the odd count below it" $n) -}}
{{- end -}}
{{- $maxR := int (include "jetraft.maxStreamReplicas" .) -}}
{{- if gt $maxR $n -}}
{{- fail (printf "jetstream.maxStreamReplicas is %d but there are only %d nodes (replicas)" $maxR $n) -}}
{{- end -}}
{{- range $k, $_ := ($v.serverTags.byOrdinal | default dict) -}}
{{- if ge (atoi $k) $n -}}
{{- fail (printf "serverTags.byOrdinal names node %s but replicas is %d (nodes 0..%d)" $k $n (sub $n 1)) -}}
{{- end -}}
{{- end -}}
{{- if $v.jetstream.uniqueTag -}}
{{- $prefix := printf "%s:" $v.jetstream.uniqueTag -}}
{{- $values := list -}}
{{- range $i := until $n -}}
{{- $found := "" -}}
{{- range (include "jetraft.tags" (dict "root" $ "ordinal" $i) | fromJsonArray) -}}
{{- if hasPrefix $prefix . -}}{{- $found = trimPrefix $prefix . -}}{{- end -}}
{{- end -}}
{{- if not $found -}}
{{- fail (printf "jetstream.uniqueTag is %q but node %d has no %q tag: set serverTags.zones (with serverTags.zoneTagKey %q) or serverTags.byOrdinal.%d.zone" $v.jetstream.uniqueTag $i (printf "%s<value>" $prefix) $v.jetstream.uniqueTag $i) -}}
{{- end -}}
{{- $values = append $values $found -}}
{{- end -}}
{{- $distinct := $values | uniq -}}
{{- if lt (len $distinct) $maxR -}}
{{- fail (printf "jetstream.uniqueTag %q needs at least %d distinct values for R%d streams (jetstream.maxStreamReplicas), but the %d nodes have %d: %s" $v.jetstream.uniqueTag $maxR $maxR $n (len $distinct) (join ", " $distinct)) -}}
{{- end -}}
{{- end -}}
{{- if $v.tls.client.enabled -}}
{{- if not $v.tls.client.secretName -}}
{{- fail "tls.client.enabled needs tls.client.secretName (a Secret with tls.crt, tls.key and ca.crt)" -}}
{{- end -}}
{{- if not (has $v.tls.client.mode (list "server" "mutual" "mapped")) -}}
{{- fail (printf "tls.client.mode %q is not a TLS mode: use server, mutual or mapped" $v.tls.client.mode) -}}
{{- end -}}
{{- end -}}
{{- if and $v.tls.cluster.enabled (not $v.tls.cluster.secretName) -}}
{{- fail "tls.cluster.enabled needs tls.cluster.secretName (a Secret with tls.crt, tls.key and ca.crt)" -}}
{{- end -}}
{{- if and $v.auth.enabled (not $v.auth.secretName) -}}
{{- fail "auth.enabled needs auth.secretName (a Secret holding the user and password)" -}}
{{- end -}}
{{- if and $v.cluster.auth.enabled (not $v.cluster.auth.secretName) -}}
{{- fail "cluster.auth.enabled needs cluster.auth.secretName (a Secret holding the route user and password)" -}}
{{- end -}}
{{- $pdbMin := $v.podDisruptionBudget.minAvailable -}}
{{- if and $v.podDisruptionBudget.enabled (not (kindIs "invalid" $pdbMin)) (gt $n 1) -}}
{{- if lt (int $pdbMin) (int (include "jetraft.quorum" .)) -}}
{{- fail (printf "podDisruptionBudget.minAvailable %d would let a drain take the cluster below its Raft majority (%d of %d)" (int $pdbMin) (int (include "jetraft.quorum" .)) $n) -}}
{{- end -}}
{{- end -}}
{{- if and (eq $n 1) (or $v.cluster.auth.enabled $v.tls.cluster.enabled) -}}
{{- fail "cluster.auth / tls.cluster are set but replicas is 1: a single node has no cluster port" -}}
{{- end -}}
{{- end -}}

{{/* Node i's config file, in the nats-server syntax `jetraft serve -c` reads. */}}
{{- define "jetraft.nodeConfig" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $i := int .ordinal -}}
{{- $n := int $v.replicas -}}
# {{ include "jetraft.podName" . }}: rendered by the jetraft Helm chart; do not edit by hand.
server_name: {{ include "jetraft.podName" . | toJson }}
listen: {{ printf "0.0.0.0:%d" (int $v.ports.client) | toJson }}
http: {{ printf "0.0.0.0:%d" (int $v.ports.monitor) | toJson }}
server_tags: {{ include "jetraft.tags" . }}
{{- if $v.jetstream.enabled }}
jetstream {
  store_dir: {{ $v.jetstream.storeDir | toJson }}
  {{- if $v.jetstream.maxFile }}
  max_file: {{ $v.jetstream.maxFile | toJson }}
  {{- end }}
  {{- if $v.jetstream.maxMem }}
  max_mem: {{ $v.jetstream.maxMem | toJson }}
  {{- end }}
  {{- if $v.jetstream.uniqueTag }}
  unique_tag: {{ $v.jetstream.uniqueTag | toJson }}
  {{- end }}
}
{{- end }}
{{- if gt $n 1 }}
cluster {
  name: {{ include "jetraft.clusterName" $root | toJson }}
  listen: {{ printf "0.0.0.0:%d" (int $v.ports.cluster) | toJson }}
  advertise: {{ printf "%s:%d" (include "jetraft.podHost" .) (int $v.ports.cluster) | toJson }}
  # Every other pod of the StatefulSet, by its stable name.
  routes: [
  {{- range $j := until $n }}
  {{- if ne $j $i }}
    {{ printf "nats-route://%s:%d" (include "jetraft.podHost" (dict "root" $root "ordinal" $j)) (int $v.ports.cluster) | toJson }}
  {{- end }}
  {{- end }}
  {{- range $v.cluster.extraRoutes }}
    {{ . | toJson }}
  {{- end }}
  ]
  {{- if $v.cluster.auth.enabled }}
  authorization {
    user: $JETRAFT_CLUSTER_USER
    password: $JETRAFT_CLUSTER_PASSWORD
  }
  {{- end }}
  {{- if $v.tls.cluster.enabled }}
  tls {
    cert_file: "/etc/jetraft/tls/cluster/tls.crt"
    key_file: "/etc/jetraft/tls/cluster/tls.key"
    ca_file: "/etc/jetraft/tls/cluster/ca.crt"
  }
  {{- end }}
}
{{- end }}
{{- if $v.tls.client.enabled }}
tls {
  cert_file: "/etc/jetraft/tls/client/tls.crt"
  key_file: "/etc/jetraft/tls/client/tls.key"
  ca_file: "/etc/jetraft/tls/client/ca.crt"
  {{- if eq $v.tls.client.mode "mutual" }}
  verify: true
  {{- else if eq $v.tls.client.mode "mapped" }}
  verify_and_map: true
  {{- end }}
}
{{- end }}
{{- if $v.auth.enabled }}
authorization {
  user: $JETRAFT_USER
  password: $JETRAFT_PASSWORD
}
{{- end }}
{{- with $v.extraConfig }}
{{ . }}
{{- end }}
{{ end -}}
