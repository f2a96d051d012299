"""node/resolver.py: operator-mode settings, the MEMORY and full (dir)
resolvers, and claim updates (real files, real fsync)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from node.config import ConfigError, parse_config
from node.jwt import JWTError, decode_account
from node.resolver import (
    DirResolver,
    MemoryResolver,
    OperatorConfig,
    ResolverConfig,
    claims_update_response,
    parse_operator_config,
    system_account_key,
    validate_operator_start,
    write_durably,
)
from tests import jwt_issuer as ji

NOW = time.time()


@pytest.fixture
def world(tmp_path: Path):
    op, sys_, acc = ji.operator_key(), ji.account_key(), ji.account_key()
    (tmp_path / "op.jwt").write_text(ji.operator_jwt(op, system_account=sys_.public))
    return op, sys_, acc, tmp_path


def _cfg(world, extra: str = "") -> OperatorConfig:
    _, _, _, tmp = world
    cfg = parse_operator_config(parse_config(f"operator: {tmp / 'op.jwt'}\n{extra}"))
    assert cfg is not None
    return cfg


def test_operator_settings(world) -> None:
    op, sys_, acc, tmp = world
    acc_jwt = ji.account_jwt(acc, op)
    cfg = _cfg(world, f"resolver: MEMORY\nresolver_preload: {{ {acc.public}: {acc_jwt} }}")
    assert cfg.operators[0].key == op.public and system_account_key(cfg) == sys_.public
    assert cfg.resolver == ResolverConfig("MEMORY") and cfg.preload == {acc.public: acc_jwt}
    validate_operator_start(cfg, has_accounts=False, has_users=False)
    inline = parse_operator_config(parse_config(f"operator: {ji.operator_jwt(op)}"))
    assert inline is not None and inline.operators[0].key == op.public
    full = _cfg(world, f'resolver {{ type: full, dir: "{tmp}/jwt", allow_delete: true }}')
    assert full.resolver == ResolverConfig("full", dir=f"{tmp}/jwt", allow_delete=True)
    assert parse_operator_config(parse_config("port: 1")) is None


@pytest.mark.parametrize(("text", "message"), [
    ("operator: /nonexistent.jwt", "error parsing operator JWT: open /nonexistent.jwt"),
    ('operator: "abc.def.ghi"', "error parsing operator JWT: open abc.def.ghi"),
    ("resolver: { type: bogus, dir: x }", "error parsing account resolver"),
    ("resolver: NOPE", "error parsing account resolver"),
])
def test_operator_config_errors(world, text: str, message: str) -> None:
    _, _, _, tmp = world
    if not text.startswith("operator"):
        text = f"operator: {tmp / 'op.jwt'}\n{text}"
    with pytest.raises(ConfigError, match=message):
        parse_operator_config(parse_config(text))


def test_preload_must_be_an_account_jwt(world) -> None:
    op, _, acc, _ = world
    with pytest.raises(ConfigError, match="invalid account JWT"):
        _cfg(world, f"resolver: MEMORY\nresolver_preload: {{ {acc.public}: abc.def.ghi }}")
    user = ji.user_jwt(ji.user_key(), acc)
    with pytest.raises(ConfigError, match="invalid account JWT"):
        _cfg(world, f"resolver: MEMORY\nresolver_preload: {{ {acc.public}: {user} }}")


@pytest.mark.parametrize(("extra", "accounts", "users", "message"), [
    ("resolver: MEMORY", True, False, "operators do not allow Accounts"),
    ("resolver: MEMORY", False, True, "operators do not allow users"),
    ("", False, False, "resolver 'none' is not supported"),
    ("resolver: URL(http://localhost:9/jwt/v1/accounts/)", False, False,
     "resolver 'url' is not supported"),
    ("resolver { type: cache, dir: /tmp/x }", False, False, "resolver 'cache' is not supported"),
])
def test_start_checks_fail_closed(world, extra: str, accounts: bool, users: bool,
                                  message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_operator_start(_cfg(world, extra), accounts, users)


def test_system_account_must_match_the_operator_jwt(world) -> None:
    _, _, acc, _ = world
    cfg = _cfg(world, f"resolver: MEMORY\nsystem_account: {acc.public}")
    with pytest.raises(ConfigError, match="must be identical"):
        validate_operator_start(cfg, False, False)


def test_memory_resolver_lookup_and_update(world) -> None:
    op, _, acc, _ = world
    cfg = _cfg(world, f"resolver: MEMORY\nresolver_preload: {{ {acc.public}: "
                      f"{ji.account_jwt(acc, op)} }}")
    r = MemoryResolver(cfg)
    assert r.lookup(acc.public, NOW).key == acc.public
    assert r.lookup(ji.account_key().public, NOW) is None
    stranger = ji.account_key()
    r.jwts[stranger.public] = ji.account_jwt(stranger, ji.operator_key())
    assert r.lookup(stranger.public, NOW) is None  # untrusted issuer: unusable
    r.jwts["Ax"] = ji.account_jwt(stranger, op)
    assert r.lookup("Ax", NOW) is None  # stored under another key: unusable
    r.jwts["Ay"] = r.jwts[acc.public]
    assert r.lookup(acc.public, NOW) is not None and r.lookup("Ay", NOW) is None
    expired = ji.account_jwt(acc, op, exp=int(NOW) - 1)
    with pytest.raises(JWTError, match="expired"):
        r.update(expired, NOW)


def test_dir_resolver_stores_durably_and_reloads(world) -> None:
    op, _, acc, tmp = world
    directory = tmp / "jwt"
    cfg = _cfg(world, f'resolver {{ type: full, dir: "{directory}" }}')
    r = DirResolver(cfg, str(directory))
    first = ji.encode({"sub": acc.public, "iat": int(NOW) - 10, "name": "v1",
                       "nats": {"type": "account", "version": 2}}, op)
    second = ji.encode({"sub": acc.public, "iat": int(NOW), "name": "v2",
                        "nats": {"type": "account", "version": 2}}, op)
    assert r.update(first, NOW).claims.name == "v1"
    assert r.update(second, NOW).claims.name == "v2"
    with pytest.raises(JWTError, match="older"):
        r.update(first, NOW)
    path = directory / f"{acc.public}.jwt"
    assert path.read_text() == second
    assert not list(directory.glob("*.tmp"))
    again = DirResolver(cfg, str(directory))  # a restart reads what was written
    assert again.lookup(acc.public, NOW).claims.name == "v2"
    with pytest.raises(JWTError, match="not signed by a trusted operator"):
        again.update(ji.account_jwt(ji.account_key(), ji.operator_key()), NOW)
    with pytest.raises(JWTError, match="delete not allowed"):
        again.delete(acc.public)
    with pytest.raises(JWTError):
        again.path("../../etc/passwd")


def test_dir_resolver_delete_when_allowed(world) -> None:
    op, _, acc, tmp = world
    cfg = _cfg(world, f'resolver {{ type: full, dir: "{tmp}/d", allow_delete: true }}')
    r = DirResolver(cfg, f"{tmp}/d")
    r.update(ji.account_jwt(acc, op), NOW)
    r.delete(acc.public)
    assert r.fetch(acc.public) is None and not os.listdir(f"{tmp}/d")


def test_claims_update_response(world) -> None:
    op, _, acc, tmp = world
    r = DirResolver(_cfg(world, f'resolver {{ type: full, dir: "{tmp}/u" }}'), f"{tmp}/u")
    ok = claims_update_response(r, ji.account_jwt(acc, op).encode(), NOW)
    assert ok == {"data": {"account": acc.public, "code": 200, "message": "jwt updated"}}
    for bad in (b"garbage", b"\xff\xfe", ji.account_jwt(acc, ji.operator_key()).encode()):
        reply = claims_update_response(r, bad, NOW)
        assert reply["error"]["code"] == 500, json.dumps(reply)
        assert reply["error"]["description"].startswith("jwt update resulted in error")


def test_write_durably_replaces_atomically(tmp_path: Path) -> None:
    target = tmp_path / "x.jwt"
    write_durably(str(target), b"one")
    write_durably(str(target), b"two")
    assert target.read_bytes() == b"two" and sorted(os.listdir(tmp_path)) == ["x.jwt"]


def test_authentication_against_several_operators(world) -> None:
    import base64

    from node.jwt import AuthError, authenticate_user

    op, _, acc, tmp = world
    op2, acc2, stranger_op = ji.operator_key(), ji.account_key(), ji.operator_key()
    (tmp / "op2.jwt").write_text(ji.operator_jwt(op2))
    cfg = parse_operator_config(parse_config(
        f"operator: [{tmp / 'op.jwt'}, {tmp / 'op2.jwt'}]\nresolver: MEMORY\n"
        f"resolver_preload: {{ {acc.public}: {ji.account_jwt(acc, op)}, "
        f"{acc2.public}: {ji.account_jwt(acc2, op2)} }}"))
    assert cfg is not None and len(cfg.operators) == 2
    r = MemoryResolver(cfg)
    for account in (acc, acc2):
        user = ji.user_key()
        sig = base64.urlsafe_b64encode(user.sign(b"n")).rstrip(b"=").decode()
        ident, _ = authenticate_user(ji.user_jwt(user, account), sig, b"n", operator=cfg,
                                     lookup_account=lambda k: r.lookup(k, NOW), now=NOW,
                                     client_ip="127.0.0.1")
        assert ident.account_key == account.public
    foreign = ji.account_key()
    r.jwts[foreign.public] = ji.account_jwt(foreign, stranger_op)
    user = ji.user_key()
    sig = base64.urlsafe_b64encode(user.sign(b"n")).rstrip(b"=").decode()
    # Even a lookup that skips the resolver's own trust check is caught.
    with pytest.raises(AuthError, match="trusted operator"):
        authenticate_user(ji.user_jwt(user, foreign), sig, b"n", operator=cfg,
                          lookup_account=lambda k: decode_account(r.jwts[k]),
                          now=NOW, client_ip="127.0.0.1")


def test_lookup_rechecks_expiry_of_a_cached_account(world) -> None:
    op, _, acc, _ = world
    token = ji.account_jwt(acc, op, exp=int(NOW) + 10)
    r = MemoryResolver(_cfg(world, f"resolver: MEMORY\nresolver_preload: {{ {acc.public}: "
                                   f"{token} }}"))
    assert r.lookup(acc.public, NOW) is not None
    assert r.lookup(acc.public, NOW + 11) is None  # cached, but expired now
    assert r.lookup(acc.public, NOW) is not None
