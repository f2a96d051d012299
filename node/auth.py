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
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import bcrypt
import nacl.exceptions
import nacl.signing
import nkeys

from node.options import Options, Permissions, User

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
        expired = now is not None and now - entry[0] > RESPONSE_EXPIRES
        if entry[1] > RESPONSE_MAX_MSGS or expired:
            del self._replies[subject]
            return False
        return True

    def note_reply(self, reply: str, now: float) -> None:
        """Record that a message with reply subject `reply` was delivered to
        this connection, granting it `RESPONSE_MAX_MSGS` publishes there."""
        if not self._c.responses:
            return
        if len(self._replies) >= _REPLIES_MAX:
            self._prune_replies(now)
        self._replies[reply] = [now, 0]

    def _prune_replies(self, now: float) -> None:
        for key in [k for k, (t, _) in self._replies.items() if now - t > RESPONSE_EXPIRES]:
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


@dataclass
class Identity:
    name: str | None
    permissions: PermissionSet | None  # None: everything allowed


@dataclass(frozen=True)
class _Account:
    """A configured user, with its compiled permissions."""

    name: str | None
    password: str | None
    nkey: str | None
    perms: CompiledPermissions | None

    def identity(self) -> Identity:
        perms = PermissionSet(self.perms) if self.perms is not None else None
        return Identity(name=self.name or self.nkey, permissions=perms)


def _account(user: User) -> _Account:
    perms = CompiledPermissions.build(user.permissions) if user.permissions else None
    return _Account(user.user, user.password, user.nkey, perms)


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


class _SecretChecker:
    """Constant-time comparison of plain secrets, bcrypt for hashed ones.
    bcrypt costs ~0.1 s per check, so successful checks are remembered (as a
    digest) to keep reconnect storms from stalling the event loop."""

    def __init__(self) -> None:
        self._verified: dict[bytes, None] = {}

    def check(self, configured: str | None, given: Any) -> bool:
        if configured is None or not isinstance(given, str):
            return False
        if not _is_bcrypt(configured):
            return hmac.compare_digest(configured.encode(), given.encode())
        key = hashlib.sha256(configured.encode() + b"\0" + given.encode()).digest()
        if key in self._verified:
            return True
        try:
            ok = bcrypt.checkpw(given.encode(), configured.encode())
        except ValueError:
            return False
        if ok:
            if len(self._verified) >= _BCRYPT_CACHE_MAX:
                self._verified.clear()
            self._verified[key] = None
        return ok


class Authenticator:
    """Checks CONNECT credentials against the configured authorization."""

    def __init__(self, options: Options) -> None:
        self.auth_timeout = options.auth_timeout
        self._token = options.token
        self._secrets = _SecretChecker()
        users = list(options.users)
        if options.user is not None:
            users.append(User(user=options.user, password=options.password))
        self._by_name = {u.user: _account(u) for u in users if u.user is not None}
        self._by_nkey = {u.nkey: _account(u) for u in users if u.nkey is not None}
        self._no_auth: _Account | None = None
        if options.no_auth_user is not None:
            self._no_auth = self._by_name.get(options.no_auth_user)
            if self._no_auth is None:
                raise ValueError(f"no_auth_user {options.no_auth_user!r} is not a configured user")
        self.configured = bool(users) or self._token is not None
        # nats-server leaves auth_required out of INFO when no_auth_user is set.
        self.required = self.configured and self._no_auth is None

    def new_nonce(self) -> str | None:
        """A fresh nonce for INFO when nkey users exist (clients sign it)."""
        if not self._by_nkey:
            return None
        return base64.urlsafe_b64encode(secrets.token_bytes(_NONCE_BYTES)).rstrip(b"=").decode()

    def authenticate(
        self, connect: dict[str, Any], nonce: str | None, tls_peer_cert: dict | None = None
    ) -> Identity | None:
        """The identity for this CONNECT, or None: reply `AUTH_VIOLATION` and
        close. May take ~0.1 s on a first bcrypt check."""
        if not self.configured:
            return Identity(name=None, permissions=None)
        if self._no_auth is not None and not _has_credentials(connect):
            return self._no_auth.identity()
        nkey = connect.get("nkey")
        if isinstance(nkey, str) and nkey and self._by_nkey:
            return self._auth_nkey(nkey, connect.get("sig"), nonce)
        if self._token is not None:
            if self._secrets.check(self._token, connect.get("auth_token")):
                return Identity(name=None, permissions=None)
            return None
        account = self._by_name.get(connect.get("user"))  # type: ignore[arg-type]
        if account is None or not self._secrets.check(account.password, connect.get("pass")):
            return None
        return account.identity()

    def _auth_nkey(self, nkey: str, sig: Any, nonce: str | None) -> Identity | None:
        account = self._by_nkey.get(nkey)
        if account is None or nonce is None or not isinstance(sig, str):
            return None
        if not verify_nkey(nkey, nonce, sig):
            return None
        return account.identity()


def _has_credentials(connect: dict[str, Any]) -> bool:
    return any(connect.get(k) for k in ("user", "pass", "auth_token", "nkey", "jwt"))
