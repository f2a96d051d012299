"""Operator mode with the full resolver on three nodes: an account JWT pushed
to one node ($SYS.REQ.CLAIMS.UPDATE) reaches every node's resolver through
the routes, and a revocation pushed to one node closes the user on another."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats

from node.cluster.local import LocalCluster
from tests import jwt_issuer as ji


def _creds(tmp: Path, account: ji.Key, name: str) -> str:
    user = ji.user_key()
    path = tmp / f"{name}.creds"
    path.write_text(ji.creds(ji.user_jwt(user, account, iat=int(time.time()) - 10), user))
    return str(path)


async def _login(url: str, creds: str) -> nats.NATS | None:
    try:
        return await nats.connect(url, user_credentials=creds, allow_reconnect=False,
                                  max_reconnect_attempts=0, connect_timeout=3)
    except (nats.errors.Error, OSError):
        return None


async def test_claim_updates_reach_every_node(tmp_path: Path) -> None:
    op, sys_, acc = ji.operator_key(), ji.account_key(), ji.account_key()
    (tmp_path / "op.jwt").write_text(ji.operator_jwt(op, system_account=sys_.public))
    conf = (f"operator: {tmp_path / 'op.jwt'}\nsystem_account: {sys_.public}\n"
            "resolver: { type: full, dir: 'jwt' }\n"  # relative: each node's own directory
            f"resolver_preload: {{ {sys_.public}: {ji.account_jwt(sys_, op)} }}\n")
    c = LocalCluster(tmp_path / "c", 3, name="jwt", jetstream=False, extra_config=conf)
    try:
        c.start()
        n1, n2, n3 = c.nodes
        user_creds = _creds(tmp_path, acc, "user")
        assert await _login(n3.url, user_creds) is None  # account unknown everywhere
        sysc = await _login(n1.url, _creds(tmp_path, sys_, "sys"))
        assert sysc is not None
        # The claim subscriptions of n2 and n3 must be known to n1 before the push.
        async with asyncio.timeout(10):
            while sum("$SYS.REQ.CLAIMS.UPDATE" in r["subscriptions_list"]
                      for r in n1.get("/routez?subs=1")["routes"]) < 2:
                await asyncio.sleep(0.1)
        reply = await sysc.request("$SYS.REQ.CLAIMS.UPDATE",
                                   ji.account_jwt(acc, op, name="v1").encode(), timeout=5)
        assert b'"code":200' in reply.data.replace(b" ", b"")
        users = {}
        async with asyncio.timeout(10):
            for node in (n1, n2, n3):
                while (nc := await _login(node.url, user_creds)) is None:
                    await asyncio.sleep(0.1)
                users[node.name] = nc
        # Revoked on n1: the user connected to n3 is closed too.
        closed = asyncio.Event()

        async def on_closed() -> None:
            closed.set()

        on_n3 = await nats.connect(n3.url, user_credentials=user_creds, allow_reconnect=False,
                                   closed_cb=on_closed)
        user_pub = _user_public(user_creds)
        revoking = ji.account_jwt(acc, op, name="v2", revocations={user_pub: int(time.time())})
        await sysc.request(f"$SYS.REQ.ACCOUNT.{acc.public}.CLAIMS.UPDATE", revoking.encode(),
                           timeout=5)
        await asyncio.wait_for(closed.wait(), 10)
        assert on_n3.is_closed
        assert await _login(n2.url, user_creds) is None
        for nc in (*users.values(), sysc):
            if nc.is_connected:
                await nc.close()
    finally:
        c.stop()


def _user_public(creds_path: str) -> str:
    import base64
    import json

    text = Path(creds_path).read_text()
    token = text.split("-----BEGIN NATS USER JWT-----")[1].split("------END")[0].strip()
    body = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    return claims["sub"]

