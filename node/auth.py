"""Client authentication and subject permissions, as pure logic.

`Authenticator` checks a decoded CONNECT against the configured users
(single user/password, token, a `users` list with plain or bcrypt passwords,
nkey users that sign the INFO nonce, `no_auth_user`). It returns an
`Identity` whose `PermissionSet` the client connection consults on every
PUB and SUB. Nothing here touches a socket or a clock: time is passed in.

Matching follows nats-server exactly, including its quirks:
- a SUB subject's wildcard tokens are treated as literal tokens, so `*` in an
  allow/deny pattern matches a `*` or `>` token of the SUB subject;
- queue entries (`"subject queue"`) only decide queue subscriptions; in an
  allow list they override the plain result when one matches the subject,
  while a plain deny entry denies the subject for every queue group;
- allow then deny (deny wins), for publish and subscribe.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import bcrypt
import nacl.exceptions
import nacl.signing
import nkeys

from node.account import GLOBAL_ACCOUNT
from node.options import Options, Permissions, User

if TYPE_CHECKING:
    from node.accountconf import AccountUser

# Error texts sent as `-ERR '<text>'`, identical to nats-server 2.x.
AUTH_VIOLATION = "Authorization Violation"
AUTH_TIMEOUT = "Authentication Timeout"
AUTH_EXPIRED = "User Authentication Expired"

# allow_responses: true means at most one response per request, within 2 min.
RESPONSE_MAX_MSGS = 1
RESPONSE_EXPIRES = 120.0

_PUB_CACHE_MAX = 1024  # memoised publish decisions per connection
_REPLIES_MAX = 4096  # tracked reply subjects per connection
_BCRYPT_CACHE_MAX = 4096  # verified (hash, password) digests
_NONCE_BYTES = 11  # 15 base64url characters, like nats-server


def pub_violation(subject: str) -> str:
    return f'Permissions Violation for Publish to "{subject}"'


def sub_violation(subject: str, queue: str | None = None) -> str:
    if queue:
        return f'Permissions Violation for Subscription to "{subject}" using queue "{queue}"'
    return f'Permissions Violation for Subscription to "{subject}"'


# --------------------------------------------------------------------------- matching

Tokens = tuple[str, ...]


def _covers(pattern: Tokens, tokens: Tokens) -> bool:
    """True when `pattern` matches `tokens`, the way nats-server's sublist
    matches a subject: wildcard tokens of `tokens` are plain literals here."""
    for i, p in enumerate(pattern):
        if p == ">":
            return len(tokens) > i
        if i >= len(tokens) or (p != "*" and p != tokens[i]):
            return False
    return len(pattern) == len(tokens)


def _is_subset(tokens: Tokens, pattern: Tokens) -> bool:
    """True when every subject `tokens` can stand for is matched by `pattern`
    (nats-server's subjectIsSubsetMatch, used for queue names)."""
    for i, p in enumerate(pattern):
        if i >= len(tokens) or not p:
            return False
        if p == ">":
            return True
        t = tokens[i]
        if not t or t == ">":
            return False
        if t == "*":
            if p != "*":
                return False
            continue
        if p != "*" and p != t:
            return False
    return len(tokens) == len(pattern)


def _split_entry(entry: str) -> tuple[Tokens, str | None]:
    """Split a subscribe permission `"subject [queue]"` into tokens and queue."""
    fields = entry.split()
    if not fields or len(fields) > 2:
        raise ValueError(f"invalid subscribe permission {entry!r}")
    queue = fields[1] if len(fields) == 2 else None
    return tuple(fields[0].split(".")), queue


def _queue_matches(queue: str, queues: list[str]) -> bool:
    qtoks = tuple(queue.split("."))
    for name in queues:
        has_wc = any(t in ("*", ">") for t in name.split("."))
        if queue == name or (has_wc and _is_subset(qtoks, tuple(name.split(".")))):
            return True
    return False


class _SubList:
    """A compiled subscribe allow or deny list: plain and queue entries."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.plain: list[Tokens] = []
        self.queued: list[tuple[Tokens, str]] = []
        for entry in entries:
            tokens, queue = _split_entry(entry)
            if queue is None:
                self.plain.append(tokens)
            else:
                self.queued.append((tokens, queue))

    def match(self, tokens: Tokens) -> tuple[bool, list[str]]:
        """(does a plain entry match, queue names of matching queue entries)."""
        plain = any(_covers(p, tokens) for p in self.plain)
        queues = [q for p, q in self.queued if _covers(p, tokens)]
        return plain, queues


def _compile_pub(entries: list[str] | None) -> list[Tokens] | None:
    if entries is None:
        return None
    return [tuple(e.strip().split(".")) for e in entries]


@dataclass(frozen=True)
class CompiledPermissions:
    """One user's permissions, parsed once and shared by its connections."""

    pub_allow: list[Tokens] | None
    pub_deny: list[Tokens] | None
    sub_allow: _SubList | None
    sub_deny: _SubList | None
    responses: bool
    source: Permissions | None = None  # as configured ($SYS.REQ.USER.INFO shows it)
    response_max: int = RESPONSE_MAX_MSGS  # <= 0: any number of replies
    response_expires: float = RESPONSE_EXPIRES  # <= 0: the grant never expires

    @classmethod
    def build(cls, perms: Permissions) -> CompiledPermissions:
        pub_allow = perms.publish_allow
        if perms.allow_responses and pub_allow is None:
            # nats-server: response permissions turn off the blanket publish allow.
            pub_allow = []
        # An empty subscribe allow list means "no restriction" in nats-server.
        sub_allow = _SubList(perms.subscribe_allow) if perms.subscribe_allow else None
        sub_deny = _SubList(perms.subscribe_deny) if perms.subscribe_deny else None
        return cls(
            pub_allow=_compile_pub(pub_allow),
            pub_deny=_compile_pub(perms.publish_deny or None),
            sub_allow=sub_allow,
            sub_deny=sub_deny,
            responses=perms.allow_responses,
            source=perms,
            response_max=perms.response_max,
            response_expires=perms.response_expires,
        )


class PermissionSet:
    """Per-connection permission checks (a cache and reply tracking are per
    connection, so every authenticated connection gets its own instance)."""

    def __init__(self, compiled: CompiledPermissions) -> None:
        self._c = compiled
        self._pub_cache: dict[str, bool] = {}
        # reply subject -> [time noted, responses sent]
        self._replies: dict[str, list[float]] = {}

    @property
    def source(self) -> Permissions | None:
        return self._c.source

    @property
    def tracks_replies(self) -> bool:
        """True when the client must call `note_reply` for delivered requests."""
        return self._c.responses

    def can_publish(self, subject: str, now: float | None = None) -> bool:
        """May this connection publish to `subject`? `now` (seconds, any
        monotonic clock also given to `note_reply`) enables response expiry."""
        c = self._c
        if c.pub_allow is None and c.pub_deny is None:
            return True
        cached = self._pub_cache.get(subject)
        if cached is not None:
            return cached
        tokens = tuple(subject.split("."))
        allowed = True
        if c.pub_allow is not None:
            allowed = any(_covers(p, tokens) for p in c.pub_allow)
        if allowed and c.pub_deny is not None:
            allowed = not any(_covers(p, tokens) for p in c.pub_deny)
        if not allowed and c.responses:
            # A reply grant is single-use: never memoise the outcome.
            return self._use_reply(subject, now)
        if len(self._pub_cache) >= _PUB_CACHE_MAX:
            self._pub_cache.clear()
        self._pub_cache[subject] = allowed
        return allowed

    def _use_reply(self, subject: str, now: float | None) -> bool:
        entry = self._replies.get(subject)
        if entry is None:
            return False
        entry[1] += 1
        c = self._c
        expired = now is not None and 0 < c.response_expires < now - entry[0]
        if 0 < c.response_max < entry[1] or expired:
            del self._replies[subject]
            return False
        return True

    def note_reply(self, reply: str, now: float) -> None:
        """Record that a message with reply subject `reply` was delivered to
        this connection, granting it `response_max` publishes there."""
        if not self._c.responses:
            return
        if len(self._replies) >= _REPLIES_MAX:
            self._prune_replies(now)
        self._replies[reply] = [now, 0]

    def _prune_replies(self, now: float) -> None:
        ttl = self._c.response_expires if self._c.response_expires > 0 else float("inf")
        for key in [k for k, (t, _) in self._replies.items() if now - t > ttl]:
            del self._replies[key]
        while len(self._replies) >= _REPLIES_MAX:
            # Dicts keep insertion order: drop the oldest grant.
            del self._replies[next(iter(self._replies))]

    def can_subscribe(self, subject: str, queue: str | None = None) -> bool:
        c = self._c
        tokens = tuple(subject.split("."))
        allowed = True
        if c.sub_allow is not None:
            allowed, queues = c.sub_allow.match(tokens)
            if queue and queues:
                allowed = _queue_matches(queue, queues)
        if allowed and c.sub_deny is not None:
            denied, queues = c.sub_deny.match(tokens)
            # Unlike allow, a plain deny entry also denies every queue group.
            allowed = not denied and not (queue and queues and _queue_matches(queue, queues))
        return allowed

    def can_deliver(self, subject: str) -> bool:
        """False when a message on `subject` hits a plain subscribe deny entry.
        A wildcard SUB may be allowed yet overlap a deny entry (SUB foo.* with
        deny foo.x): nats-server then drops such messages at delivery."""
        deny = self._c.sub_deny
        if deny is None or not deny.plain:
            return True
        tokens = tuple(subject.split("."))
        return not any(_covers(p, tokens) for p in deny.plain)


# --------------------------------------------------------------------------- identity

# Connection types a user may be limited to (`allowed_connection_types`).
CONN_STANDARD = "STANDARD"
CONN_WEBSOCKET = "WEBSOCKET"
CONNECTION_TYPES = frozenset({CONN_STANDARD, CONN_WEBSOCKET, "LEAFNODE", "LEAFNODE_WS", "MQTT",
                              "MQTT_WS", "IN_PROCESS"})


@dataclass
class Identity:
    """Who a connection is: its user, the account it lives in, what it may do."""

    user: str | None
    account: str = GLOBAL_ACCOUNT
    permissions: PermissionSet | None = None  # None: everything allowed
    # Operator mode (node/operatorauth.py): when the JWT expires (epoch seconds,
    # 0 = never) and the user's own limits (-1 = none).
    expires: float = 0.0
    max_subscriptions: int = -1
    max_payload: int = -1
    # Operator mode: runs the login's checks again (after an account JWT update).
    recheck: Callable[[], bool] | None = None

    @property
    def name(self) -> str | None:
        return self.user


@dataclass(frozen=True)
class _Account:
    """A configured user, with its compiled permissions."""

    name: str | None
    password: str | None
    nkey: str | None
    perms: CompiledPermissions | None
    conn_types: frozenset[str] | None = None  # None: every connection type
    account: str = GLOBAL_ACCOUNT

    def identity(self) -> Identity:
        perms = PermissionSet(self.perms) if self.perms is not None else None
        return Identity(user=self.name or self.nkey, account=self.account, permissions=perms)

    def allows(self, conn_type: str) -> bool:
        return self.conn_types is None or conn_type in self.conn_types


def _account(user: User, default: Permissions | None) -> _Account:
    # nats-server: default_permissions apply to every listed user without its own.
    perms = user.permissions if user.permissions is not None else default
    compiled = CompiledPermissions.build(perms) if perms else None
    types = frozenset(t.upper() for t in user.allowed_connection_types) \
        if user.allowed_connection_types else None
    return _Account(user.user, user.password, user.nkey, compiled, types)


def _account_user(user: AccountUser) -> _Account:
    """A user of an `accounts {}` block (its account's default_permissions
    were applied when the block was read)."""
    perms = user.permissions
    compiled = CompiledPermissions.build(perms) if perms else None
    types = frozenset(t.upper() for t in user.allowed_connection_types) \
        if user.allowed_connection_types else None
    return _Account(user.user, user.password, user.nkey, compiled, types, user.account)


def _is_bcrypt(secret: str) -> bool:
    return secret.startswith(("$2a$", "$2b$", "$2y$"))


def _decode_sig(sig: str) -> bytes | None:
    """nats.go sends raw base64url, nats-py padded standard base64: accept both."""
    for decode in (base64.urlsafe_b64decode, base64.b64decode):
        try:
            return decode(sig + "=" * (-len(sig) % 4))
        except (binascii.Error, ValueError):
            continue
    return None


def _user_verify_key(public: str) -> nacl.signing.VerifyKey | None:
    """Decode a public user nkey ("U..."), checking prefix and CRC16."""
    try:
        raw = base64.b32decode(public + "=" * (-len(public) % 8))
    except (binascii.Error, ValueError):
        return None
    if len(raw) != 35 or raw[0] != nkeys.PREFIX_BYTE_USER:
        return None
    if nkeys.crc16_checksum(raw[:-2]) != raw[-2:]:
        return None
    return nacl.signing.VerifyKey(raw[1:33])


def verify_nkey(public: str, nonce: str, sig: str) -> bool:
    """True when `sig` is `public`'s ed25519 signature of `nonce`."""
    key = _user_verify_key(public)
    raw_sig = _decode_sig(sig)
    if key is None or raw_sig is None:
        return False
    try:
        key.verify(nonce.encode(), raw_sig)
    except (nacl.exceptions.BadSignatureError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class SlowCheck:
    """A bcrypt comparison that must run off the event loop (~0.1-0.3 s of CPU).

    `run()` is safe in a worker thread (bcrypt releases the GIL); hand its
    result to `Authenticator.finish` back on the loop."""

    hashed: str
    given: str
    identity: Identity | None  # what a match grants (None for a token: all allowed)
    digest: bytes

    def run(self) -> bool:
        try:
            # bcrypt reads 72 bytes; nats-server (Go) compares a longer password by them,
            # the bcrypt package here refuses it instead
            return bcrypt.checkpw(self.given.encode()[:72], self.hashed.encode())
        except ValueError:
            return False


AuthResult = Identity | SlowCheck | None


class _SecretChecker:
    """Constant-time comparison of plain secrets; bcrypt ones become a
    `SlowCheck`. Outcomes of bcrypt checks are remembered (as digests), both
    ways, so reconnect storms and repeated wrong guesses cost no hashing.
    Matches and misses are kept apart: a flood of distinct wrong guesses
    fills and clears only the misses, never a client's remembered match."""

    def __init__(self) -> None:
        self._matched: set[bytes] = set()
        self._missed: set[bytes] = set()

    def check(self, configured: str | None, given: Any, grants: Identity | None) -> AuthResult:
        """`grants` when `given` matches, None when it does not, or a SlowCheck."""
        if configured is None or not isinstance(given, str):
            return None
        if not _is_bcrypt(configured):
            ok = hmac.compare_digest(configured.encode(), given.encode())
            return _granted(ok, grants)
        digest = hashlib.sha256(configured.encode() + b"\0" + given.encode()).digest()
        if digest in self._matched:
            return _granted(True, grants)
        if digest in self._missed:
            return None
        return SlowCheck(configured, given, grants, digest)

    def remember(self, check: SlowCheck, ok: bool) -> None:
        known = self._matched if ok else self._missed
        if len(known) >= _BCRYPT_CACHE_MAX:
            known.clear()
        known.add(check.digest)


def _granted(ok: bool, grants: Identity | None) -> AuthResult:
    if not ok:
        return None
    return grants if grants is not None else Identity(user=None)


class Authenticator:
    """Checks CONNECT credentials against the configured authorization."""

    def __init__(self, options: Options) -> None:
        self.auth_timeout = options.auth_timeout
        self._token = options.token
        self._secrets = _SecretChecker()
        self._tls_map = bool(options.tls and options.tls.verify and options.tls.verify_and_map)
        users = list(options.users)
        if options.user is not None:
            # nats-server ignores `permissions` for a single user or token: only listed
            # users (and no_auth_user) get default_permissions.
            users.append(User(user=options.user, password=options.password))
            default = None
        else:
            default = options.default_permissions
        self._by_name = {u.user: _account(u, default) for u in users if u.user is not None}
        self._by_nkey = {u.nkey: _account(u, default) for u in users if u.nkey is not None}
        # Users of named accounts log in exactly like listed users, into their account.
        conf = options.accounts
        for au in conf.users() if conf is not None else ():
            if au.user is not None:
                self._by_name[au.user] = _account_user(au)
            if au.nkey is not None:
                self._by_nkey[au.nkey] = _account_user(au)
        self._no_auth = self._named_user(options.no_auth_user, "no_auth_user")
        # websocket { no_auth_user }: WebSocket clients without credentials only. INFO
        # still advertises auth_required to them, as nats-server's does.
        ws = options.websocket
        self._ws_no_auth = self._named_user(ws.no_auth_user if ws else None,
                                            "websocket no_auth_user")
        # Every connection must authenticate (send CONNECT, or fall back to no_auth_user).
        self.configured = bool(self._by_name or self._by_nkey) or self._token is not None
        # What INFO advertises: nats-server leaves auth_required out when no_auth_user is
        # set, although it still expects CONNECT (or applies that user) before any PUB/SUB.
        self.required = self.configured and self._no_auth is None

    def user_account(self, name: str) -> str | None:
        """The account of the configured user or nkey `name`, None if there is none
        (a config reload closes the clients of users that are gone)."""
        user = self._by_name.get(name) or self._by_nkey.get(name)
        return user.account if user is not None else None

    def new_nonce(self) -> str | None:
        """A fresh nonce for INFO when nkey users exist (clients sign it)."""
        if not self._by_nkey:
            return None
        return base64.urlsafe_b64encode(secrets.token_bytes(_NONCE_BYTES)).rstrip(b"=").decode()

    def _named_user(self, name: str | None, setting: str) -> _Account | None:
        if name is None:
            return None
        user = self._by_name.get(name) or self._by_nkey.get(name)
        if user is None:
            raise ValueError(f"{setting} {name!r} is not a configured user")
        return user

    def no_auth_identity(self, conn_type: str = CONN_STANDARD) -> Identity | None:
        """The identity of a client that never sent credentials, or None."""
        user = self._no_auth
        if conn_type == CONN_WEBSOCKET and self._ws_no_auth is not None:
            user = self._ws_no_auth
        if user is None or not user.allows(conn_type):
            return None
        return user.identity()

    def begin(self, connect: dict[str, Any], nonce: str | None, tls_peer_cert: dict | None = None,
              conn_type: str = CONN_STANDARD, client_ip: str | None = None) -> AuthResult:
        """The identity for this CONNECT, None (reply `AUTH_VIOLATION` and close),
        or a SlowCheck to run off the loop and pass to `finish`."""
        if not self.configured:
            return Identity(user=None)
        # Under verify_and_map the certificate is the credential: nats-server never
        # falls back to no_auth_user there (an unmapped certificate is refused).
        # WebSocket clients follow websocket { tls } (its verify_and_map stops the node).
        cert_map = self._tls_map and bool(self._by_name) and conn_type == CONN_STANDARD
        if not _has_credentials(connect) and not cert_map:
            identity = self.no_auth_identity(conn_type)
            if identity is not None:
                return identity
        nkey = connect.get("nkey")
        if isinstance(nkey, str) and nkey and self._by_nkey:
            return self._auth_nkey(nkey, connect.get("sig"), nonce, conn_type)
        if self._token is not None:
            return self._secrets.check(self._token, connect.get("auth_token"), None)
        if cert_map:
            # The verified certificate names the user; the CONNECT's user name is
            # ignored, but its password must still be that user's (none for none),
            # as nats-server compares them.
            mapped = self._cert_account(tls_peer_cert, conn_type)
            given = connect.get("pass") or ""
            if mapped is None:
                return None
            return self._secrets.check(mapped.password or "", given, mapped.identity())
        account = self._by_name.get(connect.get("user"))  # type: ignore[arg-type]
        if account is None or not account.allows(conn_type):
            return None
        return self._secrets.check(account.password, connect.get("pass"), account.identity())

    def _cert_account(self, cert: dict | None, conn_type: str) -> _Account | None:
        """tls { verify_and_map }: the user named by the client certificate, as
        nats-server looks it up: e-mail, DNS and URI SANs by name, then the
        subject as a DN (the same RDNs in order, then in any order), then the
        subject's text. A name whose user may not use this connection type is
        skipped, not fatal: the next name may still map."""
        if not cert:
            return None
        sans = cert.get("subjectAltName", ())
        for kind in ("email", "DNS", "URI"):
            for k, name in sans:
                if k == kind and (account := self._cert_user(name, conn_type)) is not None:
                    return account
        subject = _subject_rdns(cert)
        if subject is None:
            return None
        dns = [(_dn_key(_parse_dn(name)), account) for name, account in self._by_name.items()
               if name is not None and account.allows(conn_type)]
        want = _dn_key(subject)
        for same in (lambda dn: dn == want, lambda dn: _rdns_match(dn, want)):
            for dn, account in dns:
                if dn is not None and same(dn):
                    return account
        return self._cert_user(_dn_text(subject), conn_type)

    def _cert_user(self, name: str, conn_type: str) -> _Account | None:
        account = self._by_name.get(name)
        if account is None or not account.allows(conn_type):
            return None
        return account

    def finish(self, check: SlowCheck, ok: bool) -> Identity | None:
        """The outcome of a SlowCheck whose `run()` returned `ok`."""
        self._secrets.remember(check, ok)
        return _granted(ok, check.identity)  # type: ignore[return-value]

    def authenticate(self, connect: dict[str, Any], nonce: str | None,
                     tls_peer_cert: dict | None = None,
                     conn_type: str = CONN_STANDARD) -> Identity | None:
        """`begin` and, if needed, the bcrypt check inline (tests and tools only:
        it may block for a bcrypt check)."""
        result = self.begin(connect, nonce, tls_peer_cert, conn_type)
        if isinstance(result, SlowCheck):
            return self.finish(result, result.run())
        return result

    def _auth_nkey(self, nkey: str, sig: Any, nonce: str | None,
                   conn_type: str) -> Identity | None:
        account = self._by_nkey.get(nkey)
        if account is None or nonce is None or not isinstance(sig, str):
            return None
        if not account.allows(conn_type) or not verify_nkey(nkey, nonce, sig):
            return None
        return account.identity()


# Attribute names as `ssl.getpeercert()` gives them -> the short names nats-server
# (Go's pkix) writes in a subject string.
_DN_NAMES = {
    "commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
    "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
    "streetAddress": "STREET", "postalCode": "POSTALCODE", "serialNumber": "SERIALNUMBER",
    "domainComponent": "DC", "userId": "UID",
}
_DN_SPECIALS = ',+"\\<>;'


def _dn_text(subject: list[tuple[tuple[str, str], ...]]) -> str:
    """The subject as Go prints it ("CN=a,O=b": last RDN first)."""
    return ",".join("+".join(f"{t}={_dn_escape(v)}" for t, v in rdn) for rdn in reversed(subject))


_DnKey = list[frozenset[tuple[str, str]]]


def _dn_key(rdns: list[tuple[tuple[str, str], ...]] | None) -> _DnKey | None:
    """RDNs for comparison: attribute types without case, the attributes of a
    multi-valued RDN in any order (values compare exactly, as nats-server's)."""
    if rdns is None:
        return None
    return [frozenset((t.upper(), v) for t, v in rdn) for rdn in rdns]


def _rdns_match(configured: _DnKey, presented: _DnKey) -> bool:
    """The same RDNs in any order (nats-server's fallback for reordered DNs)."""
    return len(configured) == len(presented) and all(r in presented for r in configured)


def _subject_rdns(cert: dict) -> list[tuple[tuple[str, str], ...]] | None:
    """The subject's RDNs, first to last, with short names; None when an
    attribute has no short name (such a subject cannot be matched)."""
    rdns = []
    for rdn in cert.get("subject", ()):
        pairs = []
        for name, value in rdn:
            short = _DN_NAMES.get(name)
            if short is None:
                return None
            pairs.append((short, value))
        rdns.append(tuple(pairs))
    return rdns


def _dn_escape(value: str) -> str:
    out = "".join("\\" + c if c in _DN_SPECIALS else c for c in value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def _parse_dn(text: str) -> list[tuple[tuple[str, str], ...]] | None:
    """A configured user name read as a DN ("CN=a, O=b"), in certificate order
    (a DN string lists the last RDN first); None when it is not one."""
    rdns = []
    for part in _split_unescaped(text, ","):
        pairs = []
        for ava in _split_unescaped(part, "+"):
            kind, eq, value = ava.partition("=")
            if not eq or not kind.strip():
                return None
            pairs.append((kind.strip().upper(), _dn_unescape(value.strip())))
        rdns.append(tuple(pairs))
    return list(reversed(rdns))


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, current, escaped = [], [], False
    for c in text:
        if escaped:
            current.append(c)
            escaped = False
        elif c == "\\":
            current.append(c)
            escaped = True
        elif c == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
    parts.append("".join(current))
    return parts


def _dn_unescape(value: str) -> str:
    out, escaped = [], False
    for c in value:
        if escaped or c != "\\":
            out.append(c)
            escaped = False
        else:
            escaped = True
    return "".join(out)


def _has_credentials(connect: dict[str, Any]) -> bool:
    return any(connect.get(k) for k in ("user", "pass", "auth_token", "nkey", "jwt"))
