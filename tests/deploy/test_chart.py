"""deploy/helm/jetraft rendered by the real helm binary: lint, the manifests, and every
node's config read by Jetraft's own config loader (node/config.py)."""

from __future__ import annotations

from typing import Any

import pytest

from node.config import apply_config, parse_config, validate_options
from node.options import Options
from tests.deploy.chart import CHART, Rendered, helm, render, set_args, template

REL, NS = "jr", "msg"
FULL = f"{REL}-jetraft"
HEADLESS = f"{FULL}-headless"
SECRET_ENV = {"JETRAFT_USER": "alice", "JETRAFT_PASSWORD": "s3cret",
              "JETRAFT_CLUSTER_USER": "route", "JETRAFT_CLUSTER_PASSWORD": "r0ute"}
# Config keys main's loader knows but leaves to the cluster work (branch `routes`
# implements them): loading them is a warning there, never an error or an [FTL].
PENDING_IN_MAIN = {"cluster.advertise", "cluster.tls", "cluster.authorization"}

TLS_AUTH = {
    "tls.client.enabled": "true", "tls.client.secretName": "jr-tls", "tls.client.mode": "mutual",
    "tls.cluster.enabled": "true", "tls.cluster.secretName": "jr-route-tls",
    "auth.enabled": "true", "auth.secretName": "jr-auth",
    "cluster.auth.enabled": "true", "cluster.auth.secretName": "jr-route-auth",
}
SCENARIOS: dict[str, dict[str, str]] = {
    "r1": {"replicas": "1"},
    "r3": {"replicas": "3"},
    "r5-zones-unique": {"replicas": "5", "jetstream.uniqueTag": "az",
                        "serverTags.zones": "{a,b,c}"},
    "r3-tls-auth": {"replicas": "3", **TLS_AUTH},
    "r1-tls-mapped-auth": {"replicas": "1", "tls.client.enabled": "true",
                           "tls.client.secretName": "jr-tls", "tls.client.mode": "mapped",
                           "auth.enabled": "true", "auth.secretName": "jr-auth"},
    "r3-by-ordinal": {"replicas": "3", "serverTags.zones": "{y}", "serverTags.common": "{prod}",
                      "serverTags.byOrdinal.0.zone": "x", "serverTags.byOrdinal.0.tags": "{ssd}",
                      "jetstream.maxFile": "1Ti", "cluster.name": "east"},
}


def pod(i: int) -> str:
    return f"{FULL}-{i}"


def pod_dns(i: int) -> str:
    return f"{pod(i)}.{HEADLESS}.{NS}.svc.cluster.local"


def expected_tags(values: dict[str, str], i: int) -> list[str]:
    common = values.get("serverTags.common", "{}").strip("{}")
    tags = [t for t in common.split(",") if t]
    zones = [z for z in values.get("serverTags.zones", "{}").strip("{}").split(",") if z]
    zone = values.get(f"serverTags.byOrdinal.{i}.zone") or (zones[i % len(zones)] if zones else "")
    if zone:
        tags.append(f"az:{zone}")
    own = values.get(f"serverTags.byOrdinal.{i}.tags", "{}").strip("{}")
    return tags + [t for t in own.split(",") if t]


def load(text: str, name: str) -> Options:
    return apply_config(parse_config(text, f"{name}.conf", env=SECRET_ENV))


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def scenario(request: pytest.FixtureRequest) -> tuple[dict[str, str], Rendered]:
    values = SCENARIOS[request.param]
    return values, render(values, release=REL, namespace=NS)


def test_helm_is_the_real_binary() -> None:
    import subprocess

    out = subprocess.run([helm(), "version", "--short"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("v3."), out


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_lint(name: str) -> None:
    import subprocess

    done = subprocess.run([helm(), "lint", "--strict", str(CHART), *set_args(SCENARIOS[name])],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


def test_manifest_kinds(scenario: tuple[dict[str, str], Rendered]) -> None:
    values, r = scenario
    n = int(values["replicas"])
    kinds = ["ConfigMap", "Service", "Service", "StatefulSet"]
    if n > 1:
        kinds.append("PodDisruptionBudget")
    assert r.kinds() == sorted(kinds)


def _container(r: Rendered) -> dict[str, Any]:
    sts = r.one("StatefulSet")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    return c


def test_statefulset(scenario: tuple[dict[str, str], Rendered]) -> None:
    values, r = scenario
    n = int(values["replicas"])
    sts = r.one("StatefulSet")
    spec = sts["spec"]
    assert spec["replicas"] == n
    assert spec["serviceName"] == HEADLESS
    assert spec["podManagementPolicy"] == "Parallel"
    c = _container(r)
    # Each pod reads the file rendered under its own name.
    assert c["args"] == ["serve", "-c", "/etc/jetraft/config/$(POD_NAME).conf"]
    pod_env = {e["name"]: e for e in c["env"]}
    assert pod_env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == ({"client": 4222, "monitor": 8222} | ({"cluster": 6222} if n > 1 else {}))
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "monitor"}
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert c["livenessProbe"]["httpGet"]["path"].startswith("/healthz")
    assert c["livenessProbe"]["httpGet"]["port"] == "monitor"
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    # Non-root, read-only root filesystem: only the PVC and /tmp are writable.
    sc, psc = c["securityContext"], spec["template"]["spec"]["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/data"] == "data" and mounts["/tmp"] == "tmp"
    assert mounts["/etc/jetraft/config"] == "config"
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    vols = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    assert vols["config"]["configMap"]["name"] == f"{FULL}-config"
    assert "emptyDir" in vols["tmp"] and "data" not in vols
    spread = spec["template"]["spec"]["topologySpreadConstraints"]
    assert [s["topologyKey"] for s in spread] == ["topology.kubernetes.io/zone",
                                                  "kubernetes.io/hostname"]
    selector = spec["selector"]["matchLabels"]
    assert all(s["labelSelector"]["matchLabels"] == selector for s in spread)
    assert spec["template"]["metadata"]["labels"].items() >= selector.items()
    assert len(spec["template"]["metadata"]["annotations"]["checksum/config"]) == 64


def test_services(scenario: tuple[dict[str, str], Rendered]) -> None:
    values, r = scenario
    headless = r.one("Service", HEADLESS)
    assert headless["spec"]["clusterIP"] == "None"
    # Pods must find each other before any of them is ready.
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]} == {
        "client": 4222, "cluster": 6222, "monitor": 8222}
    client = r.one("Service", FULL)
    assert {p["name"]: p["port"] for p in client["spec"]["ports"]} == {
        "client": 4222, "monitor": 8222}
    selector = r.one("StatefulSet")["spec"]["selector"]["matchLabels"]
    assert headless["spec"]["selector"] == selector == client["spec"]["selector"]


def test_pdb_keeps_a_majority(scenario: tuple[dict[str, str], Rendered]) -> None:
    values, r = scenario
    n = int(values["replicas"])
    pdbs = [d for d in r.docs if d["kind"] == "PodDisruptionBudget"]
    if n == 1:
        assert pdbs == []
        return
    (pdb,) = pdbs
    # One node at a time: a majority of every stream's replicas stays up.
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {
        "matchLabels": r.one("StatefulSet")["spec"]["selector"]["matchLabels"]}}


def test_pdb_min_available_override() -> None:
    r = render({"replicas": "5", "podDisruptionBudget.minAvailable": "4"})
    spec = r.one("PodDisruptionBudget")["spec"]
    assert spec["minAvailable"] == 4 and "maxUnavailable" not in spec


def test_secrets_wired(scenario: tuple[dict[str, str], Rendered]) -> None:
    values, r = scenario
    c = _container(r)
    env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in c["env"]}
    vols = {v["name"]: v for v in r.one("StatefulSet")["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    if values.get("auth.enabled") == "true":
        assert env["JETRAFT_USER"] == {"name": values["auth.secretName"], "key": "user"}
        assert env["JETRAFT_PASSWORD"] == {"name": values["auth.secretName"], "key": "password"}
    else:
        assert "JETRAFT_USER" not in env
    if values.get("cluster.auth.enabled") == "true":
        assert env["JETRAFT_CLUSTER_USER"]["name"] == values["cluster.auth.secretName"]
    for side in ("client", "cluster"):
        if values.get(f"tls.{side}.enabled") == "true":
            assert vols[f"tls-{side}"]["secret"]["secretName"] == values[f"tls.{side}.secretName"]
            assert mounts[f"tls-{side}"] == f"/etc/jetraft/tls/{side}"
        else:
            assert f"tls-{side}" not in vols


def test_every_node_config_loads(scenario: tuple[dict[str, str], Rendered]) -> None:
    values, r = scenario
    n = int(values["replicas"])
    configs = r.configs()
    assert sorted(configs) == sorted(pod(i) for i in range(n))
    mounts = {m["mountPath"] for m in _container(r)["volumeMounts"]}
    for i in range(n):
        opts = load(configs[pod(i)], pod(i))
        assert opts.unenforced == [], opts.unenforced  # these would stop the node ([FTL])
        assert set(opts.unsupported) <= PENDING_IN_MAIN, opts.unsupported
        assert opts.server_name == pod(i)
        assert (opts.host, opts.port, opts.http_port) == ("0.0.0.0", 4222, 8222)
        js = opts.jetstream
        assert js.enabled and js.store_dir == "/data/jetstream"
        want_max = {"1Ti": 1024**4}.get(values.get("jetstream.maxFile", ""), 8 * 1024**3)
        assert js.max_file == want_max
        assert js.unique_tag == (values.get("jetstream.uniqueTag") or None)
        assert opts.server_tags == expected_tags(values, i)
        if n == 1:
            assert opts.cluster.port == 0 and opts.cluster.routes == []
        else:
            assert opts.cluster.port == 6222
            assert opts.cluster.name == values.get("cluster.name", REL)
            assert opts.cluster.routes == [f"nats-route://{pod_dns(j)}:6222"
                                           for j in range(n) if j != i]
        if values.get("auth.enabled") == "true":
            assert (opts.user, opts.password) == ("alice", "s3cret")
        else:
            assert opts.user is None and opts.users == []
        if values.get("tls.client.enabled") == "true":
            tls = opts.tls
            assert tls is not None
            for f in (tls.cert_file, tls.key_file, tls.ca_file):
                assert f is not None and f.rsplit("/", 1)[0] in mounts
            mode = values["tls.client.mode"]
            assert (tls.verify, tls.verify_and_map) == {
                "server": (False, False), "mutual": (True, False), "mapped": (True, True)}[mode]
        else:
            assert opts.tls is None
            validate_options(opts)  # with TLS it would look for the mounted files


def test_rendered_routes_name_the_headless_service(
        scenario: tuple[dict[str, str], Rendered]) -> None:
    """The DNS names in the routes are the ones the StatefulSet + headless service give pods."""
    values, r = scenario
    sts = r.one("StatefulSet")
    headless = r.one("Service", HEADLESS)
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    for text in r.configs().values():
        for line in text.splitlines():
            if "nats-route://" in line:
                host = line.split("://")[1].split(":")[0]
                name, svc, ns = host.split(".")[:3]
                assert name.startswith(sts["metadata"]["name"] + "-")
                assert (svc, ns) == (HEADLESS, NS)


BAD: list[tuple[dict[str, str], list[str], str]] = [
    ({"replicas": "2"}, [], "replicas must be one of the following: 1, 3, 5"),
    ({"replicas": "2"}, ["--skip-schema-validation"], "replicas must be 1, 3 or 5 (got 2)"),
    ({"replicas": "3", "jetstream.uniqueTag": "az", "serverTags.zones": "{a,b}"}, [],
     'jetstream.uniqueTag "az" needs at least 3 distinct values for R3 streams'),
    ({"replicas": "5", "jetstream.uniqueTag": "az", "serverTags.zones": "{a,b}",
      "jetstream.maxStreamReplicas": "3"}, [], "but the 5 nodes have 2: a, b"),
    ({"replicas": "3", "jetstream.uniqueTag": "az"}, [],
     'node 0 has no "az:<value>" tag'),
    ({"tls.client.enabled": "true", "tls.client.secretName": "s", "tls.client.mode": "strict"},
     [], 'tls.client.mode must be one of the following: "server", "mutual", "mapped"'),
    ({"tls.client.enabled": "true", "tls.client.secretName": "s", "tls.client.mode": "strict"},
     ["--skip-schema-validation"], 'tls.client.mode "strict" is not a TLS mode'),
    ({"tls.client.enabled": "true"}, [], "tls.client.enabled needs tls.client.secretName"),
    ({"auth.enabled": "true"}, [], "auth.enabled needs auth.secretName"),
    ({"replicas": "3", "serverTags.byOrdinal.3.zone": "a"}, [],
     "serverTags.byOrdinal names node 3 but replicas is 3"),
    ({"replicas": "3", "jetstream.maxStreamReplicas": "5"}, [],
     "jetstream.maxStreamReplicas is 5 but there are only 3 nodes"),
    ({"replicas": "1", "tls.cluster.enabled": "true", "tls.cluster.secretName": "s"}, [],
     "replicas is 1: a single node has no cluster port"),
    ({"replicas": "5", "podDisruptionBudget.minAvailable": "2"}, [],
     "podDisruptionBudget.minAvailable 2 would let a drain take the cluster below its Raft "
     "majority (3 of 5)"),
]


@pytest.mark.parametrize(("values", "extra", "message"), BAD,
                         ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_values_fail_with_a_clear_message(values: dict[str, str], extra: list[str],
                                               message: str) -> None:
    done = template(values, release=REL, namespace=NS, extra=extra)
    assert done.returncode != 0, done.stdout[:500]
    assert message in done.stderr, done.stderr
