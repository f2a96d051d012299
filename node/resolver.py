"""Operator mode: the `operator`, `system_account`, `resolver` and
`resolver_preload` settings, and the account resolvers.

* `MemoryResolver` (`resolver: MEMORY`) holds the preloaded account JWTs.
* `DirResolver` (`resolver { type: full, dir: ... }`) keeps one
  `<account public key>.jwt` file per account. A claim update (what
  `$SYS.REQ.CLAIMS.UPDATE` carries) is verified, refused if older than the
  stored JWT, then written durably: temporary file, fsync, rename, fsync of
  the directory. A failed fsync raises `ResolverDiskError`, after which the
  node must stop (the guide's durability rule).

Only the directory resolver touches the disk; parsing and checks are pure
and take `now` as an argument. Settings Jetraft cannot honour (URL and cache
resolvers) raise `ConfigError` from `validate_operator_start`, so the node
stops with [FTL] rather than running without account checks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from node.accountconf import (
    AccountConfig,
    AccountLimits,
    JetStreamLimits,
    MsgTraceConfig,
    ResponseType,
    ServiceExport,
    ServiceImport,
    StreamExport,
    StreamImport,
    has_wildcard,
)
from node.config import ConfigError, _block, _bool, _Field, _fields, _str, _used_as_var
from node.jwt import (
    PREFIX_ACCOUNT,
    AccountClaims,
    JWTError,
    OperatorClaims,
    decode_account,
    decode_operator,
    decode_public_key,
)
from node.mapping import (
    MappingError,
    MappingTable,
    build_mapping,
    compile_transform,
    reverse_transform,
    tokenize_wildcards,
)
from node.subject import valid_literal_subject, valid_subject

JWT_SUFFIX = ".jwt"
# A claim update arrives as a message; bound it like a JWT.
MAX_ACCOUNT_JWT_BYTES = 1024 * 1024


class ResolverDiskError(OSError):
    """Writing an account JWT failed at fsync: the node must stop."""


@dataclass
class ResolverConfig:
    kind: str  # "MEMORY" | "full" | "cache" | "url"
    dir: str = ""
    url: str = ""
    allow_delete: bool = False


@dataclass
class OperatorConfig:
    operators: list[OperatorClaims]
    system_account: str = ""  # public key; "" = the operator JWT's, if any
    resolver: ResolverConfig | None = None
    preload: dict[str, str] = field(default_factory=dict)

    def trusts(self, issuer: str) -> OperatorClaims | None:
        return next((o for o in self.operators if o.trusts(issuer)), None)


# --------------------------------------------------------------------------
# Config


def _looks_like_jwt(text: str) -> bool:
    return text.startswith("eyJ") and text.count(".") == 2


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _operator_jwt(f: _Field, text: str, read_file: Callable[[str], str]) -> OperatorClaims:
    if not _looks_like_jwt(text):
        try:
            text = read_file(text)
        except OSError as e:
            reason = f"open {text}: {(e.strerror or str(e)).lower()}"
            raise f.fail(f"error parsing operator JWT: {reason}") from None
        text = _strip_decorations(text)
    try:
        return decode_operator(text)
    except JWTError as e:
        raise f.fail(f"error parsing operator JWT: {e}") from None


def _strip_decorations(text: str) -> str:
    """A JWT file as `nsc` writes it may wrap the token in BEGIN/END lines."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    tokens = [ln for ln in lines if _looks_like_jwt(ln)]
    return tokens[0] if tokens else text.strip()


def _resolver(f: _Field) -> ResolverConfig:
    fail = ("error parsing account resolver, should be MEM or  URL(\"url\") or a map "
            "containing dir and type state=[FULL|CACHE])")
    if isinstance(f.value, str):
        text = f.value.strip()
        if text.upper() in ("MEM", "MEMORY"):
            return ResolverConfig("MEMORY")
        if text.upper().startswith("URL(") and text.endswith(")"):
            return ResolverConfig("url", url=text[4:-1].strip("\"'"))
        raise f.fail(fail)
    out = ResolverConfig("")
    for sub in _fields(_block(f), "resolver."):
        if sub.key == "type":
            out.kind = _str(sub).lower()
        elif sub.key == "dir":
            out.dir = _str(sub)
        elif sub.key == "allow_delete":
            out.allow_delete = _bool(sub)
    if out.kind not in ("full", "cache"):
        raise f.fail(fail)
    return out


def _preload(f: _Field) -> dict[str, str]:
    out: dict[str, str] = {}
    for sub in _fields(_block(f), "resolver_preload."):
        if _used_as_var(f.value, sub):
            continue
        try:
            claims = decode_account(_str(sub))
        except JWTError:
            raise sub.fail("invalid account JWT") from None
        out[sub.name] = claims.claims.token
    return out


def parse_operator_config(root: Mapping[str, Any],
                          read_file: Callable[[str], str] = _read) -> OperatorConfig | None:
    """The operator-mode settings of a parsed config; None without `operator`."""
    cfg = OperatorConfig([])
    seen = False
    for f in _fields(root, ""):
        if f.key in ("operator", "operators", "root_operators", "root_operator"):
            seen = True
            values = f.value if isinstance(f.value, list) else [f.value]
            cfg.operators += [_operator_jwt(f, _str(_Field(f.key, v, f.where, f.path)), read_file)
                              for v in values]
        elif f.key in ("resolver", "account_resolver", "accounts_resolver"):
            cfg.resolver = _resolver(f)
        elif f.key == "resolver_preload":
            cfg.preload = _preload(f)
        elif f.key in ("system_account", "system"):
            cfg.system_account = _str(f)
    return cfg if seen else None


def validate_operator_start(cfg: OperatorConfig, has_accounts: bool, has_users: bool) -> None:
    """What nats-server refuses when it starts in operator mode, plus what
    Jetraft cannot do (fail closed: the caller logs [FTL] and exits)."""
    if has_accounts:
        raise ConfigError("operators do not allow Accounts to be configured directly")
    if has_users:
        raise ConfigError("operators do not allow users to be configured directly")
    jwt_systems = {o.system_account for o in cfg.operators if o.system_account}
    if cfg.system_account and jwt_systems and cfg.system_account not in jwt_systems:
        raise ConfigError("system_account in config and operator JWT must be identical")
    r = cfg.resolver
    if r is None or r.kind in ("url", "cache"):
        what = "none" if r is None else r.kind
        raise ConfigError(f"resolver {what!r} is not supported by Jetraft: "
                          "use resolver: MEMORY or resolver { type: full, dir: ... }")
    if cfg.preload and r.kind not in ("MEMORY", "full"):
        raise ConfigError("resolver preloads only available for writeable resolver types "
                          "MEM/DIR/CACHE_DIR")
    if r.kind == "full" and not r.dir:
        raise ConfigError("resolver type full needs a dir")


def system_account_key(cfg: OperatorConfig) -> str:
    if cfg.system_account:
        return cfg.system_account
    return next((o.system_account for o in cfg.operators if o.system_account), "")


# --------------------------------------------------------------------------
# Resolvers


def verify_account_jwt(cfg: OperatorConfig, token: str, now: float,
                       expected_key: str | None = None) -> AccountClaims:
    """Decode an account JWT and check an operator we trust issued it."""
    if len(token) > MAX_ACCOUNT_JWT_BYTES:
        raise JWTError("account JWT too large")
    claims = decode_account(token)
    if expected_key is not None and claims.key != expected_key:
        raise JWTError(f"JWT is for account {claims.key}, not {expected_key}")
    if cfg.trusts(claims.claims.issuer) is None:
        raise JWTError("account JWT not signed by a trusted operator")
    claims.claims.check_time(now)
    from node.activation import import_token_issues  # activation imports accountconf

    issues = import_token_issues(claims) + limit_issues(claims)
    if issues:
        raise JWTError("account JWT has validation issues: " + "; ".join(issues))
    return claims


def limit_issues(claims: AccountClaims) -> list[str]:
    """nats-jwt's validation errors for an account JWT over its own `imports` or
    `exports` limit: nats-server then refuses the whole account (no login, and its
    exports reach nobody), as it does for any JWT with validation errors."""
    issues = []
    lim = claims.limits
    if 0 <= lim.imports < len(claims.imports):
        issues.append("the account contains more imports than allowed by the operator")
    if 0 <= lim.exports < len(claims.exports):
        issues.append("the account contains more exports than allowed by the operator")
    return issues


class MemoryResolver:
    """`resolver: MEMORY`: the preloaded JWTs, updatable in memory only."""

    def __init__(self, cfg: OperatorConfig) -> None:
        self.cfg = cfg
        self.jwts: dict[str, str] = dict(cfg.preload)
        # Verified claims by token text: a login then costs no account-JWT
        # signature check. Bounded by the number of stored tokens.
        self._verified: dict[str, AccountClaims] = {}

    def fetch(self, account_key: str) -> str | None:
        return self.jwts.get(account_key)

    def lookup(self, account_key: str, now: float) -> AccountClaims | None:
        """The usable claims of an account at `now`, or None."""
        token = self.fetch(account_key)
        if token is None:
            return None
        claims = self._verified.get(token)
        if claims is not None and claims.key != account_key:
            return None  # a token stored under another account's key
        try:
            if claims is None:
                claims = verify_account_jwt(self.cfg, token, now, account_key)
                if len(self._verified) > 2 * len(self.jwts) + 16:
                    self._verified.clear()
                self._verified[token] = claims
            claims.claims.check_time(now)
        except JWTError:
            return None
        return claims

    def update(self, token: str, now: float) -> AccountClaims:
        claims = verify_account_jwt(self.cfg, token, now)
        _check_newer(self.jwts.get(claims.key), claims)
        self.jwts[claims.key] = claims.claims.token
        return claims


def _check_newer(stored: str | None, claims: AccountClaims) -> None:
    if stored is None:
        return
    try:
        old = decode_account(stored)
    except JWTError:
        return
    if claims.claims.issued_at < old.claims.issued_at:
        raise JWTError("JWT is older than the one stored")


class DirResolver(MemoryResolver):
    """`resolver { type: full, dir }`: account JWTs stored on disk."""

    def __init__(self, cfg: OperatorConfig, directory: str) -> None:
        super().__init__(cfg)
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        for name in sorted(os.listdir(directory)):
            if name.endswith(JWT_SUFFIX):
                self.jwts[name[: -len(JWT_SUFFIX)]] = _read(os.path.join(directory, name)).strip()
        for key, token in cfg.preload.items():
            self.jwts.setdefault(key, token)

    def path(self, account_key: str) -> str:
        decode_public_key(account_key, PREFIX_ACCOUNT)  # never a path outside dir
        return os.path.join(self.dir, account_key + JWT_SUFFIX)

    def update(self, token: str, now: float) -> AccountClaims:
        claims = verify_account_jwt(self.cfg, token, now)
        _check_newer(self.jwts.get(claims.key), claims)
        write_durably(self.path(claims.key), claims.claims.token.encode())
        self.jwts[claims.key] = claims.claims.token
        return claims

    def delete(self, account_key: str) -> None:
        if not self.cfg.resolver or not self.cfg.resolver.allow_delete:
            raise JWTError("delete not allowed by the resolver configuration")
        path = self.path(account_key)
        os.unlink(path)
        _fsync_dir(self.dir)
        self.jwts.pop(account_key, None)


def write_durably(path: str, data: bytes) -> None:
    """Data, fsync, then the rename that makes it visible, then the directory."""
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        try:
            os.fsync(fd)
        except OSError as e:
            raise ResolverDiskError(e.errno, f"fsync {tmp}: {e.strerror}") from e
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        raise ResolverDiskError(e.errno, f"fsync {directory}: {e.strerror}") from e
    finally:
        os.close(fd)


def claims_update_response(resolver: MemoryResolver, payload: bytes, now: float,
                           expected_account: str | None = None) -> dict[str, Any]:
    """The `data`/`error` part of the reply to `$SYS.REQ.CLAIMS.UPDATE` (or to
    `$SYS.REQ.ACCOUNT.<expected_account>.CLAIMS.UPDATE`); the caller adds
    nats-server's `"server": {...}` member. The body is an account JWT.

    Stricter than nats-server 2.15, which stores any decodable account JWT:
    JWTs from untrusted operators, expired ones and ones older than the stored
    JWT (a replay that would undo a revocation) are refused.
    ResolverDiskError propagates: the caller stops the node."""
    try:
        token = payload.decode("ascii").strip()
        claims = decode_account(token)
    except UnicodeDecodeError:
        return _update_error("n/a", "expected 3 chunks")
    except JWTError as e:
        return _update_error("n/a", str(e))
    if expected_account is not None and claims.key != expected_account:
        return _update_error(expected_account, "subject does not match jwt content")
    try:
        resolver.update(token, now)
    except JWTError as e:
        return _update_error(claims.key, str(e))
    return {"data": {"account": claims.key, "code": 200, "message": "jwt updated"}}


def claims_lookup_response(resolver: MemoryResolver, account_key: str) -> bytes | None:
    """The reply to `$SYS.REQ.ACCOUNT.<account>.CLAIMS.LOOKUP`: the stored JWT."""
    token = resolver.fetch(account_key)
    return None if token is None else token.encode()


def _update_error(account: str, reason: str) -> dict[str, Any]:
    return {"error": {"account": account, "code": 500,
                      "description": f"jwt update resulted in error - {reason}"}}


# --------------------------------------------------------------------------
# An account JWT as an AccountConfig


_JWT_RESPONSE_TYPES = {"Singleton": ResponseType.SINGLETON, "Stream": ResponseType.STREAM,
                       "Chunked": ResponseType.CHUNKED}


def _jwt_str(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    return v if isinstance(v, str) else ""


def _jwt_export(e: dict[str, Any]) -> StreamExport | ServiceExport | None:
    subject = _jwt_str(e, "subject")
    if not valid_subject(subject):
        return None
    position = e.get("account_token_position")
    position = position if isinstance(position, int) and not isinstance(position, bool) else 0
    # An export that requires an activation token is private to token holders;
    # Jetraft does not check activation tokens yet, so it admits no one (fail closed).
    accounts = frozenset() if e.get("token_req") is True else None
    if e.get("type") == "service":
        rtype = _JWT_RESPONSE_TYPES.get(_jwt_str(e, "response_type"), ResponseType.SINGLETON)
        return ServiceExport(subject, accounts, rtype, token_position=position,
                             allow_trace=e.get("allow_trace") is True)
    if e.get("type") == "stream":
        return StreamExport(subject, accounts, position)
    return None


def _jwt_import(i: dict[str, Any]) -> StreamImport | ServiceImport | None:
    subject, account = _jwt_str(i, "subject"), _jwt_str(i, "account")
    local = _jwt_str(i, "local_subject") or _jwt_str(i, "to")
    if not valid_subject(subject) or not account or (local and not valid_subject(local)):
        return None
    if i.get("type") == "stream":
        return StreamImport(account, subject, to=local, allow_trace=i.get("allow_trace") is True)
    if i.get("type") == "service":
        return ServiceImport(account, subject, to=local, share=i.get("share") is True)
    return None


def _jwt_mappings(mappings: dict[str, Any]) -> MappingTable:
    table = MappingTable()
    for src, dests in mappings.items():
        if not valid_subject(src) or not isinstance(dests, list):
            continue
        triples = []
        for d in dests:
            if isinstance(d, dict) and isinstance(d.get("subject"), str):
                weight = d.get("weight")
                weight = weight if isinstance(weight, int) and 0 < weight <= 100 else 100
                cluster = d.get("cluster") if isinstance(d.get("cluster"), str) else None
                triples.append((d["subject"], weight, cluster or None))
        try:
            table.add(build_mapping(src, triples))
        except MappingError:
            continue  # nats-server skips a mapping it cannot build and logs it
    return table


def account_config_from_claims(claims: AccountClaims) -> AccountConfig:
    """An account JWT (`node.jwt.AccountClaims`) as an AccountConfig: the
    routing core then treats both modes alike. The account's name is its
    public key, as in nats-server. Entries that do not parse are dropped;
    imports still have to be authorised against the exporter's exports
    (`stream_export_for` / `service_export_for`) when both are known."""
    acc = AccountConfig(claims.key)
    acc.name_tag = claims.claims.name or ""
    for e in claims.exports:
        export = _jwt_export(e)
        if isinstance(export, StreamExport):
            acc.stream_exports.append(export)
        elif isinstance(export, ServiceExport):
            acc.service_exports.append(export)
    for i in claims.imports:
        imp = _jwt_import(i)
        try:
            if isinstance(imp, StreamImport):
                if imp.to and has_wildcard(imp.subject):
                    imp.transform = compile_transform(imp.subject, tokenize_wildcards(imp.to),
                                                      strict=True)
                acc.stream_imports.append(imp)
            elif isinstance(imp, ServiceImport):
                if imp.to and has_wildcard(imp.subject):
                    imp.transform = reverse_transform(compile_transform(
                        imp.subject, tokenize_wildcards(imp.to), strict=True))
                acc.service_imports.append(imp)
        except MappingError:
            continue  # nats-server logs such an import and leaves it out
    acc.mappings = _jwt_mappings(claims.mappings)
    acc.default_permissions = claims.default_permissions
    lim = claims.limits
    acc.limits = AccountLimits(lim.conn, lim.subs, lim.payload, lim.leaf)
    acc.jetstream = _jwt_jetstream(lim)
    acc.msg_trace = _jwt_trace(claims.claims.nats.get("trace"))
    return acc


def _unset(value: int) -> int:
    """nats-server reads a JWT's 0 max_ack_pending / max stream bytes as "no limit"."""
    return value if value != 0 else -1


def _jwt_js_limits(lim: Any, enabled: bool) -> JetStreamLimits:
    return JetStreamLimits(
        enabled=enabled, max_mem=lim.mem_storage, max_file=lim.disk_storage,
        max_streams=lim.streams, max_consumers=lim.consumer,
        max_ack_pending=_unset(lim.max_ack_pending),
        max_bytes_required=lim.max_bytes_required,
        memory_max_stream_bytes=_unset(lim.mem_max_stream_bytes),
        store_max_stream_bytes=_unset(lim.disk_max_stream_bytes))


def _jwt_jetstream(lim: Any) -> JetStreamLimits:
    """The account JWT's JetStream limits. Flat limits with storage win over
    `tiered_limits` (nats-server's order); otherwise any tier with storage enables
    JetStream and the account has only its tiers (a stream's replicas pick one)."""
    if lim.mem_storage != 0 or lim.disk_storage != 0 or not lim.tiered:
        return _jwt_js_limits(lim, lim.mem_storage != 0 or lim.disk_storage != 0)
    enabled = any(t.mem_storage != 0 or t.disk_storage != 0 for t in lim.tiered.values())
    js = JetStreamLimits(enabled=enabled)
    js.tiers = {name: _jwt_js_limits(t, True) for name, t in lim.tiered.items()}
    return js


def _jwt_trace(trace: Any) -> MsgTraceConfig | None:
    """The account JWT's `trace {dest, sampling}` (nats-jwt; sampling 0 or absent = 100).
    One that does not parse is left out, as the other claims here are."""
    if not isinstance(trace, dict):
        return None
    dest = trace.get("dest")
    sampling = trace.get("sampling") or 100
    if not isinstance(dest, str) or not valid_literal_subject(dest) \
            or not isinstance(sampling, int) or not 1 <= sampling <= 100:
        return None
    return MsgTraceConfig(dest, sampling)
