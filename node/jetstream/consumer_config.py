"""Consumer configuration: CONSUMER.CREATE / DURABLE.CREATE requests as nats-server 2.15 checks
them (the subject forms, defaults, validation and update rules), pure.

    req = parse_request(body)                                         # 10025 on bad JSON
    cfg, created = check_create(api_subject, req, stream_cfg, consumers)
    to_wire(cfg)                                                      # the reply's `config`

`api_subject` is the request subject; `consumers` maps the stream's consumer names to their
stored configs. An ephemeral consumer without a name gets one from `name_source` (random in
the node, fixed in tests); that name travels in the Raft entry that creates it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from node.jetstream import gojson
from node.jetstream.config import (
    API_LEVEL,
    MAX_DESCRIPTION_LEN,
    MAX_METADATA_LEN,
    MAX_NAME_LEN,
    SERVER_VERSION,
    Config,
)
from node.jetstream.errors import ApiError, invalid_config
from node.jetstream.gojson import BOOL, MAP_STRING, STRING, GoJsonError, GoType
from node.jetstream.headers import format_go_duration
from node.subject import is_literal, subjects_collide, subset, valid_subject

ACK_WAIT_DEFAULT_NS = 30_000_000_000
MAX_WAITING_DEFAULT = 512
MAX_ACK_PENDING_DEFAULT = 1000
EPHEMERAL_INACTIVE_NS = 5_000_000_000
PINNED_TTL_DEFAULT_NS = 120_000_000_000
MIN_HEARTBEAT_NS = 100_000_000
MIN_EXPIRES_NS = 1_000_000
_GROUP_NAME = re.compile(r"^[a-zA-Z0-9/_=)+-]{1,16}$")


def _enum(values: tuple[str, ...]) -> GoType:
    def parse(value: Any, raw: str) -> str:
        if isinstance(value, str) and value in values:
            return value
        raise GoJsonError(f"can not unmarshal {gojson.go_quote(raw)}")
    return gojson.enum("enum", parse)


def _action(value: Any, raw: str) -> str:
    if value in ("", "create", "update"):
        return value
    shown = value if isinstance(value, str) else raw
    raise GoJsonError(f"unknown consumer action: {gojson.go_quote(shown)}")


_DURATION = gojson.scalar("time.Duration")
_INT = gojson.scalar("int")
CONSUMER_CONFIG = gojson.struct("ConsumerConfig", {
    "durable_name": STRING, "name": STRING, "description": STRING,
    "deliver_policy": _enum(("all", "last", "new", "by_start_sequence", "by_start_time",
                             "last_per_subject")),
    "opt_start_seq": gojson.scalar("uint64"), "opt_start_time": STRING,
    "ack_policy": _enum(("none", "all", "explicit", "flow_control")),
    "ack_wait": _DURATION, "max_deliver": _INT, "backoff": gojson.slice_of(_DURATION),
    "filter_subject": STRING, "filter_subjects": gojson.slice_of(STRING),
    "replay_policy": _enum(("instant", "original")), "rate_limit_bps": gojson.scalar("uint64"),
    "sample_freq": STRING, "max_waiting": _INT, "max_ack_pending": _INT,
    "flow_control": BOOL, "headers_only": BOOL, "max_batch": _INT, "max_expires": _DURATION,
    "max_bytes": _INT, "deliver_subject": STRING, "deliver_group": STRING,
    "idle_heartbeat": _DURATION, "inactive_threshold": _DURATION, "num_replicas": _INT,
    "mem_storage": BOOL, "direct": BOOL, "metadata": MAP_STRING, "pause_until": STRING,
    "priority_groups": gojson.slice_of(STRING),
    "priority_policy": _enum(("none", "overflow", "pinned_client", "prioritized")),
    "priority_timeout": _DURATION,
})
CREATE_REQUEST = gojson.struct("server.CreateConsumerRequest", {
    "stream_name": STRING, "config": CONSUMER_CONFIG,
    "action": gojson.enum("ConsumerAction", _action), "pedantic": BOOL,
})

_ZERO: dict[str, Any] = {
    "durable_name": "", "name": "", "description": "", "deliver_policy": "all",
    "opt_start_seq": 0, "opt_start_time": "", "ack_policy": "none", "ack_wait": 0,
    "max_deliver": 0, "backoff": [], "filter_subject": "", "filter_subjects": [],
    "replay_policy": "instant", "rate_limit_bps": 0, "sample_freq": "", "max_waiting": 0,
    "max_ack_pending": 0, "flow_control": False, "headers_only": False, "max_batch": 0,
    "max_expires": 0, "max_bytes": 0, "deliver_subject": "", "deliver_group": "",
    "idle_heartbeat": 0, "inactive_threshold": 0, "num_replicas": 0, "mem_storage": False,
    "direct": False, "metadata": {}, "pause_until": "", "priority_groups": [],
    "priority_policy": "none", "priority_timeout": 0,
}
# nats-server's wire order; True = always written, False = left out when zero.
WIRE_FIELDS: tuple[tuple[str, bool], ...] = (
    ("durable_name", False), ("name", False), ("description", False),
    ("deliver_policy", True), ("opt_start_seq", False), ("opt_start_time", False),
    ("ack_policy", True), ("ack_wait", False), ("max_deliver", True), ("backoff", False),
    ("filter_subject", False), ("filter_subjects", False), ("replay_policy", True),
    ("rate_limit_bps", False), ("sample_freq", False), ("max_waiting", False),
    ("max_ack_pending", False), ("flow_control", False), ("headers_only", False),
    ("max_batch", False), ("max_expires", False), ("max_bytes", False),
    ("deliver_subject", False), ("deliver_group", False), ("idle_heartbeat", False),
    ("inactive_threshold", False), ("num_replicas", True), ("mem_storage", False),
    ("direct", False), ("metadata", False), ("pause_until", False),
    ("priority_groups", False), ("priority_policy", False), ("priority_timeout", False),
)


@dataclass
class CreateRequest:
    stream_name: str
    config: Config
    config_given: bool
    action: str
    pedantic: bool


def parse_request(body: bytes) -> CreateRequest:
    try:
        raw = gojson.decode(body or b"{}", CREATE_REQUEST)
    except GoJsonError as exc:
        raise ApiError.of("JSInvalidJSONErr", err=str(exc)) from exc
    cfg = copy.deepcopy(_ZERO)
    cfg.update(raw.get("config") or {})
    return CreateRequest(raw.get("stream_name", ""), cfg, "config" in raw,
                         raw.get("action", ""), bool(raw.get("pedantic", False)))


def to_wire(cfg: Config) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, always in WIRE_FIELDS:
        value = cfg.get(name, _ZERO[name])
        if name == "priority_policy" and value == "none":
            continue
        if always or value:
            out[name] = dict(sorted(value.items())) if name == "metadata" else value
    return out


def from_wire(wire: dict[str, Any]) -> Config:
    cfg = copy.deepcopy(_ZERO)
    cfg.update(copy.deepcopy(wire))
    return cfg


# ---------------------------------------------------------------------------------------------
# The request subject's forms


@dataclass(frozen=True)
class ApiSubject:
    stream: str
    consumer: str = ""       # from the subject, if any
    filter: str = ""         # CONSUMER.CREATE.<stream>.<consumer>.<filter>
    durable_api: bool = False


def parse_api_subject(subject: str) -> ApiSubject:
    """`$JS.API.CONSUMER.CREATE.<stream>[.<consumer>[.<filter...>]]` or
    `$JS.API.CONSUMER.DURABLE.CREATE.<stream>.<durable>`."""
    tokens = subject.split(".")
    if tokens[3] == "DURABLE":
        return ApiSubject(tokens[5], tokens[6] if len(tokens) > 6 else "", durable_api=True)
    stream = tokens[4]
    consumer = tokens[5] if len(tokens) > 5 else ""
    return ApiSubject(stream, consumer, ".".join(tokens[6:]))


def _check_subject_form(api: ApiSubject, req: CreateRequest) -> None:
    cfg = req.config
    if req.stream_name != api.stream:
        raise ApiError.of("JSStreamMismatchErr")
    if api.durable_api:
        if not cfg["durable_name"]:
            raise ApiError.of("JSConsumerDurableNameNotSetErr")
        if cfg["durable_name"] != api.consumer:
            raise ApiError.of("JSConsumerDurableNameNotMatchSubjectErr")
        return
    if not api.consumer:
        if cfg["durable_name"]:
            raise ApiError.of("JSConsumerEphemeralWithDurableNameErr")
        return
    if cfg["durable_name"] and cfg["durable_name"] != api.consumer:
        raise ApiError.of("JSConsumerDurableNameNotMatchSubjectErr")
    if api.filter:
        if len(cfg["filter_subjects"]) > 1:
            raise ApiError.of("JSConsumerMultipleFiltersNotAllowed")
        given = cfg["filter_subject"] or (cfg["filter_subjects"] or [""])[0]
        if given != api.filter:
            raise ApiError.of("JSConsumerCreateFilterSubjectMismatchErr")


# ---------------------------------------------------------------------------------------------
# Create / update


def check_create(subject: str, req: CreateRequest, stream: Config | None,
                 consumers: Mapping[str, Config],
                 name_source: Callable[[], str] = lambda: "EPHEMERAL",
                 clustered: bool = False,
                 limits: Mapping[str, int] | None = None) -> tuple[Config, str, bool]:
    """-> (the consumer's stored config, its name, created?). A generated ephemeral name is
    not written into the config: nats-server echoes such a config without `name`."""
    api = parse_api_subject(subject)
    _check_subject_form(api, req)
    if stream is None:
        raise ApiError.of("JSStreamNotFoundErr")
    cfg = copy.deepcopy(req.config)
    if api.consumer and not cfg["durable_name"] and not api.durable_api:
        cfg["name"] = api.consumer  # the subject's name wins over the body's, as in nats-server
    if cfg["durable_name"] and not cfg["name"]:
        cfg["name"] = cfg["durable_name"]
    if cfg["num_replicas"] > 1 and not clustered:
        raise ApiError.of("JSStreamReplicasNotSupportedErr")
    server = limits or {}
    _apply_defaults(cfg, stream, req.pedantic, server)
    _check_config(cfg, stream)
    _check_server_limits(cfg, server)
    cfg["metadata"] = _with_levels(cfg)
    name = cfg["name"]
    existing = consumers.get(name) if name else None
    if existing is None:
        if req.action == "update":
            raise ApiError.of("JSConsumerDoesNotExist")
        return cfg, name or name_source(), True
    return _check_existing(existing, cfg, req.action), name, False


def _check_existing(old: Config, new: Config, action: str) -> Config:
    if _comparable(old) == _comparable(new):
        return old
    if action == "create":
        raise ApiError.of("JSConsumerAlreadyExists")
    refusals = (
        ("deliver_policy", "deliver policy can not be updated"),
        ("mem_storage", "storage type can not be updated"),
        ("direct", "direct can not be updated"),
        ("opt_start_seq", "start sequence can not be updated"),
        ("opt_start_time", "start time can not be updated"),
        ("ack_policy", "ack policy can not be updated"),
        ("replay_policy", "replay policy can not be updated"),
        ("idle_heartbeat", "heart beats can not be updated"),
        ("flow_control", "flow control can not be updated"),
    )
    for name, text in refusals:
        if old[name] != new[name]:
            raise ApiError.of("JSConsumerCreateErrF", err=text)
    if old["deliver_subject"] != new["deliver_subject"]:
        if not old["deliver_subject"]:
            raise ApiError.of("JSConsumerCreateErrF",
                              err="can not update pull consumer to push based")
        if not new["deliver_subject"]:
            raise ApiError.of("JSConsumerCreateErrF",
                              err="can not update push consumer to pull based")
    if old["max_waiting"] != new["max_waiting"]:
        raise ApiError.of("JSConsumerCreateErrF", err="max waiting can not be updated")
    return new


def _comparable(cfg: Config) -> Config:
    out = dict(cfg)
    out["metadata"] = {k: v for k, v in cfg["metadata"].items() if not k.startswith("_nats.")}
    return out


# ---------------------------------------------------------------------------------------------
# nats-server's setConsumerConfigDefaults and checkConsumerCfg, in their order


def _pedantic(text: str) -> ApiError:
    return ApiError.of("JSPedanticErrF", err=text)


def _apply_defaults(cfg: Config, stream: Config, pedantic: bool,
                    server: Mapping[str, int]) -> None:
    if cfg["max_deliver"] == 0 or cfg["max_deliver"] < -1:
        if pedantic and cfg["max_deliver"] < -1:
            raise _pedantic("max_deliver must be set to -1")
        cfg["max_deliver"] = -1
    for name, floor, text in (
            ("max_waiting", 0, "max_waiting must not be negative"),
            ("max_ack_pending", -1, "max_ack_pending must be set to -1"),
            ("max_batch", 0, "max_batch must not be negative"),
            ("max_expires", 0, "max_expires must not be negative"),
            ("max_bytes", 0, "max_bytes must not be negative"),
            ("idle_heartbeat", 0, "idle_heartbeat must not be negative"),
            ("inactive_threshold", 0, "inactive_threshold must not be negative"),
            ("priority_timeout", 0, "priority_timeout must not be negative")):
        if cfg[name] < floor:
            if pedantic:
                raise _pedantic(text)
            cfg[name] = floor
    if not cfg["deliver_subject"] and cfg["max_waiting"] == 0:
        cfg["max_waiting"] = MAX_WAITING_DEFAULT
    if cfg["ack_wait"] == 0 and cfg["ack_policy"] in ("explicit", "all"):
        cfg["ack_wait"] = ACK_WAIT_DEFAULT_NS
    if cfg["backoff"]:
        if pedantic and cfg["ack_wait"] != cfg["backoff"][0]:
            raise _pedantic("first backoff value has to equal batch AckWait")
        cfg["ack_wait"] = cfg["backoff"][0]
    limits = stream.get("consumer_limits") or {}
    if cfg["max_ack_pending"] == 0:
        cfg["max_ack_pending"] = limits.get("max_ack_pending", 0)
    if cfg["inactive_threshold"] == 0:
        cfg["inactive_threshold"] = limits.get("inactive_threshold", 0)
    if cfg["max_ack_pending"] == 0 and cfg["ack_policy"] != "none":
        cap = server.get("max_ack_pending", 0)
        cfg["max_ack_pending"] = (min(MAX_ACK_PENDING_DEFAULT, cap) if cap > 0
                                  else MAX_ACK_PENDING_DEFAULT)
    if not cfg["deliver_subject"] and cfg["max_batch"] == 0:
        cfg["max_batch"] = max(server.get("max_request_batch", 0), 0)
    if cfg["priority_policy"] == "pinned_client" and cfg["priority_timeout"] == 0:
        cfg["priority_timeout"] = PINNED_TTL_DEFAULT_NS
    if not cfg["durable_name"] and cfg["inactive_threshold"] <= 0:
        cfg["inactive_threshold"] = EPHEMERAL_INACTIVE_NS  # ephemerals always expire


def _valid_asset_name(name: str) -> bool:
    return not any(c in name for c in ".*> \t\r\n\f\\/")


def _check_config(cfg: Config, stream: Config) -> None:
    _check_names_and_replicas(cfg, stream)
    if any(b < 0 for b in cfg["backoff"]):
        raise ApiError.of("JSConsumerBackOffNegativeErr")
    if cfg["ack_wait"] < 0:
        raise ApiError.of("JSConsumerAckWaitNegativeErr")
    if cfg["backoff"] and cfg["max_deliver"] != -1 and len(cfg["backoff"]) > cfg["max_deliver"]:
        raise ApiError.of("JSConsumerMaxDeliverBackoffErr")
    if len(cfg["description"]) > MAX_DESCRIPTION_LEN:
        raise ApiError.of("JSConsumerDescriptionTooLongErrF", max=MAX_DESCRIPTION_LEN)
    if cfg["deliver_subject"]:
        _check_push(cfg, stream)
    else:
        _check_pull(cfg, stream)
    _check_limits(cfg, stream)
    if cfg["direct"]:
        if not cfg["deliver_subject"]:
            raise ApiError.of("JSConsumerDirectRequiresPushErr")
        if cfg["durable_name"]:
            raise ApiError.of("JSConsumerDirectRequiresEphemeralErr")
    _check_filters(cfg)
    _check_start(cfg)
    _check_rest(cfg)


# LMDB keys hold at most 511 bytes; the longest consumer key is a 2-byte length, the stream
# name, "consumer-created:" (17) and the consumer name.
_KEY_BUDGET = 511 - 2 - 17


def _check_name_lengths(cfg: Config, stream: Config) -> None:
    """nats-server 2.15.1: a durable over 255 bytes is 10102; a longer `name` fails to make
    its store directory (500, 10012). Names that fit there but not in one LMDB key (stream
    and consumer names near 255 each) get that same store error instead of stopping the
    node at apply time."""
    if len(cfg["durable_name"].encode()) > MAX_NAME_LEN:
        raise ApiError.of("JSConsumerNameTooLongErrF", max=MAX_NAME_LEN)
    name = cfg["name"].encode()
    if len(name) > MAX_NAME_LEN or len(name) + len(stream["name"].encode()) > _KEY_BUDGET:
        raise ApiError.of("JSConsumerCreateErrF", err="error creating store for consumer")


def _check_names_and_replicas(cfg: Config, stream: Config) -> None:
    _check_name_lengths(cfg, stream)
    if cfg["name"] and not _valid_asset_name(cfg["name"]):
        raise invalid_config("consumer name can not contain '.', '*', '>', '\\', '/'")
    if cfg["durable_name"] and not _valid_asset_name(cfg["durable_name"]):
        raise invalid_config("consumer durable name can not contain '.', '*', '>', '\\', '/'")
    if cfg["num_replicas"] > 0 and cfg["num_replicas"] > stream["num_replicas"]:
        raise ApiError.of("JSConsumerReplicasExceedsStream")
    if cfg["num_replicas"] < 0:
        raise ApiError.of("JSReplicasCountCannotBeNegative")
    if stream["retention"] in ("interest", "workqueue") and cfg["num_replicas"] not in (
            0, stream["num_replicas"]):
        raise ApiError.of("JSConsumerReplicasShouldMatchStream")


def _check_push(cfg: Config, stream: Config) -> None:
    deliver = cfg["deliver_subject"]
    if not is_literal(deliver):
        raise ApiError.of("JSConsumerDeliverToWildcardsErr")
    if not valid_subject(deliver):
        raise ApiError.of("JSConsumerInvalidDeliverSubject")
    if any(subjects_collide(deliver, s) for s in stream["subjects"]):
        raise ApiError.of("JSConsumerDeliverCycleErr")
    if cfg["max_waiting"] != 0:
        raise ApiError.of("JSConsumerPushMaxWaitingErr")
    if cfg["max_ack_pending"] > 0 and cfg["ack_policy"] == "none":
        raise ApiError.of("JSConsumerMaxPendingAckPolicyRequiredErr")
    if 0 < cfg["idle_heartbeat"] < MIN_HEARTBEAT_NS:
        raise ApiError.of("JSConsumerSmallHeartbeatErr")


def _check_pull(cfg: Config, stream: Config) -> None:
    rules = (
        (cfg["ack_policy"] == "none" and stream["retention"] == "workqueue",
         "JSConsumerPullRequiresAckErr"),
        (cfg["rate_limit_bps"] > 0, "JSConsumerPullWithRateLimitErr"),
        (cfg["max_waiting"] < 0, "JSConsumerMaxWaitingNegativeErr"),
        (cfg["idle_heartbeat"] > 0, "JSConsumerHBRequiresPushErr"),
        (cfg["flow_control"], "JSConsumerFCRequiresPushErr"),
        (cfg["max_batch"] < 0, "JSConsumerMaxRequestBatchNegativeErr"),
        (0 < cfg["max_expires"] < MIN_EXPIRES_NS, "JSConsumerMaxRequestExpiresTooSmall"),
    )
    for refused, name in rules:
        if refused:
            raise ApiError.of(name)


def _check_limits(cfg: Config, stream: Config) -> None:
    limits = stream.get("consumer_limits") or {}
    max_ack = limits.get("max_ack_pending", 0)
    if max_ack > 0 and cfg["max_ack_pending"] > max_ack:
        raise ApiError.of("JSConsumerMaxPendingAckExcessErrF", limit=max_ack)
    inactive = limits.get("inactive_threshold", 0)
    if inactive > 0 and cfg["inactive_threshold"] > inactive:
        raise ApiError.of("JSConsumerInactiveThresholdExcess", limit=format_go_duration(inactive))


def _check_server_limits(cfg: Config, server: Mapping[str, int]) -> None:
    """The server's `jetstream { limits {} }` (nats-server checks them after the stream's)."""
    max_ack = server.get("max_ack_pending", 0)
    if max_ack > 0 and cfg["max_ack_pending"] > max_ack:
        raise ApiError.of("JSConsumerMaxPendingAckExcessErrF", limit=max_ack)
    max_batch = server.get("max_request_batch", 0)
    if max_batch > 0 and cfg["max_batch"] > max_batch:
        raise ApiError.of("JSConsumerMaxRequestBatchExceededF", limit=max_batch)


def _check_filters(cfg: Config) -> None:
    if cfg["filter_subject"] and cfg["filter_subjects"]:
        raise ApiError.of("JSConsumerDuplicateFilterSubjects")
    if cfg["filter_subject"] and not valid_subject(cfg["filter_subject"]):
        raise invalid_config("invalid subject")
    if any(f == "" for f in cfg["filter_subjects"]):
        raise ApiError.of("JSConsumerEmptyFilter")
    filters = [cfg["filter_subject"]] if cfg["filter_subject"] else list(cfg["filter_subjects"])
    for i, subject in enumerate(filters):
        if not valid_subject(subject):
            raise invalid_config("invalid subject")
        if any(i != j and subset(subject, other) for j, other in enumerate(filters)):
            raise ApiError.of("JSConsumerOverlappingSubjectFilters")


_POLICY_WORDS = {"all": "all", "last": "last", "last_per_subject": "last per subject",
                 "new": "new", "by_start_sequence": "by start sequence",
                 "by_start_time": "by start time"}


def _check_start(cfg: Config) -> None:
    policy, seq, time = cfg["deliver_policy"], cfg["opt_start_seq"], cfg["opt_start_time"]
    words = _POLICY_WORDS[policy]

    def bad(start: str) -> ApiError:
        return ApiError.of("JSConsumerInvalidPolicyErrF", err=f"consumer delivery policy is "
                           f"deliver {words}, but optional start {start} is also set")

    def missing(what: str) -> ApiError:
        return ApiError.of("JSConsumerInvalidPolicyErrF", err=f"consumer delivery policy is "
                           f"deliver {words}, but optional {what} is not set")

    if policy in ("all", "last", "last_per_subject", "new"):
        if seq > 0:
            raise bad("sequence")
        if time:
            raise bad("time")
        if policy == "last_per_subject" and not cfg["filter_subject"] and \
                not cfg["filter_subjects"]:
            raise missing("filter subject")
    elif policy == "by_start_sequence":
        if seq == 0:
            raise missing("start sequence")
        if time:
            raise bad("time")
    elif not time:
        raise missing("start time")
    elif seq:
        raise bad("start sequence")


def _check_rest(cfg: Config) -> None:
    freq = cfg["sample_freq"]
    if freq:
        digits = freq.removesuffix("%")
        if not re.fullmatch(r"[+-]?\d+", digits):
            raise ApiError.of("JSConsumerInvalidSamplingErrF",
                              err=f"strconv.Atoi: parsing {gojson.go_quote(digits)}: "
                                  "invalid syntax")
        if int(digits) < 0:
            raise ApiError.of("JSConsumerInvalidSamplingErrF", err="<nil>")
    if cfg["flow_control"] and cfg["idle_heartbeat"] == 0:
        raise ApiError.of("JSConsumerWithFlowControlNeedsHeartbeats")
    if cfg["durable_name"] and cfg["name"] and cfg["name"] != cfg["durable_name"]:
        raise ApiError.of("JSConsumerCreateDurableAndNameMismatch")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in cfg["metadata"].items())
    if size > MAX_METADATA_LEN:
        raise ApiError.of("JSConsumerMetadataLengthErrF", limit=f"{MAX_METADATA_LEN // 1024}KB")
    if cfg["priority_policy"] != "none":
        if cfg["deliver_subject"]:
            raise ApiError.of("JSConsumerPushWithPriorityGroupErr")
        if not cfg["priority_groups"]:
            raise ApiError.of("JSConsumerPriorityPolicyWithoutGroup")
        for group in cfg["priority_groups"]:
            if group == "":
                raise ApiError.of("JSConsumerEmptyGroupName")
            if not _GROUP_NAME.match(group):
                raise ApiError.of("JSConsumerInvalidGroupNameErr")
    else:
        if cfg["priority_groups"]:
            raise ApiError.of("JSConsumerPriorityGroupWithPolicyNone")
        if cfg["priority_timeout"] > 0:
            raise ApiError.of("JSConsumerPinnedTTLWithoutPriorityPolicyNone")


def with_pause(cfg: Config, until: str) -> Config:
    """The config after CONSUMER.PAUSE (`until` "" : resumed), its levels recomputed."""
    out = copy.deepcopy(cfg)
    out["pause_until"] = until
    out["metadata"] = _with_levels(out)
    return out


def _with_levels(cfg: Config) -> dict[str, str]:
    required = 0
    if cfg["pause_until"] or cfg["priority_policy"] != "none" or cfg["priority_groups"]:
        required = 1
    if cfg["ack_policy"] == "flow_control":
        required = max(required, 2)
    user = {k: v for k, v in cfg["metadata"].items() if not k.startswith("_nats.")}
    return {"_nats.level": str(API_LEVEL), "_nats.req.level": str(required),
            "_nats.ver": SERVER_VERSION, **user}
