"""Activation tokens for imports of token-required exports (operator mode),
against nats-server 2.15 with the same JWTs: which imports a token opens.

Account A exports token-required streams and a service; account B imports
each with a different token (valid, for another account, expired, signed by
a stranger, by A's signing key, narrower or wider than the import); account C
imports without a token. A publishes on every subject; what B and C receive,
and whether B's request is served, must be the same on both servers.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import nats

from tests import jwt_issuer as ji
from tests.integration.test_operator_wired import _connect, _creds


def _activation(signer: ji.Key, importer: ji.Key, subject: str, kind: str = "stream",
                exp: int | None = None, **nats_extra: Any) -> str:
    claims: dict[str, Any] = {"sub": importer.public, "name": subject, "nats": {
        "type": "activation", "version": 2, "subject": subject, "kind": kind, **nats_extra}}
    if exp is not None:
        claims["exp"] = exp
    return ji.encode(claims, signer)


CASES = ["valid", "other", "expired", "stranger", "signer", "fakesigner", "wide", "narrow", "kind",
         "none", "public", "publicnotoken"]


def _world(tmp: Path) -> tuple[str, ji.Key, dict[str, ji.Key]]:
    """A exports `<case>.>` (token required) for each case; importer account
    `<case>` imports it with that case's token (`none`: no token)."""
    op, sys_ = ji.operator_key(), ji.account_key()
    a, stranger, a_signer, third = (ji.account_key(), ji.account_key(), ji.account_key(),
                                    ji.account_key())
    # The literal "public" needs no token: one importer brings a token anyway, one does not.
    exports = [{"name": n, "subject": "public" if n == "public" else f"{n}.>", "type": "stream",
                "token_req": n != "public"} for n in CASES if n != "publicnotoken"]
    exports.append({"name": "svc", "subject": "svc.>", "type": "service", "token_req": True})
    a_jwt = ji.account_jwt(a, op, name="A", exports=exports, signing_keys=[a_signer.public])
    importers = {n: ji.account_key() for n in CASES}
    past = int(time.time()) - 60
    tokens = {
        "valid": _activation(a, importers["valid"], "valid.>"),
        "other": _activation(a, third, "other.>"),  # made out to another account
        "expired": _activation(a, importers["expired"], "expired.>", exp=past),
        "stranger": _activation(stranger, importers["stranger"], "stranger.>"),
        "signer": _activation(a_signer, importers["signer"], "signer.>",
                              issuer_account=a.public),
        # Claims to speak for A, signed by a key A never listed.
        "fakesigner": _activation(stranger, importers["fakesigner"], "fakesigner.>",
                                  issuer_account=a.public),
        "wide": _activation(a, importers["wide"], "wide.>"),  # the import takes wide.x
        "narrow": _activation(a, importers["narrow"], "narrow.x"),  # it wants narrow.>
        "kind": _activation(a, importers["kind"], "kind.>", kind="service"),
        "public": _activation(a, importers["public"], "public"),
    }
    preload = {sys_.public: ji.account_jwt(sys_, op), a.public: a_jwt}
    for n, key in importers.items():
        subject = {"wide": "wide.x", "public": "public", "publicnotoken": "public"}.get(
            n, f"{n}.>")
        imp: dict[str, Any] = {"name": n, "subject": subject,
                               "account": a.public, "type": "stream"}
        if n in tokens:
            imp["token"] = tokens[n]
        imports = [imp]
        if n == "valid":
            imports.append({"name": "svc", "subject": "svc.>", "account": a.public,
                            "type": "service",
                            "token": _activation(a, key, "svc.>", kind="service")})
        preload[key.public] = ji.account_jwt(key, op, name=n, imports=imports)
    (tmp / "op.jwt").write_text(ji.operator_jwt(op, system_account=sys_.public))
    entries = ", ".join(f"{k}: {v}" for k, v in preload.items())
    config = (f"operator: {tmp / 'op.jwt'}\nsystem_account: {sys_.public}\n"
              f"resolver: MEMORY\nresolver_preload: {{ {entries} }}\n")
    return config, a, importers


async def _routes(server: Any, tmp: Path, a: ji.Key,
                  importers: dict[str, ji.Key]) -> dict[str, Any]:
    nc_a = await _connect(server, _creds(tmp, a, f"a{server.port}"))
    got: dict[str, Any] = {}
    conns = {}
    for n, key in importers.items():
        try:
            conns[n] = await _connect(server, _creds(tmp, key, f"{n}{server.port}"))
        except Exception as err:  # noqa: BLE001 - a refused account is an outcome
            got[n] = f"login refused: {err}"
            continue
        got[n] = []

        async def cb(msg: Any, n: str = n) -> None:
            got[n].append(msg.subject)

        await conns[n].subscribe(">", cb=cb)
        await conns[n].flush()

    async def serve(msg: Any) -> None:
        await nc_a.publish(msg.reply, b"served")

    await nc_a.subscribe("svc.>", cb=serve)
    await nc_a.flush()
    await asyncio.sleep(0.2)
    for n in CASES:
        for suffix in ("x", "y"):
            await nc_a.publish(f"{n}.{suffix}", b"m")
    await nc_a.publish("public", b"m")
    await nc_a.flush()
    for nc in conns.values():
        await nc.flush()
    await asyncio.sleep(0.3)
    if "valid" in conns:
        try:
            got["svc"] = (await conns["valid"].request("svc.q", b"r", timeout=2)).data.decode()
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError) as err:
            got["svc"] = type(err).__name__
    for nc in (nc_a, *conns.values()):
        await nc.close()
    return {k: sorted(x for x in v if not x.startswith("_INBOX.")) if isinstance(v, list) else v
            for k, v in got.items()}


def test_activation_tokens_open_imports_like_nats_server(servers: Any, tmp_path: Path) -> None:
    config, a, importers = _world(tmp_path)
    seen = {}
    for impl, start in (("nats-server", servers.nats_server), ("jetraft", servers.jetraft)):
        srv = start(config)
        seen[impl] = asyncio.run(_routes(srv, tmp_path, a, importers))
        srv.stop()
    assert seen["jetraft"] == seen["nats-server"]
    theirs = seen["nats-server"]
    assert theirs["valid"] == ["svc.q", "valid.x", "valid.y"] and theirs["svc"] == "served"
    assert theirs["wide"] == ["wide.x"]  # a wider token covers the narrower import
    assert theirs["signer"] == ["signer.x", "signer.y"]
    assert theirs["expired"] == theirs["none"] == theirs["fakesigner"] == []
    assert theirs["public"] == theirs["publicnotoken"] == ["public"]
    for refused in ("other", "stranger", "narrow", "kind"):
        assert str(theirs[refused]).startswith("login refused"), refused
