"""Operator mode at the node: who may log in (user JWTs signed into an
account the operator trusts, proving the nonce with the user's key) and
which accounts exist (the resolver's account JWTs).

Only the MEMORY resolver is wired: its account JWTs are the preloaded ones,
all known at start, so every account (its limits, exports, imports and
mappings) is built once like a configured one. The checks themselves are
node/jwt.py's `authenticate_user`; this module only adapts them to the
`Authenticator` interface the client calls (`begin` / `finish`).
"""

from __future__ import annotations

import base64
import dataclasses
import secrets
import time
from typing import Any

from node.accountconf import AccountsConfig
from node.activation import apply_activations
from node.auth import (
    CONN_STANDARD,
    CompiledPermissions,
    Identity,
    PermissionSet,
)
from node.config import ConfigError
from node.jwt import AuthError, JWTError, JWTIdentity, ResponsePermission, authenticate_user
from node.options import Options, Permissions
from node.resolver import (
    DirResolver,
    MemoryResolver,
    OperatorConfig,
    account_config_from_claims,
    system_account_key,
    validate_operator_start,
)

_NONCE_BYTES = 11  # as nats-server's nonces: 15 base64url characters


def enforceable(opts: Options) -> OperatorConfig | None:
    """The operator config if this node can enforce it; raises ConfigError
    (the node stops with [FTL]) for anything it cannot."""
    cfg = opts.operator
    if cfg is None:
        return None
    has_accounts = bool(opts.accounts and opts.accounts.accounts)
    validate_operator_start(cfg, has_accounts=has_accounts,
                            has_users=bool(opts.users or opts.user or opts.token))
    if cfg.resolver is None or cfg.resolver.kind not in ("MEMORY", "full"):
        kind = cfg.resolver.kind if cfg.resolver else "none"
        raise ConfigError(f"resolver {kind!r} is not enforced by jetraft yet "
                          "(only MEMORY and full)")
    if opts.no_auth_user:
        raise ConfigError("no_auth_user in operator mode is not enforced by jetraft yet")
    return cfg


def make_resolver(cfg: OperatorConfig) -> MemoryResolver:
    if cfg.resolver is not None and cfg.resolver.kind == "full":
        return DirResolver(cfg, cfg.resolver.dir)
    return MemoryResolver(cfg)


def operator_accounts(cfg: OperatorConfig, resolver: MemoryResolver,
                      now: float) -> AccountsConfig:
    """Every preloaded account that verifies now, as configured accounts
    named by their public keys (nats-server names them so too)."""
    conf = AccountsConfig(system_account=system_account_key(cfg) or "$SYS")
    for key in resolver.jwts:
        claims = resolver.lookup(key, now)
        if claims is not None:
            conf.accounts[key] = account_config_from_claims(claims)
    apply_activations(conf, lambda k: resolver.lookup(k, now), now)
    return conf


class OperatorAuthenticator:
    """CONNECT with `jwt` and `sig` -> Identity in the JWT's account."""

    def __init__(self, options: Options, cfg: OperatorConfig, resolver: MemoryResolver) -> None:
        self.auth_timeout = options.auth_timeout
        self.cfg = cfg
        self.resolver = resolver
        self.max_jwt_bytes = options.max_control_line
        self.configured = True
        self.required = True
        # Accounts the node has built (the server adds those claim updates create).
        self.accounts: set[str] = set(options.accounts.accounts) if options.accounts else set()

    def new_nonce(self) -> str:
        """Every connection gets a fresh nonce: the JWT user signs it."""
        return base64.urlsafe_b64encode(secrets.token_bytes(_NONCE_BYTES)).rstrip(b"=").decode()

    def no_auth_identity(self, conn_type: str = CONN_STANDARD) -> Identity | None:
        return None

    def begin(self, connect: dict[str, Any], nonce: str | None, tls_peer_cert: dict | None = None,
              conn_type: str = CONN_STANDARD, client_ip: str | None = None) -> Identity | None:
        token, sig = connect.get("jwt"), connect.get("sig")
        if not isinstance(token, str) or not token or nonce is None:
            return None
        if sig is not None and not isinstance(sig, str):
            return None
        who = self._check(token, sig, nonce, conn_type, client_ip)
        if who is None:
            return None
        if who.account_key not in self.accounts:
            # Valid now but not when the node built its accounts (e.g. its JWT's nbf
            # was still ahead): no Account to put the user in, so no login.
            return None
        return Identity(user=who.user_key, account=who.account_key,
                        permissions=_permission_set(who.permissions, who.response),
                        expires=float(who.expires), max_subscriptions=who.max_subscriptions,
                        max_payload=who.max_payload,
                        recheck=lambda: self._check(token, sig, nonce, conn_type,
                                                    client_ip) is not None)

    def _check(self, token: str, sig: str | None, nonce: str, conn_type: str,
               client_ip: str | None) -> JWTIdentity | None:
        now = time.time()
        try:
            who, _account = authenticate_user(
                token, sig, nonce.encode(), operator=self.cfg,
                lookup_account=lambda key: self.resolver.lookup(key, now), now=now,
                client_ip=client_ip, connection_type=conn_type,
                max_jwt_bytes=self.max_jwt_bytes)
        except (AuthError, JWTError):
            return None
        return who

    def finish(self, check: Any, ok: bool) -> Identity | None:
        return None  # never starts a SlowCheck

    def authenticate(self, connect: dict[str, Any], nonce: str | None,
                     tls_peer_cert: dict | None = None,
                     conn_type: str = CONN_STANDARD) -> Identity | None:
        return self.begin(connect, nonce, tls_peer_cert, conn_type)


def _permission_set(perms: Permissions | None,
                    response: ResponsePermission | None) -> PermissionSet | None:
    if perms is None and response is None:
        return None
    perms = dataclasses.replace(perms) if perms is not None else Permissions()
    if response is not None:
        # The JWT's resp {max, ttl}; 0 keeps nats-server's default (1 reply, 2 min).
        perms.allow_responses = True
        perms.response_max = response.max_msgs or perms.response_max
        perms.response_expires = response.expires_seconds or perms.response_expires
    return PermissionSet(CompiledPermissions.build(perms))
