"""Test fixtures for operator mode: nkeys and signed NATS JWTs (v2).

Independent of node/jwt.py on purpose: it writes JWTs the way the NATS
tools do, and `tests/integration/test_jwt_diff.py` shows nats-server
accepts them, so they are fair input for our decoder.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import nkeys


@dataclass
class Key:
    seed: bytes
    public: str

    def sign(self, data: bytes) -> bytes:
        return nkeys.from_seed(self.seed).sign(data)


def new_key(prefix: int) -> Key:
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    return Key(seed, nkeys.from_seed(seed).public_key.decode())


def operator_key() -> Key:
    return new_key(nkeys.PREFIX_BYTE_OPERATOR)


def account_key() -> Key:
    return new_key(nkeys.PREFIX_BYTE_ACCOUNT)


def user_key() -> Key:
    return new_key(nkeys.PREFIX_BYTE_USER)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def encode(claims: dict[str, Any], signer: Key, header: dict[str, Any] | None = None) -> str:
    """Sign `claims` (iss is set to the signer; jti is the hash the tools use)."""
    body = dict(claims)
    body["iss"] = signer.public
    body.setdefault("iat", int(time.time()))
    body["jti"] = ""
    body["jti"] = base64.b32encode(
        hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()).decode().rstrip("=")
    if header is None:
        header = {"typ": "JWT", "alg": "ed25519-nkey"}
    head = _b64(json.dumps(header).encode())
    payload = _b64(json.dumps(body).encode())
    sig = _b64(signer.sign(f"{head}.{payload}".encode()))
    return f"{head}.{payload}.{sig}"


def operator_jwt(op: Key, signer: Key | None = None, **nats: Any) -> str:
    return encode({"sub": op.public, "name": "OP",
                   "nats": {"type": "operator", "version": 2, **nats}}, signer or op)


def account_jwt(acc: Key, signer: Key, name: str = "ACC", exp: int | None = None,
                **nats: Any) -> str:
    nats.setdefault("limits", {"subs": -1, "data": -1, "payload": -1, "imports": -1,
                               "exports": -1, "wildcards": True, "conn": -1, "leaf": -1})
    claims: dict[str, Any] = {"sub": acc.public, "name": name,
                              "nats": {"type": "account", "version": 2, **nats}}
    if exp is not None:
        claims["exp"] = exp
    return encode(claims, signer)


def user_jwt(user: Key, signer: Key, name: str = "user", exp: int | None = None,
             iat: int | None = None, bare: bool = False, **nats: Any) -> str:
    """`bare`: no limits at all, as a user under a scoped signing key must be."""
    limits = {} if bare else {"subs": -1, "data": -1, "payload": -1}
    claims: dict[str, Any] = {"sub": user.public, "name": name,
                              "nats": {"type": "user", "version": 2, **limits, **nats}}
    if exp is not None:
        claims["exp"] = exp
    if iat is not None:
        claims["iat"] = iat
    return encode(claims, signer)


def creds(jwt: str, user: Key) -> str:
    """A .creds file as `nsc` writes it."""
    return (f"-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n"
            "NKEY Seed printed below can be used to sign and prove identity.\n\n"
            f"-----BEGIN USER NKEY SEED-----\n{user.seed.decode()}\n"
            "------END USER NKEY SEED------\n")


def preload_config(tmp: Any, op: Key, system: Key, preload: dict[str, str],
                   users: list[tuple[Key, str]]) -> tuple[str, list[Any]]:
    """Operator mode with a MEMORY resolver preloaded with `preload`, and one .creds file per
    (account, name) in `users`, in directory `tmp` (a Path). The config keeps one `%s` for
    the JetStream store directory."""
    (tmp / "op.jwt").write_text(operator_jwt(op, system_account=system.public))
    paths = []
    for acc, name in users:
        user = user_key()
        path = tmp / f"{name}.creds"
        path.write_text(creds(user_jwt(user, acc), user))
        paths.append(path)
    lines = [f"  {k}: {v}" for k, v in preload.items()]
    config = (f"operator: {tmp / 'op.jwt'}\nsystem_account: {system.public}\n"
              "resolver: MEMORY\nresolver_preload: {\n" + "\n".join(lines) + "\n}\n"
              'jetstream { store_dir: "%s" }\n')
    return config, paths
