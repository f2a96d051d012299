"""NATS JWTs (operator, account, user) and JWT user authentication.

A NATS JWT is `header.claims.signature`, each part base64url without
padding. The header says `{"typ":"JWT","alg":"ed25519-nkey"}`; the claims
are JSON with the standard `iss`/`sub`/`iat`/`exp`/`nbf`/`jti`/`name` and a
`nats` object typed `operator`, `account` or `user`; the signature is
ed25519 over the first two parts, by the key named in `iss` (an nkey: base32
of a role prefix byte, the 32-byte key and a CRC-16).

Trust runs operator -> account -> user: an operator JWT lists signing keys;
an account JWT must be issued by the operator or one of them; a user JWT by
the account or one of the account's signing keys (then `issuer_account`
names the account; a *scoped* signing key also replaces the user's
permissions by its template). A user proves it holds its key by signing the
server's nonce, unless the JWT is a bearer token.

Pure: decoding and checks take the time (`now`, Unix seconds) as an
argument. Anything malformed, oversized or wrongly signed raises `JWTError`
and nothing else (`tests/unit/test_jwt.py` fuzzes that promise).
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
import ipaddress
import itertools
import json
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import nacl.exceptions
import nacl.signing
import nkeys

from node.options import Permissions
from node.subject import valid_subject

# A user JWT travels in CONNECT, which max_control_line bounds (4 KiB by
# default); account JWTs arrive in claim updates. 1 MiB bounds both.
MAX_JWT_BYTES = 1024 * 1024
ALGORITHM = "ed25519-nkey"
UNLIMITED = -1

PREFIX_OPERATOR = nkeys.PREFIX_BYTE_OPERATOR
PREFIX_ACCOUNT = nkeys.PREFIX_BYTE_ACCOUNT
PREFIX_USER = nkeys.PREFIX_BYTE_USER
_ROLE_PREFIX = {"O": PREFIX_OPERATOR, "A": PREFIX_ACCOUNT, "U": PREFIX_USER}
_PUBLIC_KEY_CHARS = 56  # base32 of 1 + 32 + 2 bytes


class JWTError(ValueError):
    """A JWT that cannot be used; str() says why (for the log, not the client)."""


class AuthError(JWTError):
    """A user that presented a decodable JWT but may not connect."""


# --------------------------------------------------------------------------
# nkeys


def decode_public_key(key: str, prefix: int) -> bytes:
    """The raw ed25519 key of a public nkey of the given role; JWTError if
    the text is not one (wrong role, bad base32, bad CRC)."""
    if not isinstance(key, str) or len(key) != _PUBLIC_KEY_CHARS or not key.isascii():
        raise JWTError(f"not a public nkey: {key!r:.80}")
    try:
        raw = base64.b32decode(key)
    except (binascii.Error, ValueError):
        raise JWTError(f"not a public nkey: {key!r:.80}") from None
    body, crc = raw[:-2], raw[-2:]
    if nkeys.crc16_checksum(body) != crc:
        raise JWTError(f"nkey checksum mismatch: {key!r:.80}")
    if body[0] != prefix:
        raise JWTError(f"nkey {key!r:.80} has the wrong role")
    return bytes(body[1:])


def is_public_key(key: str, role: bytes) -> bool:
    """A well-formed public nkey of the role "O", "A" or "U"."""
    try:
        decode_public_key(key, _ROLE_PREFIX[role.decode()])
    except JWTError:
        return False
    return True


def verify_signature(public_key: str, prefix: int, data: bytes, signature: bytes) -> bool:
    raw = decode_public_key(public_key, prefix)
    try:
        nacl.signing.VerifyKey(raw).verify(data, signature)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, ValueError):
        return False
    return True


def _b64decode(text: str) -> bytes:
    """base64url without padding (what NATS writes), or with it."""
    if not text.isascii():
        raise JWTError("invalid base64")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise JWTError("invalid base64") from None


def verify_nonce(user_key: str, nonce: bytes, sig: str) -> bool:
    """Did the holder of `user_key` sign `nonce`? `sig` as the client sent
    it in CONNECT: base64url (nats clients) or standard base64."""
    if not isinstance(sig, str) or not sig or len(sig) > 256:
        return False
    candidates = [sig, sig.replace("+", "-").replace("/", "_")]
    for text in candidates:
        try:
            raw = _b64decode(text.rstrip("="))
        except JWTError:
            continue
        if len(raw) == 64:
            return verify_signature(user_key, PREFIX_USER, nonce, raw)
    return False


# --------------------------------------------------------------------------
# Decoding


@dataclass(frozen=True)
class Claims:
    """The fields every NATS JWT has, and its `nats` object."""

    token: str
    kind: str  # "operator" | "account" | "user"
    issuer: str
    subject: str
    name: str
    issued_at: int
    expires: int  # 0: never
    not_before: int  # 0: always
    jti: str
    nats: dict[str, Any]

    def check_time(self, now: float) -> None:
        if self.expires and now >= self.expires:
            raise JWTError(f"{self.kind} JWT expired")
        if self.not_before and now < self.not_before:
            raise JWTError(f"{self.kind} JWT not yet valid")


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        raise JWTError(f"{what} is not JSON") from None
    if not isinstance(value, dict):
        raise JWTError(f"{what} is not a JSON object")
    return value


def _get(d: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    """d[key] if present and of the right JSON type, the default if absent."""
    v = d.get(key)
    if v is None:
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # JSON true is a Python int; never accept it where a number is due.
    if (isinstance(v, bool) and bool not in kinds) or not isinstance(v, kinds):
        raise JWTError(f"claim {key!r} has the wrong type")
    return v


def decode(token: str, max_bytes: int = MAX_JWT_BYTES, activation: bool = False) -> Claims:
    """Split, parse and verify the signature of any NATS JWT (an activation
    token only when asked for: node/activation.py)."""
    if not isinstance(token, str):
        raise JWTError("JWT is not text")
    token = token.strip()
    if len(token) > max_bytes:
        raise JWTError(f"JWT larger than {max_bytes} bytes")
    parts = token.split(".")
    if len(parts) != 3:
        raise JWTError("expected 3 chunks")  # the nats jwt library's words
    header = _json_object(_b64decode(parts[0]), "JWT header")
    if header.get("alg") != ALGORITHM or str(header.get("typ", "")).upper() != "JWT":
        raise JWTError(f"unsupported JWT header {header!r:.200}")
    payload = _json_object(_b64decode(parts[1]), "JWT claims")
    claims = _claims(token, payload, activation)
    signature = _b64decode(parts[2])
    prefix = _ROLE_PREFIX.get(claims.issuer[:1])
    if prefix is None or len(signature) != 64:
        raise JWTError("JWT issuer or signature malformed")
    signed = f"{parts[0]}.{parts[1]}".encode()
    if not verify_signature(claims.issuer, prefix, signed, signature):
        raise JWTError("JWT signature does not verify")
    return claims


def _claims(token: str, payload: dict[str, Any], activation: bool = False) -> Claims:
    nats = _get(payload, "nats", dict, {})
    kind = _get(nats, "type", str, "")
    if kind not in ("operator", "account", "user") and not (activation and kind == "activation"):
        raise JWTError(f"unknown JWT type {kind!r:.40}")
    version = _get(nats, "version", int, 0)
    if version != 2:
        raise JWTError(f"unsupported JWT version {version}")
    return Claims(
        token=token, kind=kind,
        issuer=_get(payload, "iss", str, ""), subject=_get(payload, "sub", str, ""),
        name=_get(payload, "name", str, ""), issued_at=_get(payload, "iat", int, 0),
        expires=_get(payload, "exp", int, 0), not_before=_get(payload, "nbf", int, 0),
        jti=_get(payload, "jti", str, ""), nats=nats)


def _expect(claims: Claims, kind: str, issuer_roles: str, subject_role: str) -> Claims:
    if claims.kind != kind:
        raise JWTError(f"not {kind} claim")
    if claims.issuer[:1] not in issuer_roles:
        raise JWTError(f"{kind} JWT issued by a {claims.issuer[:1]!r} key")
    decode_public_key(claims.subject, _ROLE_PREFIX[subject_role])
    return claims


# --------------------------------------------------------------------------
# Typed claims


def _subjects(side: Any, key: str) -> list[str] | None:
    if not isinstance(side, dict):
        return None
    items = _get(side, key, list, None)
    if items is None:
        return None
    if not all(isinstance(s, str) for s in items):
        raise JWTError(f"permission {key!r} must list subjects")
    return list(items)


@dataclass(frozen=True)
class ResponsePermission:
    max_msgs: int
    expires_seconds: float


def _permissions(d: dict[str, Any]) -> tuple[Permissions | None, ResponsePermission | None]:
    pub, sub, resp = d.get("pub"), d.get("sub"), d.get("resp")
    perms = Permissions(
        publish_allow=_subjects(pub, "allow"), publish_deny=_subjects(pub, "deny"),
        subscribe_allow=_subjects(sub, "allow"), subscribe_deny=_subjects(sub, "deny"))
    response = None
    if isinstance(resp, dict):
        response = ResponsePermission(_get(resp, "max", int, 1),
                                      _get(resp, "ttl", int, 0) / 1e9)
        perms.allow_responses = True
        if perms.publish_allow is None:
            # As nats-server: response permission turns the blanket publish allow off.
            perms.publish_allow = []
    if perms == Permissions():
        return None, None
    return perms, response


@dataclass(frozen=True)
class OperatorClaims:
    claims: Claims
    signing_keys: frozenset[str]
    system_account: str
    strict_signing_key_usage: bool

    @property
    def key(self) -> str:
        return self.claims.subject

    def trusts(self, issuer: str) -> bool:
        if self.strict_signing_key_usage:
            return issuer in self.signing_keys
        return issuer == self.key or issuer in self.signing_keys


def decode_operator(token: str) -> OperatorClaims:
    c = _expect(decode(token), "operator", "O", "O")
    keys = frozenset(_key_list(c.nats.get("signing_keys"), PREFIX_OPERATOR))
    # Like nats-server, any operator key may have signed it: the config file,
    # not the signature, makes an operator trusted.
    system = _get(c.nats, "system_account", str, "")
    if system:
        decode_public_key(system, PREFIX_ACCOUNT)
    return OperatorClaims(c, keys, system, _get(c.nats, "strict_signing_key_usage", bool, False))


def _key_list(value: Any, prefix: int) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise JWTError("signing_keys must be a list")
    keys = []
    for item in value:
        key = item.get("key") if isinstance(item, dict) else item
        decode_public_key(key, prefix)
        keys.append(key)
    return keys


@dataclass(frozen=True)
class UserScope:
    """A scoped signing key: users it signs get these permissions."""

    key: str
    role: str
    permissions: Permissions | None
    response: ResponsePermission | None
    template: dict[str, Any]


@dataclass(frozen=True)
class AccountJWTLimits:
    subs: int = UNLIMITED
    conn: int = UNLIMITED
    leaf: int = UNLIMITED
    payload: int = UNLIMITED
    data: int = UNLIMITED
    imports: int = UNLIMITED
    exports: int = UNLIMITED
    wildcards: bool = True
    disallow_bearer: bool = False
    mem_storage: int = 0  # JetStream: 0 disables, -1 unlimited
    disk_storage: int = 0
    streams: int = UNLIMITED
    consumer: int = UNLIMITED
    max_ack_pending: int = UNLIMITED
    mem_max_stream_bytes: int = 0  # 0: none
    disk_max_stream_bytes: int = 0
    max_bytes_required: bool = False
    # `tiered_limits`: tier name ("R1", "R3") -> that tier's JetStream limits; a JWT with
    # tiers carries no flat JetStream limits (nats-jwt refuses both at once)
    tiered: dict[str, JetStreamJWTLimits] = field(default_factory=dict)


@dataclass(frozen=True)
class JetStreamJWTLimits:
    """One tier of `tiered_limits`, with nats-jwt's field names; an absent field is 0."""

    mem_storage: int = 0
    disk_storage: int = 0
    streams: int = 0
    consumer: int = 0
    max_ack_pending: int = 0
    mem_max_stream_bytes: int = 0
    disk_max_stream_bytes: int = 0
    max_bytes_required: bool = False


_LIMIT_INTS = ("subs", "conn", "leaf", "payload", "data", "imports", "exports", "mem_storage",
               "disk_storage", "streams", "consumer", "max_ack_pending", "mem_max_stream_bytes",
               "disk_max_stream_bytes")
_JS_TIER_INTS = ("mem_storage", "disk_storage", "streams", "consumer", "max_ack_pending",
                 "mem_max_stream_bytes", "disk_max_stream_bytes")


def _tiered_limits(value: Any) -> dict[str, JetStreamJWTLimits]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise JWTError("tiered_limits must map tier names to limits")
    return {name: JetStreamJWTLimits(
        **{k: _get(tier, k, int, 0) for k in _JS_TIER_INTS},
        max_bytes_required=_get(tier, "max_bytes_required", bool, False))
        for name, tier in value.items()}


def _account_limits(d: Any) -> AccountJWTLimits:
    if not isinstance(d, dict):
        return AccountJWTLimits()
    values: dict[str, Any] = {k: _get(d, k, int, getattr(AccountJWTLimits, k))
                              for k in _LIMIT_INTS}
    values["wildcards"] = _get(d, "wildcards", bool, True)
    values["disallow_bearer"] = _get(d, "disallow_bearer", bool, False)
    values["max_bytes_required"] = _get(d, "max_bytes_required", bool, False)
    values["tiered"] = _tiered_limits(d.get("tiered_limits"))
    return AccountJWTLimits(**values)


@dataclass(frozen=True)
class AccountClaims:
    claims: Claims
    signing_keys: frozenset[str]
    scopes: dict[str, UserScope]
    revocations: dict[str, int]
    limits: AccountJWTLimits
    default_permissions: Permissions | None
    imports: tuple[dict[str, Any], ...]
    exports: tuple[dict[str, Any], ...]
    mappings: dict[str, Any]

    @property
    def key(self) -> str:
        return self.claims.subject

    def revoked(self, user_key: str, issued_at: int) -> bool:
        """Revocations name a user key (or "*" for all) and a time: JWTs
        issued at or before it are revoked."""
        for k in (user_key, "*"):
            ts = self.revocations.get(k)
            if ts is not None and issued_at <= ts:
                return True
        return False


def _scopes(value: Any) -> dict[str, UserScope]:
    scopes: dict[str, UserScope] = {}
    for item in value if isinstance(value, list) else []:
        if isinstance(item, dict) and item.get("kind") == "user_scope":
            template = _get(item, "template", dict, {})
            perms, resp = _permissions(template)
            key = _get(item, "key", str, "")
            scopes[key] = UserScope(key, _get(item, "role", str, ""), perms, resp, template)
    return scopes


def _revocations(value: Any) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
        raise JWTError("revocations must map keys to times")
    return dict(value)


def _dict_list(value: Any, what: str) -> tuple[dict[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise JWTError(f"{what} must be a list of objects")
    return tuple(value)


def decode_account(token: str) -> AccountClaims:
    c = _expect(decode(token), "account", "O", "A")
    nats = c.nats
    default = _get(nats, "default_permissions", dict, {})
    return AccountClaims(
        claims=c,
        signing_keys=frozenset(_key_list(nats.get("signing_keys"), PREFIX_ACCOUNT)),
        scopes=_scopes(nats.get("signing_keys")),
        revocations=_revocations(nats.get("revocations")),
        limits=_account_limits(nats.get("limits")),
        default_permissions=_permissions(default)[0],
        imports=_dict_list(nats.get("imports"), "imports"),
        exports=_dict_list(nats.get("exports"), "exports"),
        mappings=_get(nats, "mappings", dict, {}))


@dataclass(frozen=True)
class TimeRange:
    start: _dt.time
    end: _dt.time


@dataclass(frozen=True)
class UserClaims:
    claims: Claims
    issuer_account: str
    permissions: Permissions | None
    response: ResponsePermission | None
    src: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
    times: tuple[TimeRange, ...]
    times_location: str
    subs: int
    data: int
    payload: int
    bearer_token: bool
    allowed_connection_types: frozenset[str]
    tags: tuple[str, ...]

    @property
    def key(self) -> str:
        return self.claims.subject

    @property
    def account_key(self) -> str:
        return self.issuer_account or self.claims.issuer


def _networks(value: Any) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    items = value.split(",") if isinstance(value, str) else value or []
    if not isinstance(items, list):
        raise JWTError("src must list CIDRs")
    nets = []
    for item in items:
        if not isinstance(item, str):
            raise JWTError("src must list CIDRs")
        try:
            nets.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError:
            raise JWTError(f"bad CIDR in src: {item!r:.60}") from None
    return tuple(nets)


def _clock(text: Any) -> _dt.time:
    try:
        return _dt.datetime.strptime(text, "%H:%M:%S").time()
    except (TypeError, ValueError):
        raise JWTError(f"bad time of day {text!r:.40}") from None


def _times(value: Any) -> tuple[TimeRange, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise JWTError("times must be a list of {start, end}")
    return tuple(TimeRange(_clock(v.get("start")), _clock(v.get("end"))) for v in value)


def _user_limits(c: Claims, nats: dict[str, Any], issuer_account: str) -> UserClaims:
    perms, resp = _permissions(nats)
    types = _get(nats, "allowed_connection_types", list, [])
    tags = _get(nats, "tags", list, [])
    return UserClaims(
        claims=c, issuer_account=issuer_account, permissions=perms, response=resp,
        src=_networks(nats.get("src")), times=_times(nats.get("times")),
        times_location=_get(nats, "times_location", str, ""),
        subs=_get(nats, "subs", int, UNLIMITED), data=_get(nats, "data", int, UNLIMITED),
        payload=_get(nats, "payload", int, UNLIMITED),
        bearer_token=_get(nats, "bearer_token", bool, False),
        allowed_connection_types=frozenset(str(t).upper() for t in types),
        tags=tuple(str(t) for t in tags))


# What a user signed by a scoped key must leave empty: the scope decides.
_SCOPED_FIELDS = ("pub", "sub", "resp", "src", "times", "times_location", "subs", "data",
                  "payload", "bearer_token", "allowed_connection_types")


def decode_user(token: str, max_bytes: int = MAX_JWT_BYTES) -> UserClaims:
    c = _expect(decode(token, max_bytes), "user", "A", "U")
    issuer_account = _get(c.nats, "issuer_account", str, "")
    if issuer_account:
        decode_public_key(issuer_account, PREFIX_ACCOUNT)
    return _user_limits(c, c.nats, issuer_account)


def apply_scope(user: UserClaims, scope: UserScope, account: AccountClaims) -> UserClaims:
    """A user signed by a scoped key: its own claims must be empty, and the
    scope's template supplies permissions (macros expanded) and limits."""
    if any(user.claims.nats.get(k) not in (None, 0, "", [], {}, False) for k in _SCOPED_FIELDS):
        raise AuthError("user JWT signed by a scoped key must not carry permissions or limits")
    template = _expand_template(dict(scope.template), user, account)
    template.setdefault("subs", UNLIMITED)
    template.setdefault("data", UNLIMITED)
    template.setdefault("payload", UNLIMITED)
    scoped = _user_limits(user.claims, template, user.issuer_account)
    return replace(scoped, tags=user.tags)


# --------------------------------------------------------------------------
# Scope templates: {{name()}}, {{subject()}}, {{account-name()}},
# {{account-subject()}}, {{tag(k)}}, {{account-tag(k)}} in permission subjects


def _is_macro(token: str) -> bool:
    return token.startswith("{{") and token.endswith("}}")


def _macro_value(op: str, user: UserClaims, account: AccountClaims) -> str | list[str]:
    """A macro's text, or for tag macros the list of values (maybe empty)."""
    fixed = {"name()": user.claims.name, "subject()": user.key,
             "account-name()": account.claims.name, "account-subject()": user.issuer_account}
    if op in fixed:
        return fixed[op]
    for prefix, tags in (("account-tag(", _str_list(account.claims.nats.get("tags"))),
                         ("tag(", list(user.tags))):
        if op.startswith(prefix) and op.endswith(")"):
            key = op[len(prefix):-1].lower() + ":"
            return [t[len(key):] for t in tags if t.startswith(key)]
    # nats-server 2.15 refuses the login over an unknown macro, in any list.
    raise AuthError(f"user JWT generated invalid permissions: unknown macro {op!r:.40}")


def _str_list(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _expand_subject(subject: str, user: UserClaims, account: AccountClaims) -> list[str]:
    tokens: list[str] = []
    value_lists: list[list[str]] = []
    for token in subject.split("."):
        if not _is_macro(token):
            tokens.append(token)
            continue
        value = _macro_value(token[2:-2].lower(), user, account)
        if isinstance(value, list):
            tokens.append("")  # a placeholder, filled below (left empty: invalid)
            if value:
                value_lists.append(value)
        else:
            tokens.append(value)
    combos = itertools.product(*value_lists) if value_lists else [()]
    out = []
    for combo in combos:
        values = iter(combo)
        out.append(".".join(next(values, "") if t == "" else t for t in tokens))
    return out


def _expand_list(subjects: list[str], user: UserClaims, account: AccountClaims,
                 fail_on_bad: bool) -> list[str]:
    if not any(_is_macro(t) for s in subjects for t in s.split(".")):
        return subjects
    out = []
    for subject in subjects:
        for candidate in _expand_subject(subject, user, account):
            if valid_subject(candidate):
                out.append(candidate)
            elif fail_on_bad:
                raise AuthError("user JWT generated invalid permissions")
    return out


def _expand_template(template: dict[str, Any], user: UserClaims,
                     account: AccountClaims) -> dict[str, Any]:
    """nats-server's expansion: bad allow entries are dropped, a bad deny
    entry refuses the login, and an allow list emptied by expansion becomes
    a deny of everything."""
    for side in ("pub", "sub"):
        perm = template.get(side)
        if not isinstance(perm, dict):
            continue
        perm = dict(perm)
        allow, deny = _str_list(perm.get("allow")), _str_list(perm.get("deny"))
        new_allow = _expand_list(allow, user, account, fail_on_bad=False)
        new_deny = _expand_list(deny, user, account, fail_on_bad=True)
        if allow and not new_allow:
            new_deny = [*new_deny, ">"]
        perm["allow"], perm["deny"] = new_allow or None, new_deny or None
        template[side] = perm
    return template


# --------------------------------------------------------------------------
# Authentication


@dataclass(frozen=True)
class JWTIdentity:
    """Who a JWT user is once authenticated: what auth hands the account."""

    user_key: str
    name: str
    account_key: str
    permissions: Permissions | None
    response: ResponsePermission | None
    max_subscriptions: int
    max_data: int
    max_payload: int
    expires: int  # 0: never; the connection must close then
    tags: tuple[str, ...] = field(default=())


class TrustAnchor(Protocol):
    """An OperatorClaims, or resolver.OperatorConfig (several operators)."""

    def trusts(self, issuer: str) -> Any: ...


def check_account(account: AccountClaims, operator: TrustAnchor, now: float) -> None:
    """May this account JWT be used under this operator at `now`?"""
    if not operator.trusts(account.claims.issuer):
        raise AuthError("account JWT not issued by a trusted operator key")
    account.claims.check_time(now)


def _in_times(ranges: tuple[TimeRange, ...], location: str, now: float) -> bool:
    if not ranges:
        return True
    try:
        tz: _dt.tzinfo = zoneinfo.ZoneInfo(location) if location else _dt.UTC
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False  # fail closed: a window we cannot place admits no one
    clock = _dt.datetime.fromtimestamp(now, tz).time()
    for r in ranges:
        if r.start <= r.end and r.start <= clock <= r.end:
            return True
        if r.start > r.end and (clock >= r.start or clock <= r.end):  # spans midnight
            return True
    return False


def _in_src(nets: tuple[Any, ...], client_ip: str | None) -> bool:
    if not nets:
        return True
    if client_ip is None:
        return False
    try:
        ip = ipaddress.ip_address(client_ip)
    except ValueError:
        return False
    return any(ip in n for n in nets if n.version == ip.version)


def authenticate_user(
    user_jwt: str,
    signature: str | None,
    nonce: bytes,
    *,
    operator: TrustAnchor,
    lookup_account: Callable[[str], AccountClaims | None],
    now: float,
    client_ip: str | None,
    connection_type: str = "STANDARD",
    max_jwt_bytes: int = MAX_JWT_BYTES,
) -> tuple[JWTIdentity, AccountClaims]:
    """Check a CONNECT's `jwt` and `sig` against the nonce the server sent.

    Returns the identity and the user's account; raises AuthError (or
    JWTError for a malformed JWT): the caller answers
    `-ERR 'Authorization Violation'` and closes."""
    user = decode_user(user_jwt, max_jwt_bytes)
    user.claims.check_time(now)
    account = lookup_account(user.account_key)
    if account is None:
        raise AuthError(f"account {user.account_key} not found")
    check_account(account, operator, now)
    user = _effective_user(user, account)
    _check_user(user, account, signature, nonce, now, client_ip, connection_type)
    perms, response = user.permissions, user.response
    if perms is None:
        perms = account.default_permissions
    identity = JWTIdentity(
        user_key=user.key, name=user.claims.name, account_key=account.key,
        permissions=perms, response=response, max_subscriptions=user.subs,
        max_data=user.data, max_payload=user.payload,
        expires=min((e for e in (user.claims.expires, account.claims.expires) if e), default=0),
        tags=user.tags)
    return identity, account


def _effective_user(user: UserClaims, account: AccountClaims) -> UserClaims:
    """The user as the account's keys allow it: issuer checks, and a scoped
    signing key's template in place of the user's own limits."""
    issuer = user.claims.issuer
    if issuer != account.key and issuer not in account.signing_keys:
        raise AuthError("user JWT issuer is not the account nor one of its signing keys")
    if user.issuer_account and user.issuer_account != account.key:
        raise AuthError("user JWT issuer_account does not match its account")
    if issuer != account.key and not user.issuer_account:
        raise AuthError("user JWT signed by a signing key must name issuer_account")
    scope = account.scopes.get(issuer)
    return user if scope is None else apply_scope(user, scope, account)


def _check_user(user: UserClaims, account: AccountClaims, signature: str | None, nonce: bytes,
                now: float, client_ip: str | None, connection_type: str) -> None:
    if account.revoked(user.key, user.claims.issued_at):
        raise AuthError("user JWT revoked")
    if user.bearer_token:
        if account.limits.disallow_bearer:
            raise AuthError("bearer tokens not allowed by the account")
    elif not verify_nonce(user.key, nonce, signature or ""):
        raise AuthError("nonce signature does not verify")
    if user.allowed_connection_types and connection_type not in user.allowed_connection_types:
        raise AuthError(f"connection type {connection_type} not allowed")
    if not _in_src(user.src, client_ip):
        raise AuthError(f"client address {client_ip} not in the allowed src CIDRs")
    if not _in_times(user.times, user.times_location, now):
        raise AuthError("outside the user's allowed connect times")
