"""The `accounts {}` block, top-level `mappings`, `system_account` and
`no_auth_user`, read into plain dataclasses and checked as nats-server 2.15
checks them at load (`nats-server -t`).

Two passes, as in nats-server: first every account with its users,
limits, mappings and the raw export/import entries; then, once all accounts
are known, exports are registered and each import is authorised against
them in order, refusing unknown accounts, imports of subjects never exported
(or exported privately to others) and imports that close a cycle. Error
texts are nats-server's; `tests/integration/test_accounts_config_diff.py`
runs the same files through `nats-server -t`.

Pure: the routing core consumes `AccountsConfig` (see `docs/notes/acct.md`).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping as MappingABC
from dataclasses import dataclass, field
from typing import Any, TypeVar

from node.config import (
    ConfigError,
    _block,
    _bool,
    _duration,
    _Field,
    _fields,
    _int,
    _permissions,
    _size,
    _str,
    _used_as_var,
    _want,
)
from node.jwt import is_public_key
from node.mapping import (
    MappingError,
    MappingTable,
    Transform,
    build_mapping,
    compile_transform,
    reverse_transform,
    tokenize_wildcards,
    untokenize,
)
from node.options import Permissions
from node.subject import (
    FWC,
    PWC,
    SEP,
    subject_matches,
    subjects_collide,
    valid_literal_subject,
    valid_subject,
)

GLOBAL_ACCOUNT = "$G"
DEFAULT_SYSTEM_ACCOUNT = "$SYS"
CONNECTION_TYPES = frozenset({"STANDARD", "WEBSOCKET", "LEAFNODE", "LEAFNODE_WS", "MQTT",
                              "MQTT_WS", "IN_PROCESS"})
UNLIMITED = -1
_GO_INT = re.compile(r"[+-]?[0-9]+")


class ResponseType(enum.Enum):
    SINGLETON = "Singleton"
    STREAM = "Stream"
    CHUNKED = "Chunked"


_RESPONSE_TYPES = {"single": ResponseType.SINGLETON, "singleton": ResponseType.SINGLETON,
                   "stream": ResponseType.STREAM, "chunk": ResponseType.CHUNKED,
                   "chunked": ResponseType.CHUNKED}


@dataclass
class AccountUser:
    """A user or nkey user of an account (`account` is its name)."""

    account: str
    user: str | None = None
    password: str | None = None  # plain text or a bcrypt hash ("$2a$...")
    nkey: str | None = None
    permissions: Permissions | None = None
    allowed_connection_types: frozenset[str] | None = None  # None: any

    @property
    def name(self) -> str:
        return self.nkey or self.user or ""


@dataclass
class StreamExport:
    subject: str
    accounts: frozenset[str] | None = None  # None: public
    token_position: int = 0

    def allows(self, account: str, subject: str) -> bool:
        return _export_allows(self.subject, self.accounts, self.token_position, account, subject)


@dataclass
class ServiceExport:
    subject: str
    accounts: frozenset[str] | None = None
    response_type: ResponseType = ResponseType.SINGLETON
    response_threshold: float | None = None  # seconds
    latency_subject: str | None = None
    latency_sampling: int = 100
    token_position: int = 0
    allow_trace: bool = False  # a traced request's trace continues in the exporter

    def allows(self, account: str, subject: str) -> bool:
        return _export_allows(self.subject, self.accounts, self.token_position, account, subject)


def _export_allows(export: str, accounts: frozenset[str] | None, token_position: int,
                   account: str, subject: str) -> bool:
    """Is `account` allowed to import `subject` through this export?

    The import must be no wider than the export; a private export lists the
    accounts; a token position requires that token to be the account name."""
    if not _is_subset(subject, export):
        return False
    if token_position:
        tokens = subject.split(SEP)
        return len(tokens) >= token_position and tokens[token_position - 1] == account
    return accounts is None or account in accounts


def _is_subset(subject: str, pattern: str) -> bool:
    """Every subject `subject` matches is matched by `pattern` (tokens of
    `subject` may be wildcards)."""
    stoks, ptoks = subject.split(SEP), pattern.split(SEP)
    for i, p in enumerate(ptoks):
        if i >= len(stoks):
            return False
        s = stoks[i]
        if p == FWC:
            return True
        if s == FWC or (s == PWC and p != PWC) or (p not in (PWC, s)):
            return False
    return len(stoks) == len(ptoks)


@dataclass
class StreamImport:
    """Messages published in `account` on `subject` appear here on `local_subject`."""

    account: str
    subject: str
    prefix: str = ""
    to: str = ""
    transform: Transform | None = None  # subject -> to, when `to` is a remap
    allow_trace: bool = False  # a traced message's trace continues in the importer

    @property
    def local_subject(self) -> str:
        """The subject (pattern) the messages have in the importer."""
        if self.prefix:
            return f"{self.prefix}{SEP}{self.subject}"
        if self.transform is not None:
            return untokenize(self.transform.dest)  # "swapped.$2.$1" is "swapped.*.*"
        return self.to or self.subject

    def exporter_subject(self, local: str) -> str:
        """A subscription's subject in the importer, as the exporter sees it (the
        subject of nats-server's shadow subscription, which a traced egress names)."""
        if self.prefix:
            head = self.prefix + SEP
            return local[len(head):] if local.startswith(head) else local
        if not self.to:
            return local
        if local == self.local_subject:
            return self.subject
        if self.transform is not None:
            back = reverse_transform(self.transform).apply(local)
            return local if back is None else back
        return self.subject  # a literal remap


@dataclass
class ServiceImport:
    """Requests published here on `local_subject` go to `account` on `subject`."""

    account: str
    subject: str
    to: str = ""  # the local subject, when it differs
    share: bool = False
    transform: Transform | None = None  # local_subject -> subject

    @property
    def local_subject(self) -> str:
        """The subject (pattern) requests are published on in the importer."""
        if self.transform is not None:
            return self.transform.src  # "ask.{{wildcard(1)}}" is served as "ask.*"
        return self.to or self.subject


@dataclass
class AccountLimits:
    max_connections: int = UNLIMITED
    max_subscriptions: int = UNLIMITED
    max_payload: int = UNLIMITED
    max_leafnodes: int = UNLIMITED


@dataclass
class JetStreamLimits:
    """Per-account JetStream limits; enforced by the JetStream layer."""

    enabled: bool = False
    max_mem: int = UNLIMITED
    max_file: int = UNLIMITED
    max_streams: int = UNLIMITED
    max_consumers: int = UNLIMITED
    max_ack_pending: int = UNLIMITED
    max_bytes_required: bool = False
    memory_max_stream_bytes: int = UNLIMITED
    store_max_stream_bytes: int = UNLIMITED
    # JWT `tiered_limits`: tier name ("R1", "R3") -> that tier's limits, used instead of the
    # flat ones above when not empty (node/jetstream/jsaccount.py picks the tier)
    tiers: dict[str, JetStreamLimits] = field(default_factory=dict)


@dataclass(frozen=True)
class MsgTraceConfig:
    """`msg_trace {dest, sampling}`: sampled W3C `traceparent` messages are traced to
    `dest` (node/msgtrace.py), `sampling` percent of them."""

    dest: str
    sampling: int = 100


@dataclass
class AccountConfig:
    name: str
    nkey: str | None = None
    users: list[AccountUser] = field(default_factory=list)
    default_permissions: Permissions | None = None
    stream_exports: list[StreamExport] = field(default_factory=list)
    service_exports: list[ServiceExport] = field(default_factory=list)
    stream_imports: list[StreamImport] = field(default_factory=list)
    service_imports: list[ServiceImport] = field(default_factory=list)
    mappings: MappingTable = field(default_factory=MappingTable)
    limits: AccountLimits = field(default_factory=AccountLimits)
    jetstream: JetStreamLimits = field(default_factory=JetStreamLimits)
    msg_trace: MsgTraceConfig | None = None
    # An account JWT's `name` (the account itself is named by its public key): what /jsz
    # shows as the account's name, as nats-server does
    name_tag: str = ""
    # Where the users were written, for duplicate-user errors.
    users_where: Any = field(default=None, repr=False, compare=False)

    def stream_export_for(self, importer: str, subject: str) -> StreamExport | None:
        return _authorizing_export(self.stream_exports, importer, subject)

    def service_export_for(self, importer: str, subject: str) -> ServiceExport | None:
        return _authorizing_export(self.service_exports, importer, subject)


_E = TypeVar("_E", StreamExport, ServiceExport)


def _authorizing_export(exports: list[_E], importer: str, subject: str) -> _E | None:
    """The export through which `importer` may import `subject`, or None.

    As nats-server: exports with exactly the import's subject decide alone
    (entries for one subject merge: any private entry makes it private to the
    union of their accounts); otherwise any wider export that admits the
    importer will do."""
    exact = [e for e in exports if e.subject == subject]
    if exact:
        private = [e for e in exact if e.accounts is not None or e.token_position]
        if not private:
            return exact[0]
        return next((e for e in private if e.allows(importer, subject)), None)
    return next((e for e in exports if e.allows(importer, subject)), None)


@dataclass
class AccountsConfig:
    """Everything account-related a config file defines."""

    accounts: dict[str, AccountConfig] = field(default_factory=dict)
    global_mappings: MappingTable = field(default_factory=MappingTable)  # for $G
    system_account: str = DEFAULT_SYSTEM_ACCOUNT
    no_system_account: bool = False
    no_auth_user: str | None = None

    def account(self, name: str) -> AccountConfig | None:
        return self.accounts.get(name)

    def users(self) -> list[AccountUser]:
        return [u for a in self.accounts.values() for u in a.users]

    def find_user(self, name: str) -> AccountUser | None:
        """A user by user name or nkey, in any account."""
        return next((u for u in self.users() if name in (u.user, u.nkey)), None)

    def mappings_for(self, account: str) -> MappingTable:
        if account == GLOBAL_ACCOUNT:
            return self.global_mappings
        acc = self.accounts.get(account)
        return acc.mappings if acc else MappingTable()


# --------------------------------------------------------------------------
# Mappings


def _weight(f: _Field) -> int:
    v = f.value
    if isinstance(v, bool) or not isinstance(v, int | str):
        raise f.fail(f"Unknown entry type for weight of {v}")
    if isinstance(v, str):
        text = v.removesuffix("%")
        if not _GO_INT.fullmatch(text):
            raise f.fail(f'Invalid weight "{text}" for mapping destination')
        v = int(text)
    if not 0 <= v <= 100:
        raise f.fail(f"Invalid weight {v} for mapping destination")
    return v


def _map_destination(f: _Field) -> tuple[str, int, str | None]:
    if not isinstance(f.value, dict):
        raise f.fail("Expected an entry for the mapping destination")
    dest, weight, cluster = "", None, None
    for sub in _fields(f.value, f.path + "."):
        if sub.key in ("dest", "destination"):
            dest = _str(sub)
        elif sub.key == "weight":
            weight = _weight(sub)
        elif sub.key == "cluster":
            cluster = _str(sub)
        else:
            raise sub.fail(f'Unknown field "{sub.name}" for mapping destination')
    if weight is None:
        raise f.fail(f'Missing weight for mapping destination "{dest}"')
    return dest, weight, cluster


def parse_mappings(f: _Field) -> MappingTable:
    """A `mappings {}` block: `src: dest`, `src: {dest, weight}` or a list."""
    table = MappingTable()
    for entry in _fields(_block(f), f.path + "."):
        src = entry.name
        if not valid_subject(src):
            raise entry.fail(f'Subject "{src}" is not a valid subject')
        try:
            if isinstance(entry.value, str):
                mapping = build_mapping(src, [(entry.value, 100, None)], single=True)
            elif isinstance(entry.value, list):
                items = [_Field(entry.key, v, entry.where, f"{entry.path}[{i}]")
                         for i, v in enumerate(entry.value)]
                mapping = build_mapping(src, [_map_destination(i) for i in items])
            else:
                mapping = build_mapping(src, [_map_destination(entry)])
        except MappingError as e:
            raise entry.fail(str(e)) from None
        table.add(mapping)
    return table


def mapping_table_from_config(root: MappingABC[str, Any]) -> MappingTable:
    """The top-level `mappings` (or `maps`) block of a parsed config: $G's."""
    table = MappingTable()
    for f in _fields(root, ""):
        if f.key in ("mappings", "maps"):
            table = parse_mappings(f)
    return table


# --------------------------------------------------------------------------
# Users, limits, jetstream


def _connection_types(f: _Field) -> frozenset[str]:
    items = [f.value] if isinstance(f.value, str) else _want(f, list, "an array of strings")
    names = [_str(_Field(f.key, v, f.where, f.path)).upper() for v in items]
    bad = [n for n in names if n not in CONNECTION_TYPES]
    if bad:
        quoted = " ".join(f'"{n}"' for n in bad)
        raise f.fail(f"invalid connection types [{quoted}]")
    return frozenset(names)


def _user_permissions(f: _Field) -> Permissions:
    perms = _permissions(f)
    if perms.allow_responses and perms.publish_allow is None:
        # nats-server: allow_responses turns the blanket publish allow off.
        perms.publish_allow = []
    return perms


def _user(account: str, f: _Field) -> AccountUser:
    if not isinstance(f.value, dict):
        raise f.fail(f"Expected user entry to be a map/struct, got {f.value}")
    u = AccountUser(account)
    for sub in _fields(f.value, f.path + "."):
        if sub.key == "nkey":
            u.nkey = _str(sub)
        elif sub.key in ("user", "username"):
            u.user = _str(sub)
        elif sub.key in ("pass", "password"):
            u.password = _str(sub)
        elif sub.key in ("permission", "permissions", "authorization"):
            u.permissions = _user_permissions(sub)
        elif sub.key in ("allowed_connection_types", "connection_types", "clients"):
            u.allowed_connection_types = _connection_types(sub)
        elif not _used_as_var(f.value, sub):
            raise sub.fail(f'unknown field "{sub.name}"')
    if not u.nkey and not u.user:
        raise f.fail("User entry requires a user")
    if u.nkey:
        if not is_public_key(u.nkey, b"U"):
            raise f.fail("Not a valid public nkey for a user")
        if u.user or u.password:
            raise f.fail("Nkey users do not take usernames or passwords")
    return u


_LIMIT_KEYS = {"max_connections": "max_connections", "max_conn": "max_connections",
               "max_subscriptions": "max_subscriptions", "max_subs": "max_subscriptions",
               "max_payload": "max_payload", "max_pay": "max_payload",
               "max_leafnodes": "max_leafnodes", "max_leafs": "max_leafnodes"}


def _limits(f: _Field) -> AccountLimits:
    if not isinstance(f.value, dict):
        raise f.fail(f"Expected account limits to be a map/struct, got {f.value}")
    limits = AccountLimits()
    for sub in _fields(f.value, f.path + "."):
        attr = _LIMIT_KEYS.get(sub.key)
        if attr:
            setattr(limits, attr, _int(sub))
        elif not _used_as_var(f.value, sub):
            raise sub.fail(f'Unknown field "{sub.name}" parsing account limits')
    return limits


_JS_KEYS = {"max_memory": "max_mem", "max_mem": "max_mem", "mem": "max_mem",
            "max_store": "max_file", "max_file": "max_file", "max_disk": "max_file",
            "store": "max_file", "disk": "max_file", "max_streams": "max_streams",
            "streams": "max_streams", "max_consumers": "max_consumers",
            "consumers": "max_consumers", "max_ack_pending": "max_ack_pending",
            "memory_max_stream_bytes": "memory_max_stream_bytes",
            "mem_max_stream_bytes": "memory_max_stream_bytes",
            "store_max_stream_bytes": "store_max_stream_bytes",
            "disk_max_stream_bytes": "store_max_stream_bytes"}
_JS_SIZES = frozenset({"max_mem", "max_file", "memory_max_stream_bytes", "store_max_stream_bytes"})
# nats-server's aliases above are limits it enforces: none may be read and then ignored.
# `cluster_traffic` picks the account that carries a clustered JetStream's Raft traffic,
# not a limit; Jetraft's Raft runs on its own transport (node/cluster).
_JS_IGNORED = frozenset({"cluster_traffic"})


def _jetstream(f: _Field) -> JetStreamLimits:
    js = JetStreamLimits()
    if isinstance(f.value, str):
        if f.value.lower() not in ("enabled", "enable", "disabled", "disable"):
            raise f.fail(f"Expected 'enabled' or 'disabled' for string value, got '{f.value}'")
        js.enabled = f.value.lower().startswith("enable")
        return js
    if isinstance(f.value, bool):
        js.enabled = f.value
        return js
    js.enabled = True
    for sub in _fields(_block(f), f.path + "."):
        attr = _JS_KEYS.get(sub.key)
        if attr:
            setattr(js, attr, _size(sub) if attr in _JS_SIZES else _int(sub))
        elif sub.key in ("max_bytes_required", "max_stream_bytes"):
            js.max_bytes_required = _bool(sub)
        elif sub.key not in _JS_IGNORED and not _used_as_var(f.value, sub):
            raise sub.fail(f'unknown field "{sub.name}"')
    return js


# --------------------------------------------------------------------------
# Exports and imports: first pass (syntax)


def _export(f: _Field) -> StreamExport | ServiceExport | None:
    if not isinstance(f.value, dict):
        raise f.fail(f"Export Items should be a map with type entry, got {type(f.value).__name__}")
    kind, subject, accounts, position = None, "", None, 0
    rtype: ResponseType | None = None
    threshold, latency = None, None
    allow_trace: _Field | None = None
    for sub in _fields(f.value, f.path + "."):
        if sub.key in ("stream", "service"):
            if kind is not None and kind != sub.key:
                raise sub.fail(f'Detected {sub.key} "{sub.value}" but already saw a {kind}')
            kind, subject = sub.key, _str(sub)
        elif sub.key in ("response", "response_type"):
            rtype = _RESPONSE_TYPES.get(_str(sub).lower())
            if rtype is None:
                raise sub.fail(f'Unknown response type: "{sub.value}"')
        elif sub.key in ("threshold", "response_threshold", "response_max_time", "response_time"):
            threshold = _duration(sub)
        elif sub.key == "accounts":
            accounts = frozenset(_str(_Field(sub.key, v, sub.where, sub.path))
                                 for v in _want(sub, list, "an array of account names"))
        elif sub.key == "latency":
            latency = sub.value
        elif sub.key == "account_token_position":
            position = _int(sub)
        elif sub.key == "allow_trace":
            allow_trace = sub
        elif not _used_as_var(f.value, sub):
            raise sub.fail(f'unknown field "{sub.name}"')
    if kind == "stream" and allow_trace is not None:
        raise allow_trace.fail("Detected allow_trace directive on non-service")
    if kind == "stream" and (rtype is not None or threshold is not None or latency is not None):
        raise f.fail("Detected response directive on non-service")
    if kind == "stream":
        return StreamExport(subject, accounts, position)
    if kind == "service":
        lat_subject = latency if isinstance(latency, str) else None
        if isinstance(latency, dict):
            lat_subject = latency.get("subject")
        return ServiceExport(subject, accounts, rtype or ResponseType.SINGLETON, threshold,
                             lat_subject, token_position=position,
                             allow_trace=allow_trace is not None and _bool(allow_trace))
    return None  # an empty entry: nats-server ignores it


def _import_source(f: _Field) -> tuple[str, str]:
    if not isinstance(f.value, dict):
        kind = "Stream" if f.key == "stream" else "Service"
        raise f.fail(f"{kind} entry should be an account map, got {type(f.value).__name__}")
    account, subject = "", ""
    for sub in _fields(f.value, f.path + "."):
        if sub.key == "account":
            account = _str(sub)
        elif sub.key == "subject":
            subject = _str(sub)
        elif not _used_as_var(f.value, sub):
            raise sub.fail(f'unknown field "{sub.name}"')
    if not account or not subject:
        raise f.fail("Expect an account name and a subject")
    return account, subject


def _import(f: _Field) -> StreamImport | ServiceImport | None:
    if not isinstance(f.value, dict):
        raise f.fail(f"Import Items should be a map with type entry, got {type(f.value).__name__}")
    kind, account, subject, prefix, to, share = None, "", "", "", "", False
    to_field: _Field | None = None
    allow_trace: _Field | None = None
    for sub in _fields(f.value, f.path + "."):
        if sub.key in ("stream", "service"):
            if kind is not None and kind != sub.key:
                raise sub.fail(f"Detected {sub.key} but already saw a {kind}")
            kind = sub.key
            account, subject = _import_source(sub)
        elif sub.key == "prefix":
            prefix = _str(sub)
        elif sub.key == "to":
            to, to_field = _str(sub), sub
        elif sub.key == "share":
            share = _bool(sub)
        elif sub.key == "allow_trace":
            allow_trace = sub
        elif not _used_as_var(f.value, sub):
            raise sub.fail(f'unknown field "{sub.name}"')
    if kind == "service" and allow_trace is not None:
        raise allow_trace.fail("Detected allow_trace directive on a non-stream")
    if kind == "stream":
        if prefix and to:
            assert to_field is not None
            raise to_field.fail("Stream import can not have a 'prefix' and a 'to' property")
        return StreamImport(account, subject, prefix, to,
                            allow_trace=allow_trace is not None and _bool(allow_trace))
    if kind == "service":
        return ServiceImport(account, subject, to, share)
    return None


# --------------------------------------------------------------------------
# Accounts: first pass


def _account(name: str, f: _Field) -> AccountConfig:
    if not isinstance(f.value, dict):
        raise f.fail("Expected map entries for accounts")
    if name == GLOBAL_ACCOUNT:
        raise f.fail(f'"{name}" is a Reserved Account')
    acc = AccountConfig(name)
    users_field: _Field | None = None
    for sub in _fields(f.value, f.path + "."):
        if sub.key == "nkey":
            if not isinstance(sub.value, str) or not is_public_key(sub.value, b"A"):
                raise sub.fail(f'Not a valid public nkey for an account: "{sub.value}"')
            acc.nkey = sub.value
        elif sub.key == "users":
            users_field = sub
            items = _want(sub, list, "an array of users")
            acc.users = [_user(name, _Field(sub.key, v, sub.where, f"{sub.path}[{i}]"))
                         for i, v in enumerate(items)]
        elif sub.key == "exports":
            acc.stream_exports, acc.service_exports = _exports(sub)
        elif sub.key == "imports":
            acc.stream_imports, acc.service_imports = _imports(sub)
        elif sub.key == "default_permissions":
            acc.default_permissions = _user_permissions(sub)
        elif sub.key in ("mappings", "maps"):
            acc.mappings = parse_mappings(sub)
        elif sub.key == "limits":
            acc.limits = _limits(sub)
        elif sub.key == "jetstream":
            acc.jetstream = _jetstream(sub)
        elif sub.key == "msg_trace":
            acc.msg_trace = _msg_trace(sub)
        elif not _used_as_var(f.value, sub):
            raise sub.fail(f'unknown field "{sub.name}"')
    for u in acc.users:
        if u.permissions is None:
            u.permissions = acc.default_permissions
    acc.users_where = users_field
    return acc


def _msg_trace(f: _Field) -> MsgTraceConfig | None:
    """nats-server's account `msg_trace`: a destination string, or {dest, sampling}."""
    if isinstance(f.value, str):
        fields = [f]
        dest_field: _Field | None = f
    else:
        fields = _fields(_block(f), f.path + ".")
        dest_field = None
    sampling = 100
    for sub in fields:
        if sub is f:
            continue
        if sub.key == "dest":
            dest_field = sub
        elif sub.key == "sampling":
            value = str(sub.value).strip().rstrip("%")
            sampling = int(value) if value.lstrip("-").isdigit() else -1
            if not 1 <= sampling <= 100:
                raise sub.fail(f"Ttrace destination sampling value {sub.value} is invalid, "
                               "needs to be [1..100]")
        elif not _used_as_var(f.value, sub):
            raise sub.fail(f'Unknown field "{sub.name}" parsing account message trace '
                           f'map/struct "{f.name}"')
    if dest_field is None:
        return None  # nats-server: sampling ignored since no destination was set
    dest = _str(dest_field)
    if not valid_literal_subject(dest):
        raise dest_field.fail(f'Trace destination "{dest}" is not valid')
    return MsgTraceConfig(dest, sampling)


def _exports(f: _Field) -> tuple[list[StreamExport], list[ServiceExport]]:
    if not isinstance(f.value, list):
        raise f.fail(f"Exports should be an array, got {_go_type(f.value)}")
    streams: list[StreamExport] = []
    services: list[ServiceExport] = []
    for i, v in enumerate(f.value):
        e = _export(_Field(f.key, v, f.where, f"{f.path}[{i}]"))
        if isinstance(e, StreamExport):
            streams.append(e)
        elif isinstance(e, ServiceExport):
            services.append(e)
    return streams, services


def _imports(f: _Field) -> tuple[list[StreamImport], list[ServiceImport]]:
    if not isinstance(f.value, list):
        raise f.fail(f"Imports should be an array, got {_go_type(f.value)}")
    streams: list[StreamImport] = []
    services: list[ServiceImport] = []
    for i, v in enumerate(f.value):
        entry = _Field(f.key, v, f.where, f"{f.path}[{i}]")
        imp = _import(entry)
        if isinstance(imp, StreamImport):
            streams.append(imp)
        elif isinstance(imp, ServiceImport):
            # nats-server 2.15 keys this on (exporting account, local subject).
            dup = next((s for s in services if s.local_subject == imp.local_subject
                        and s.account == imp.account), None)
            if dup is not None:
                raise entry.fail(f'Duplicate service import subject "{imp.local_subject}", '
                                 f'previously used in import for account "{dup.account}", '
                                 f'subject "{dup.subject}"')
            services.append(imp)
    return streams, services


def _go_type(v: Any) -> str:
    return "map[string]interface {}" if isinstance(v, dict) else type(v).__name__


# --------------------------------------------------------------------------
# Second pass: exports and imports against each other


def _link(accounts: dict[str, AccountConfig], f: _Field) -> None:
    for acc in accounts.values():
        for se in acc.stream_exports:
            _check_export(accounts, f, "stream", se.subject, se.accounts, se.token_position)
        for ve in acc.service_exports:
            _check_export(accounts, f, "service", ve.subject, ve.accounts, ve.token_position)
    added: dict[str, list[StreamImport]] = {name: [] for name in accounts}
    for acc in accounts.values():
        for si in acc.stream_imports:
            _link_stream_import(accounts, added, acc, si, f)
            added[acc.name].append(si)
    added_svc: dict[str, list[ServiceImport]] = {name: [] for name in accounts}
    for acc in accounts.values():
        for vi in acc.service_imports:
            _link_service_import(accounts, added_svc, acc, vi, f)
            added_svc[acc.name].append(vi)


def _check_export(accounts: dict[str, AccountConfig], f: _Field, kind: str, subject: str,
                  allowed: frozenset[str] | None, position: int) -> None:
    for name in sorted(allowed or ()):
        if name not in accounts:
            raise f.fail(f'"{name}" account not defined for {kind} export')
    tokens = subject.split(SEP)
    if position and (position > len(tokens) or tokens[position - 1] != PWC):
        raise f.fail(f'Error adding {kind} export "{subject}": sublist: invalid subject')


def _link_stream_import(accounts: dict[str, AccountConfig], added: dict[str, list[StreamImport]],
                        acc: AccountConfig, si: StreamImport, f: _Field) -> None:
    source = accounts.get(si.account)
    if source is None:
        raise f.fail(f'"{si.account}" account not defined for stream import')
    fail = f'Error adding stream import "{si.subject}": '
    if source.stream_export_for(acc.name, si.subject) is None:
        raise f.fail(fail + "stream import not authorized")
    # nats-server walks twice: with the exporter's subject and with the local one.
    walks = dict.fromkeys([si.subject, si.local_subject])
    if any(_stream_cycle(accounts, added, si.account, local, {acc.name}) for local in walks):
        raise f.fail(fail + "import forms a cycle")
    if si.to and has_wildcard(si.subject):
        try:
            si.transform = compile_transform(si.subject, tokenize_wildcards(si.to), strict=True)
        except MappingError as e:
            raise f.fail(fail + "failed to create mapping transform for stream import subject "
                         f'from "{si.subject}" to "{si.to}": {e}') from None
    if any(s.account == si.account and s.subject == si.subject for s in added[acc.name]):
        raise f.fail(fail + "stream import already exists")


def has_wildcard(subject: str) -> bool:
    return any(t in (PWC, FWC) for t in subject.split(SEP))


def _stream_cycle(accounts: dict[str, AccountConfig], added: dict[str, list[StreamImport]],
                  exporter: str, local: str, visited: set[str]) -> bool:
    """nats-server's check, run before an import whose subject in the
    importer is `local`: follow the exporter's imports that feed subjects
    colliding with it, and report a cycle on reaching a visited account.
    `visited` is shared by the whole walk, as nats-server's map is."""
    source = accounts.get(exporter)
    if source is None or not any(_is_subset(local, e.subject) for e in source.stream_exports):
        return False
    for si in added.get(exporter, []):
        if not subjects_collide(local, si.local_subject):
            continue
        if si.account in visited:
            return True
        visited.add(exporter)
        if _is_subset(si.local_subject, local):
            local = si.local_subject
        if _stream_cycle(accounts, added, si.account, local, visited):
            return True
    return False


def _link_service_import(accounts: dict[str, AccountConfig],
                         added: dict[str, list[ServiceImport]], acc: AccountConfig,
                         vi: ServiceImport, f: _Field) -> None:
    target = accounts.get(vi.account)
    if target is None:
        raise f.fail(f'"{vi.account}" account not defined for service import')
    fail = f'Error adding service import "{vi.subject}": '
    if target.service_export_for(acc.name, vi.subject) is None:
        raise f.fail(fail + "service import not authorized")
    if _service_cycle(added, vi.account, vi.local_subject, {acc.name}):
        raise f.fail(fail + "import forms a cycle")
    if vi.to and has_wildcard(vi.subject):
        try:
            forward = compile_transform(vi.subject, tokenize_wildcards(vi.to), strict=True)
            vi.transform = reverse_transform(forward)
        except MappingError as e:
            raise f.fail(fail + "failed to create mapping transform for service import subject "
                         f'from "{vi.local_subject}" to "{vi.subject}": {e}') from None


def _service_cycle(added: dict[str, list[ServiceImport]], target: str, local: str,
                   visited: set[str]) -> bool:
    """nats-server's check, run before a service import whose subject in the
    importer is `local`: it compares that subject with the target's imports'
    subjects on *their* targets, a conservative walk kept as it is so that
    the same configs load. `visited` is shared by the whole walk."""
    for vi in added.get(target, []):
        if not subjects_collide(local, vi.subject):
            continue
        if vi.account in visited:
            return True
        visited.add(target)
        if _is_subset(vi.local_subject, local):
            local = vi.local_subject
        if _service_cycle(added, vi.account, local, visited):
            return True
    return False


# --------------------------------------------------------------------------
# Entry point


def _accounts_block(f: _Field) -> dict[str, AccountConfig]:
    accounts: dict[str, AccountConfig] = {}
    if isinstance(f.value, list):
        for v in f.value:
            name = _str(_Field(f.key, v, f.where, f.path))
            if name == GLOBAL_ACCOUNT:
                raise f.fail(f'"{name}" is a Reserved Account')
            if name in accounts:
                raise f.fail(f"Duplicate Account Entry: {name}")
            accounts[name] = AccountConfig(name)
        return accounts
    block = _block(f)
    for sub in _fields(block, "accounts."):
        if _used_as_var(block, sub):
            continue
        accounts[sub.name] = _account(sub.name, sub)
    return accounts


def _check_unique_users(accounts: dict[str, AccountConfig], global_users: list[Any],
                        f: _Field) -> None:
    seen: set[str] = set()
    for acc in accounts.values():
        where: _Field = acc.users_where or f
        for u in acc.users:
            kind = "nkey" if u.nkey else "user"
            if u.name in seen:
                raise where.fail(f'Duplicate {kind} "{u.name}" detected')
            seen.add(u.name)
    for u in global_users:
        name = getattr(u, "nkey", None) or getattr(u, "user", None)
        if name in seen:
            raise f.fail(f'Duplicate user "{name}" detected')


def parse_accounts_config(root: MappingABC[str, Any],
                          global_users: list[Any] | None = None) -> AccountsConfig:
    """Read the account-related keys of a parsed config (`parse_config`).

    `global_users` are the `authorization { users }` entries, which must not
    reuse a name an account user has. Raises ConfigError."""
    out = AccountsConfig()
    accounts_field: _Field | None = None
    for f in _fields(root, ""):
        if f.key == "accounts":
            accounts_field = f
            out.accounts = _accounts_block(f)
        elif f.key in ("mappings", "maps"):
            out.global_mappings = parse_mappings(f)
        elif f.key in ("system_account", "system"):
            out.system_account = _str(f)
        elif f.key in ("no_system_account", "no_system", "no_sys_acc"):
            out.no_system_account = _bool(f)
        elif f.key == "no_auth_user":
            out.no_auth_user = _str(f)
    if accounts_field is not None:
        _check_unique_users(out.accounts, global_users or [], accounts_field)
        _link(out.accounts, accounts_field)
    return out


def validate_accounts_at_start(conf: AccountsConfig, global_user_names: set[str]) -> None:
    """Checks nats-server makes when it starts (not under -t)."""
    if conf.no_auth_user is not None:
        names = {u.name for u in conf.users()} | global_user_names
        if conf.no_auth_user not in names:
            raise ConfigError(f'no_auth_user: "{conf.no_auth_user}" not present as user or nkey '
                              "in authorization block or account configuration")


# --------------------------------------------------------------------------
# Where a message goes across accounts (pure; the routing core calls these)


@dataclass(frozen=True)
class StreamDelivery:
    """A message published in the exporter also appears in `account` on `subject`."""

    account: str
    subject: str
    allow_trace: bool = False  # the import lets a trace continue into `account`
    # The import (a traced egress names the subscription in the exporter's subjects).
    source: StreamImport | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ServiceRoute:
    """A request published in the importer goes to `account` on `subject`."""

    account: str
    subject: str
    export: ServiceExport
    share: bool


_ROUTE_CACHE_MAX = 4096  # (account, subject) routes remembered per index


class ImportIndex:
    """Stream imports indexed by exporter, service imports by importer."""

    def __init__(self, conf: AccountsConfig) -> None:
        self.streams: dict[str, list[tuple[str, StreamImport]]] = {}
        self.services: dict[str, list[ServiceImport]] = {}
        for acc in conf.accounts.values():
            for si in acc.stream_imports:
                self.streams.setdefault(si.account, []).append((acc.name, si))
            if acc.service_imports:
                self.services[acc.name] = list(acc.service_imports)
        self.conf = conf
        self._streams_cache: dict[tuple[str, str], list[StreamDelivery]] = {}
        self._services_cache: dict[tuple[str, str], ServiceRoute | None] = {}

    def stream_deliveries(self, exporter: str, subject: str) -> list[StreamDelivery]:
        """Every (importer, subject) a message published in `exporter` reaches.

        Memoised per (exporter, subject): the index belongs to one config (a change
        builds a new Router and index). Not kept when an import's transform made the
        subject (a mapping function may be random). Callers must not mutate the list."""
        key = (exporter, subject)
        out = self._streams_cache.get(key)
        if out is None:
            out, fixed = self._stream_deliveries(exporter, subject)
            if fixed:
                self._remember(self._streams_cache, key, out)
        return out

    def _stream_deliveries(self, exporter: str,
                           subject: str) -> tuple[list[StreamDelivery], bool]:
        out = []
        fixed = True
        source = self.conf.accounts.get(exporter)
        for importer, si in self.streams.get(exporter, ()):
            if not subject_matches(si.subject, subject):
                continue
            # Config imports were authorised at load; account JWTs were not.
            if source is None or source.stream_export_for(importer, subject) is None:
                continue
            fixed = fixed and si.transform is None
            out.append(StreamDelivery(importer, _stream_local_subject(si, subject),
                                      si.allow_trace, si))
        return out, fixed

    def settled(self, account: str, subject: str) -> bool:
        """Whether both routes of a publish in `account` on `subject` are memoised, so
        that no random transform takes part and they stay what they are now."""
        key = (account, subject)
        return key in self._streams_cache and key in self._services_cache

    def service_route(self, importer: str, subject: str) -> ServiceRoute | None:
        """Where a request on `subject` published in `importer` is served, if
        one of its service imports covers it (memoised as stream_deliveries is)."""
        key = (importer, subject)
        cache = self._services_cache
        if key in cache:
            return cache[key]
        route, fixed = self._service_route(importer, subject)
        if fixed:
            self._remember(cache, key, route)
        return route

    def _service_route(self, importer: str, subject: str) -> tuple[ServiceRoute | None, bool]:
        fixed = True
        for vi in self.services.get(importer, ()):
            if not subject_matches(vi.local_subject, subject):
                continue
            fixed = fixed and vi.transform is None
            target = self.conf.accounts.get(vi.account)
            remote = _service_remote_subject(vi, subject)
            export = target.service_export_for(importer, remote) if target else None
            if export is not None:
                return ServiceRoute(vi.account, remote, export, vi.share), fixed
        return None, fixed

    @staticmethod
    def _remember(cache: dict, key: tuple[str, str], value: Any) -> None:
        if len(cache) >= _ROUTE_CACHE_MAX:
            cache.clear()  # bounded: publishers may use any number of subjects
        cache[key] = value


def _stream_local_subject(si: StreamImport, subject: str) -> str:
    if si.prefix:
        return f"{si.prefix}{SEP}{subject}"
    if si.transform is not None:
        mapped = si.transform.apply(subject)
        return subject if mapped is None else mapped
    return si.to or subject


def _service_remote_subject(vi: ServiceImport, subject: str) -> str:
    if vi.transform is not None:
        mapped = vi.transform.apply(subject)
        return subject if mapped is None else mapped
    if vi.to and not has_wildcard(vi.subject):
        return vi.subject  # a literal remap: "to" is the local name of one subject
    return subject
