"""Stream configuration: parsing, defaults and validation as nats-server 2.15 does them.

Pure functions over plain dicts keyed by the wire names (`max_msgs`, `duplicate_window`, ...);
durations are int nanoseconds, enums their wire strings. The API layer calls

    cfg, pedantic = parse_request(body)                  # invalid JSON -> ApiError 10025
    cfg = check_create(name, cfg, pedantic, streams)     # or check_update(name, cfg, ...)
    to_wire(cfg)                                         # the `config` object of a reply

`streams` maps the account's existing stream names to their stored configs: the checks that
look at other streams (subject overlap, mirror/source sizes, cycles) read only it. Every
refusal is an `ApiError` with nats-server's code and text.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from node.jetstream import gojson
from node.jetstream.errors import ApiError, invalid_config
from node.jetstream.gojson import BOOL, MAP_STRING, STRING, GoJsonError, GoType
from node.jetstream.headers import format_go_duration
from node.jetstream.transform import TransformError, validate_mapping
from node.subject import FWC, subjects_collide, subset, valid_subject

Config = dict[str, Any]

SERVER_VERSION = "2.15.1"
API_LEVEL = 5  # what nats-server 2.15 advertises as `_nats.level`
MAX_NAME_LEN = 255
MAX_DESCRIPTION_LEN = 4096
MAX_METADATA_LEN = 128 * 1024
MAX_REPLICAS = 5
DEFAULT_DUPLICATE_WINDOW_NS = 120_000_000_000
MIN_WINDOW_NS = 100_000_000  # max_age and duplicate_window floor: 100ms
SECOND_NS = 1_000_000_000
JS_API_PREFIX = "$JS.API"


def _enum(values: tuple[str, ...]) -> GoType:
    def parse(value: Any, raw: str) -> str:
        if isinstance(value, str) and value in values:
            return value
        raise GoJsonError(f"can not unmarshal {gojson.go_quote(raw)}")
    return gojson.enum("enum", parse)


def _compression(value: Any, raw: str) -> str:
    if value is not None and not isinstance(value, str):
        raise GoJsonError("json: cannot unmarshal number into Go value of type string"
                          if isinstance(value, int | float) else
                          f"json: cannot unmarshal {gojson._json_kind(value)} into Go value "
                          "of type string")
    if value in ("none", "s2"):
        return value
    raise GoJsonError("unknown compression algorithm")


def _persist(value: Any, raw: str) -> str:
    if value in ("default", "async"):
        return value
    if value == "":
        return "default"
    raise GoJsonError(f"can not unmarshal {gojson.go_quote(raw)}")


_I64 = gojson.scalar("int64")
_DURATION = gojson.scalar("time.Duration")
_TRANSFORM = gojson.struct("SubjectTransformConfig", {"src": STRING, "dest": STRING})
_EXTERNAL = gojson.struct("ExternalStream", {"api": STRING, "deliver": STRING})
_SOURCE_CONSUMER = gojson.struct("StreamConsumerSource", {
    "name": STRING, "deliver_subject": STRING})
_SOURCE = gojson.struct("StreamSource", {
    "name": STRING, "opt_start_seq": gojson.scalar("uint64"),
    "opt_start_time": STRING, "filter_subject": STRING,
    "subject_transforms": gojson.slice_of(_TRANSFORM), "external": _EXTERNAL,
    "consumer": _SOURCE_CONSUMER,
})

STREAM_REQUEST = gojson.struct("server.StreamConfigRequest", {
    "name": STRING, "description": STRING, "subjects": gojson.slice_of(STRING),
    "retention": _enum(("limits", "interest", "workqueue")),
    "max_consumers": gojson.scalar("int"), "max_msgs": _I64, "max_bytes": _I64,
    "max_age": _DURATION, "max_msgs_per_subject": _I64,
    "max_msg_size": gojson.scalar("int32"), "discard": _enum(("old", "new")),
    "storage": _enum(("file", "memory")), "num_replicas": gojson.scalar("int"),
    "no_ack": BOOL, "duplicate_window": _DURATION,
    "placement": gojson.struct("Placement", {
        "cluster": STRING, "tags": gojson.slice_of(STRING), "preferred": STRING}),
    "mirror": _SOURCE, "sources": gojson.slice_of(_SOURCE),
    "compression": gojson.enum("StoreCompression", _compression),
    "first_seq": gojson.scalar("uint64"), "subject_transform": _TRANSFORM,
    "republish": gojson.struct("RePublish", {
        "src": STRING, "dest": STRING, "headers_only": BOOL}),
    "allow_direct": BOOL, "mirror_direct": BOOL, "discard_new_per_subject": BOOL,
    "sealed": BOOL, "deny_delete": BOOL, "deny_purge": BOOL, "allow_rollup_hdrs": BOOL,
    "consumer_limits": gojson.struct("StreamConsumerLimits", {
        "inactive_threshold": _DURATION, "max_ack_pending": gojson.scalar("int")}),
    "allow_msg_ttl": BOOL, "subject_delete_marker_ttl": _DURATION,
    "allow_msg_counter": BOOL, "allow_atomic": BOOL, "allow_msg_schedules": BOOL,
    "persist_mode": gojson.enum("PersistModeType", _persist), "allow_batched": BOOL,
    "metadata": MAP_STRING, "pedantic": BOOL,
})

# The wire order of nats-server's StreamConfig and which fields it leaves out when zero.
_ALWAYS = "always"
_OMIT = "omitempty"
WIRE_FIELDS: tuple[tuple[str, str], ...] = (
    ("name", _ALWAYS), ("description", _OMIT), ("subjects", _OMIT), ("retention", _ALWAYS),
    ("max_consumers", _ALWAYS), ("max_msgs", _ALWAYS), ("max_bytes", _ALWAYS),
    ("max_age", _ALWAYS), ("max_msgs_per_subject", _ALWAYS), ("max_msg_size", _ALWAYS),
    ("discard", _ALWAYS), ("storage", _ALWAYS), ("num_replicas", _ALWAYS), ("no_ack", _OMIT),
    ("duplicate_window", _OMIT), ("placement", _OMIT), ("mirror", _OMIT), ("sources", _OMIT),
    ("compression", _ALWAYS), ("first_seq", _OMIT), ("subject_transform", _OMIT),
    ("republish", _OMIT), ("allow_direct", _ALWAYS), ("mirror_direct", _ALWAYS),
    ("discard_new_per_subject", _OMIT), ("sealed", _ALWAYS), ("deny_delete", _ALWAYS),
    ("deny_purge", _ALWAYS), ("allow_rollup_hdrs", _ALWAYS), ("consumer_limits", _ALWAYS),
    ("allow_msg_ttl", _ALWAYS), ("subject_delete_marker_ttl", _OMIT),
    ("allow_msg_counter", _OMIT), ("allow_atomic", _OMIT), ("allow_msg_schedules", _OMIT),
    ("persist_mode", _OMIT), ("allow_batched", _OMIT), ("metadata", _OMIT),
)
_SOURCE_ORDER = ("name", "opt_start_seq", "opt_start_time", "filter_subject",
                 "subject_transforms", "external", "consumer")
_NESTED_ORDER = {
    "placement": ("cluster", "tags", "preferred"),
    "subject_transform": ("src", "dest"),
    "republish": ("src", "dest", "headers_only"),
    "consumer_limits": ("inactive_threshold", "max_ack_pending"),
}
_ZERO: dict[str, Any] = {
    "name": "", "description": "", "subjects": [], "retention": "limits", "max_consumers": 0,
    "max_msgs": 0, "max_bytes": 0, "max_age": 0, "max_msgs_per_subject": 0, "max_msg_size": 0,
    "discard": "old", "storage": "file", "num_replicas": 0, "no_ack": False,
    "duplicate_window": 0, "placement": None, "mirror": None, "sources": [],
    "compression": "none", "first_seq": 0, "subject_transform": None, "republish": None,
    "allow_direct": False, "mirror_direct": False, "discard_new_per_subject": False,
    "sealed": False, "deny_delete": False, "deny_purge": False, "allow_rollup_hdrs": False,
    "consumer_limits": {}, "allow_msg_ttl": False, "subject_delete_marker_ttl": 0,
    "allow_msg_counter": False, "allow_atomic": False, "allow_msg_schedules": False,
    "persist_mode": "default", "allow_batched": False, "metadata": {},
}
# Features and the API level a stream using them requires (`_nats.req.level`).
_FEATURE_LEVELS: tuple[tuple[str, int], ...] = (
    ("allow_msg_ttl", 1), ("subject_delete_marker_ttl", 1), ("allow_msg_counter", 2),
    ("allow_atomic", 2), ("allow_msg_schedules", 2), ("allow_batched", 4),
)


# ---------------------------------------------------------------------------------------------
# Parsing and the wire form


def parse_request(body: bytes) -> tuple[Config, bool]:
    """A request body -> (config with every field present, pedantic flag)."""
    if not body.strip():
        return copy.deepcopy(_ZERO), False
    try:
        raw = gojson.decode(body, STREAM_REQUEST)
    except GoJsonError as exc:
        raise ApiError.of("JSInvalidJSONErr", err=str(exc)) from exc
    pedantic = bool(raw.pop("pedantic", False))
    cfg = copy.deepcopy(_ZERO)
    cfg.update(raw)
    return cfg, pedantic


def to_wire(cfg: Config) -> dict[str, Any]:
    """The config as nats-server writes it: its field order, zero fields left out."""
    out: dict[str, Any] = {}
    for name, rule in WIRE_FIELDS:
        value = cfg.get(name, _ZERO[name])
        if name == "persist_mode" and value == "default":
            continue
        if rule == _OMIT and not value:
            continue
        out[name] = _wire_value(name, value)
    return out


def from_wire(wire: dict[str, Any]) -> Config:
    """The full config back from its wire form (the inverse of to_wire): what an
    UPDATE_CONFIG entry and the store carry."""
    cfg = copy.deepcopy(_ZERO)
    cfg.update(copy.deepcopy(wire))
    return cfg


def _wire_value(name: str, value: Any) -> Any:
    if name == "mirror":
        return _wire_source(value)
    if name == "sources":
        return [_wire_source(s) for s in value]
    if name == "metadata":
        return dict(sorted(value.items()))
    order = _NESTED_ORDER.get(name)
    if order is not None and value is not None:
        return {k: value[k] for k in order if value.get(k)} if name != "subject_transform" \
            else {k: value.get(k, "") for k in order}
    return value


def _wire_source(src: Config) -> dict[str, Any]:
    out = {k: src[k] for k in _SOURCE_ORDER if src.get(k)}
    if "external" in out:
        out["external"] = wire_external(out["external"])
    return out


def wire_external(ext: Config) -> dict[str, Any]:
    """nats-server's ExternalStream always shows both fields (no omitempty), checked."""
    return {"api": ext.get("api") or "", "deliver": ext.get("deliver") or ""}


# ---------------------------------------------------------------------------------------------
# Create and update: the handler-level checks around check_stream_config


def check_create(subject_name: str, cfg: Config, pedantic: bool,
                 streams: Mapping[str, Config], clustered: bool = False,
                 limits: Mapping[str, int] | None = None) -> tuple[Config, bool]:
    """-> (the stored config, created?). An identical re-create returns the existing one.
    `clustered`: replicas above 1 are allowed (node/jetstream/cluster.py places them).
    `limits`: the server's `jetstream { limits {} }` (JetStreamOptions.limits)."""
    _check_subject_name(subject_name, cfg)
    out = check_stream_config(cfg, streams, pedantic, limits)
    if out["sealed"]:
        raise invalid_config("stream configuration for create can not be sealed")
    if out["mirror_direct"] and out["mirror"] is None:
        raise invalid_config("stream has no mirror but does have mirror direct")
    if out["num_replicas"] > 1 and not clustered:
        raise ApiError.of("JSStreamReplicasNotSupportedErr")
    existing = streams.get(out["name"])
    if existing is not None:
        if _comparable(existing) != _comparable(out):
            raise ApiError.of("JSStreamNameExistErr")
        return existing, False
    _check_overlap(out, streams)
    return out, True


def check_update(subject_name: str, cfg: Config, pedantic: bool,
                 streams: Mapping[str, Config], clustered: bool = False,
                 limits: Mapping[str, int] | None = None) -> Config:
    _check_subject_name(subject_name, cfg)
    old = streams.get(cfg["name"])
    if old is None:
        raise ApiError.of("JSStreamNotFoundErr")
    out = check_stream_config(cfg, streams, pedantic, limits)
    _check_update_rules(old, out)
    if out["num_replicas"] > 1 and not clustered:
        raise ApiError.of("JSStreamReplicasNotSupportedErr")
    if out["sealed"]:
        out.update(max_age=0, discard="new", deny_delete=True, deny_purge=True,
                   allow_rollup_hdrs=False)
    _check_overlap(out, {k: v for k, v in streams.items() if k != out["name"]})
    return out


def _check_subject_name(subject_name: str, cfg: Config) -> None:
    if cfg["name"] != subject_name:
        raise ApiError.of("JSStreamMismatchErr")
    if "/" in cfg["name"] or "\\" in cfg["name"]:
        raise ApiError.of("JSStreamNameContainsPathSeparatorsErr")


def _check_update_rules(old: Config, new: Config) -> None:
    refusals = (
        (new["storage"] != old["storage"],
         "stream configuration update can not change storage type"),
        (new["retention"] != old["retention"]
         and "workqueue" in (new["retention"], old["retention"]),
         "stream configuration update can not change retention policy to/from workqueue"),
        (old["sealed"] and not new["sealed"],
         "stream configuration update can not unseal a sealed stream"),
        (old["deny_delete"] and not new["deny_delete"],
         "stream configuration update can not cancel deny message deletes"),
        (old["deny_purge"] and not new["deny_purge"],
         "stream configuration update can not cancel deny purge"),
    )
    for refused, text in refusals:
        if refused:
            raise invalid_config(text)
    if new["mirror"] is not None and new["mirror"] != old["mirror"]:
        raise ApiError.of("JSStreamMirrorNotUpdatableErr")
    later = (
        (old["allow_msg_ttl"] and not new["allow_msg_ttl"],
         "message TTL status can not be disabled"),
        (old["allow_msg_counter"] != new["allow_msg_counter"],
         "stream configuration update can not change message counter setting"),
        (old["allow_msg_schedules"] and not new["allow_msg_schedules"],
         "message schedules can not be disabled"),
        (old["persist_mode"] != new["persist_mode"],
         "stream configuration update can not change persist mode"),
    )
    for refused, text in later:
        if refused:
            raise invalid_config(text)


def _check_overlap(cfg: Config, others: Mapping[str, Config]) -> None:
    for other in others.values():
        if other["name"] == cfg["name"]:
            continue
        for mine in cfg["subjects"]:
            if any(subjects_collide(mine, theirs) for theirs in other["subjects"]):
                raise ApiError.of("JSStreamSubjectOverlapErr")


def _comparable(cfg: Config) -> Config:
    out = dict(cfg)
    out["metadata"] = {k: v for k, v in cfg["metadata"].items() if not k.startswith("_nats.")}
    return out


# ---------------------------------------------------------------------------------------------
# check_stream_config: nats-server's checkStreamCfg, in its order


def check_stream_config(cfg: Config, streams: Mapping[str, Config], pedantic: bool,
                        limits: Mapping[str, int] | None = None) -> Config:
    """Defaults applied and every rule checked; returns a new config, never mutates `cfg`."""
    _check_names(cfg)
    out = copy.deepcopy(cfg)
    _apply_limit_defaults(out, pedantic)
    _check_ages(out, pedantic, (limits or {}).get("duplicate_window", 0))
    _check_feature_combinations(out, pedantic)
    _check_mirror(out, streams, pedantic)
    _check_sources(out, streams)
    _check_external_prefixes(out, streams)
    _check_cycles(out, streams)
    _check_subjects(out)
    _check_transform(out)
    _check_republish(out, pedantic)
    if out["placement"] is not None and not any(out["placement"].values()):
        out["placement"] = None
    if out["placement"] is not None and out["placement"].get("preferred"):
        raise invalid_config("preferred server not permitted in placement")
    out["metadata"] = _with_levels(out)
    return out


def _valid_name(name: str) -> bool:
    return bool(name) and not any(c in name for c in ".*> \t\r\n\f\\/")


def _check_names(cfg: Config) -> None:
    if not _valid_name(cfg["name"]):
        raise invalid_config("stream name is required and can not contain '.', '*', '>', "
                             "'\\', '/'")
    if len(cfg["name"]) > MAX_NAME_LEN:
        raise invalid_config(f"stream name is too long, maximum allowed is {MAX_NAME_LEN}")
    if len(cfg["description"]) > MAX_DESCRIPTION_LEN:
        raise invalid_config(f"stream description is too long, maximum allowed is "
                             f"{MAX_DESCRIPTION_LEN}")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in cfg["metadata"].items())
    if size > MAX_METADATA_LEN:
        raise invalid_config(f"stream metadata exceeds maximum size of {MAX_METADATA_LEN} bytes")


def _pedantic(text: str) -> ApiError:
    return ApiError.of("JSPedanticErrF", err=text)


def _apply_limit_defaults(cfg: Config, pedantic: bool) -> None:
    if cfg["num_replicas"] == 0:
        cfg["num_replicas"] = 1
    if cfg["num_replicas"] > MAX_REPLICAS:
        raise invalid_config(f"maximum replicas is {MAX_REPLICAS}")
    if cfg["num_replicas"] < 0:
        raise ApiError.of("JSReplicasCountCannotBeNegative")
    for name in ("max_msgs", "max_msgs_per_subject", "max_bytes", "max_msg_size",
                 "max_consumers"):
        if cfg[name] == 0 or cfg[name] < -1:
            if pedantic and cfg[name] < -1:
                raise _pedantic(f"{name} must be set to -1")
            cfg[name] = -1


def _check_ages(cfg: Config, pedantic: bool, window_cap: int = 0) -> None:
    """`window_cap`: the server's `limits { duplicate_window }` (0: none) lowers the default
    window and caps a requested one."""
    default_window = (min(DEFAULT_DUPLICATE_WINDOW_NS, window_cap) if window_cap > 0
                      else DEFAULT_DUPLICATE_WINDOW_NS)
    max_age = cfg["max_age"]
    if max_age < 0:
        raise invalid_config("max age can not be negative")
    if 0 < max_age < MIN_WINDOW_NS:
        raise invalid_config("max age needs to be >= 100ms")
    if cfg["duplicate_window"] == 0 and cfg["mirror"] is None and not cfg["sources"]:
        if max_age != 0 and max_age < default_window:
            if pedantic:
                raise _pedantic("duplicate window cannot be bigger than max age")
            cfg["duplicate_window"] = max_age
        else:
            cfg["duplicate_window"] = default_window
    window = cfg["duplicate_window"]
    if window < 0:
        raise invalid_config("duplicates window can not be negative")
    if max_age != 0 and window > max_age:
        raise invalid_config("duplicates window can not be larger then max age")
    if 0 < window_cap < window:
        raise invalid_config("duplicates window can not be larger then server limit of "
                             + format_go_duration(window_cap))
    if 0 < window < MIN_WINDOW_NS:
        raise invalid_config("duplicates window needs to be >= 100ms")


def _check_feature_combinations(cfg: Config, pedantic: bool) -> None:
    if cfg["deny_purge"] and cfg["allow_rollup_hdrs"]:
        raise invalid_config("roll-ups require the purge permission")
    if cfg["allow_msg_counter"]:
        counter_rules = (
            (cfg["discard"] == "new", "counter stream cannot use discard new"),
            (cfg["allow_msg_ttl"], "counter stream cannot use message TTLs"),
            (cfg["allow_msg_schedules"], "counter stream cannot use message schedules"),
            (cfg["retention"] != "limits", "counter stream can only use limits retention"),
        )
        for refused, text in counter_rules:
            if refused:
                raise invalid_config(text)
    if cfg["discard_new_per_subject"]:
        if cfg["discard"] != "new":
            raise invalid_config("discard new per subject requires discard new policy to be set")
        if cfg["max_msgs_per_subject"] <= 0:
            raise invalid_config("discard new per subject requires max msgs per subject > 0")
    _check_marker_ttl(cfg, pedantic)
    if cfg["allow_msg_schedules"]:
        if cfg["discard"] == "new":
            raise invalid_config("message scheduling cannot use discard new")
        _force_rollups(cfg, pedantic, "message scheduling cannot be set if roll-ups are disabled")
    if cfg["persist_mode"] == "async":
        async_rules = (
            (cfg["storage"] != "file", "async persist mode is only supported on file storage"),
            (cfg["num_replicas"] > 1,
             "async persist mode is not supported on replicated streams"),
            (cfg["allow_atomic"], "async persist mode is not supported with atomic batch publish"),
        )
        for refused, text in async_rules:
            if refused:
                raise invalid_config(text)


def _check_marker_ttl(cfg: Config, pedantic: bool) -> None:
    ttl = cfg["subject_delete_marker_ttl"]
    if ttl < 0:
        raise invalid_config("subject delete marker TTL must not be negative")
    if ttl == 0:
        return
    if ttl < SECOND_NS:
        raise invalid_config("subject delete marker TTL must be at least 1 second")
    if not cfg["allow_msg_ttl"]:
        if pedantic:
            raise invalid_config("subject delete marker cannot be set if message TTLs are "
                                 "disabled")
        cfg["allow_msg_ttl"] = True
    _force_rollups(cfg, pedantic, "subject delete marker cannot be set if roll-ups are disabled")


def _force_rollups(cfg: Config, pedantic: bool, text: str) -> None:
    if not cfg["allow_rollup_hdrs"]:
        if pedantic:
            raise invalid_config(text)
        cfg["allow_rollup_hdrs"], cfg["deny_purge"] = True, False


def _check_mirror(cfg: Config, streams: Mapping[str, Config], pedantic: bool) -> None:
    mirror = cfg["mirror"]
    if mirror is None:
        return
    refusals = (
        (cfg["first_seq"] > 0, "JSMirrorWithFirstSeqErr"),
        (bool(cfg["subjects"]), "JSMirrorWithSubjectsErr"),
        (bool(cfg["sources"]), "JSMirrorWithSourcesErr"),
        (cfg["allow_msg_counter"], "JSMirrorWithCountersErr"),
        (cfg["allow_atomic"], "JSMirrorWithAtomicPublishErr"),
        (cfg["allow_msg_schedules"], "JSMirrorWithMsgSchedulesErr"),
        (bool(mirror.get("filter_subject")) and bool(mirror.get("subject_transforms")),
         "JSMirrorMultipleFiltersNotAllowed"),
    )
    for refused, name in refusals:
        if refused:
            raise ApiError.of(name)
    if cfg["subject_delete_marker_ttl"] > 0:
        raise invalid_config("subject delete markers forbidden on mirrors")
    _check_source_transforms(mirror, "Mirror", overlap=subjects_collide)
    if mirror.get("external"):
        return
    if not _valid_name(mirror.get("name", "")):
        raise ApiError.of("JSMirrorInvalidStreamName")
    origin = streams.get(mirror["name"])
    if origin is None:
        return
    if 0 < cfg["max_msg_size"] < origin["max_msg_size"]:
        raise ApiError.of("JSMirrorMaxMessageSizeTooBigErr")
    if pedantic and cfg["mirror_direct"] != origin["allow_direct"]:
        raise _pedantic("origin stream has direct get set, mirror has it disabled")
    cfg["mirror_direct"] = origin["allow_direct"]


def _check_source_transforms(src: Config, kind: str, overlap: Any) -> None:
    transforms = src.get("subject_transforms") or []
    for i, tr in enumerate(transforms):
        source = tr.get("src", "")
        if source and not valid_subject(source):
            raise ApiError.of(f"JS{kind}InvalidSubjectFilter", err=f"invalid subject {source}")
        try:
            validate_mapping(source, tr.get("dest", ""))
        except TransformError as exc:
            raise ApiError.of(f"JS{kind}InvalidTransformDestination", err=str(exc)) from exc
        for j, other in enumerate(transforms):
            if i != j and overlap(source, other.get("src", "")):
                raise ApiError.of(f"JS{kind}OverlappingSubjectFilters")


def _source_iname(src: Config) -> str:
    parts = [src.get("name", "")]
    external = src.get("external") or {}
    if external.get("api"):
        parts.append(external["api"])
    parts.append(src.get("filter_subject", ""))
    for tr in src.get("subject_transforms") or []:
        parts.append(tr.get("src", "") + ">" + tr.get("dest", ""))
    return " ".join(parts)


def _check_sources(cfg: Config, streams: Mapping[str, Config]) -> None:
    if cfg["sources"] and cfg["allow_msg_schedules"]:
        raise ApiError.of("JSSourceWithMsgSchedulesErr")
    seen: set[str] = set()
    for src in cfg["sources"]:
        if not _valid_name(src.get("name", "")):
            raise ApiError.of("JSSourceInvalidStreamName")
        iname = _source_iname(src)
        if iname in seen:
            raise ApiError.of("JSSourceDuplicateDetected")
        seen.add(iname)
        if src.get("filter_subject") and src.get("subject_transforms"):
            raise ApiError.of("JSSourceMultipleFiltersNotAllowed")
        _check_source_transforms(src, "Source", overlap=subset)
        if src.get("external"):
            continue
        origin = streams.get(src["name"])
        if origin is not None and 0 < cfg["max_msg_size"] < origin["max_msg_size"]:
            raise ApiError.of("JSSourceMaxMessageSizeTooBigErr")


def _check_external_prefixes(cfg: Config, streams: Mapping[str, Config]) -> None:
    origins = ([cfg["mirror"]] if cfg["mirror"] else []) + list(cfg["sources"])
    seen_subjects = [s for o in origins if not o.get("external")
                     for s in streams.get(o["name"], {}).get("subjects", [])]
    externals = [o["external"] for o in origins if o.get("external")]
    for ext in externals:
        prefix = ext.get("deliver", "")
        if not prefix:
            continue
        if not _valid_publish_subject(prefix):
            raise ApiError.of("JSStreamInvalidExternalDeliverySubjErrF", prefix=prefix)
        for subject in seen_subjects:
            if subjects_collide(subject, f"{prefix}.{subject}"):
                raise ApiError.of("JSStreamExternalDelPrefixOverlapsErrF", prefix=prefix,
                                  subject=subject)
    for ext in externals:
        prefix = ext.get("api", "")
        if not prefix:
            continue
        if not _valid_publish_subject(prefix):
            raise invalid_config(f"stream external api prefix {gojson.go_quote(prefix)} must be "
                                 "a valid subject without wildcards")
        if subjects_collide(prefix, JS_API_PREFIX):
            raise ApiError.of("JSStreamExternalApiOverlapErrF", prefix=prefix,
                              subject=JS_API_PREFIX)


def _valid_publish_subject(subject: str) -> bool:
    return valid_subject(subject) and all(t not in ("*", ">") for t in subject.split("."))


def _check_cycles(cfg: Config, streams: Mapping[str, Config]) -> None:
    to_visit = [cfg]
    visited: set[str] = set()
    for _ in range(len(streams) + 2):  # each stream is visited at most once more than needed
        if not to_visit:
            return
        current = to_visit.pop(0)
        visited.add(current["name"])
        _visit_sources(current, streams, visited, to_visit)
        mirror = current.get("mirror")
        if mirror and not mirror.get("external"):
            if mirror["name"] in visited:
                raise invalid_config("detected cycle")
            if mirror["name"] in streams:
                to_visit.append(streams[mirror["name"]])


def _visit_sources(current: Config, streams: Mapping[str, Config], visited: set[str],
                   to_visit: list[Config]) -> None:
    for src in current.get("sources") or []:
        if src.get("external"):
            continue
        if src["name"] in visited:
            filt = src.get("filter_subject", "")
            if not filt or any(subjects_collide(s, filt) for s in current["subjects"]):
                raise invalid_config("detected cycle")
        elif src["name"] in streams:
            to_visit.append(streams[src["name"]])


def _check_subjects(cfg: Config) -> None:
    subjects = cfg["subjects"]
    if not subjects:
        if cfg["mirror"] is None and not cfg["sources"]:
            cfg["subjects"] = [cfg["name"]]
        return
    if cfg["mirror"] is not None:
        raise ApiError.of("JSMirrorWithSubjectsErr")
    seen: set[str] = set()
    for i, subj in enumerate(subjects):
        if not valid_subject(subj, check_runes=True):
            raise invalid_config("invalid subject")
        if subj in seen:
            raise invalid_config("duplicate subjects detected")
        _check_reserved(cfg, subj)
        for other in subjects[i + 1:]:
            if subjects_collide(other, subj):
                raise invalid_config(f"subject {gojson.go_quote(subj)} overlaps with "
                                     f"{gojson.go_quote(other)}")
        seen.add(subj)


def _check_reserved(cfg: Config, subj: str) -> None:
    if subj == FWC:
        if not cfg["no_ack"]:
            raise invalid_config("capturing all subjects requires no-ack to be true")
        if cfg["num_replicas"] != 1:
            raise invalid_config("capturing all subjects requires replicas of 1")
    if cfg["no_ack"]:
        return
    for space in ("$JS.>", "$JSC.>", "$NRG.>"):
        if subjects_collide(subj, space) and not subset(subj, "$JS.EVENT.>"):
            raise invalid_config("subjects that overlap with jetstream api require no-ack to "
                                 "be true")
    if subjects_collide(subj, "$SYS.>") and not subset(subj, "$SYS.ACCOUNT.>"):
        raise invalid_config("subjects that overlap with system api require no-ack to be true")


def _check_transform(cfg: Config) -> None:
    tr = cfg["subject_transform"]
    if tr is None:
        return
    source = tr.get("src", "")
    if source and not valid_subject(source):
        raise ApiError.of("JSStreamTransformInvalidSource", err=f"invalid subject {source}")
    try:
        validate_mapping(source, tr.get("dest", ""))
    except TransformError as exc:
        raise ApiError.of("JSStreamTransformInvalidDestination", err=str(exc)) from exc


def _check_republish(cfg: Config, pedantic: bool) -> None:
    rp = cfg["republish"]
    if rp is None:
        return
    if not rp.get("src"):
        if pedantic:
            raise _pedantic("republish source can not be empty")
        rp["src"] = FWC
    tr = cfg["subject_transform"]
    if (rp.get("dest") == FWC and rp["src"] == FWC and tr is not None
            and len(cfg["subjects"]) == 1 and tr.get("src") == cfg["subjects"][0]):
        if pedantic:
            raise _pedantic("implicit republish based on subject transform")
        rp["src"] = rp["dest"] = tr.get("dest", "")
    dest = rp.get("dest", "")
    if any(subjects_collide(dest, subj) for subj in cfg["subjects"]):
        raise invalid_config("stream configuration for republish destination forms a cycle")
    try:
        validate_mapping(rp["src"], dest)
    except TransformError as exc:
        raise invalid_config(f"stream configuration for republish with transform from "
                             f"'{rp['src']}' to '{dest}' not valid") from exc


def _with_levels(cfg: Config) -> dict[str, str]:
    """nats-server stamps each stored config with its API level and the level the config needs;
    a client cannot set these keys."""
    required = 0
    for name, level in _FEATURE_LEVELS:
        if cfg.get(name):
            required = max(required, level)
    if cfg.get("persist_mode") == "async":
        required = max(required, 2)
    user = {k: v for k, v in cfg["metadata"].items() if not k.startswith("_nats.")}
    return {"_nats.level": str(API_LEVEL), "_nats.req.level": str(required),
            "_nats.ver": SERVER_VERSION, **user}
