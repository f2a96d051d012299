"""Operator mode, full resolver: a claim update that lowers an account's
connection limit closes the connections over it, as nats-server does (the
newest go first, each with `-ERR 'maximum account active connections
exceeded'`); and the system account's requests and events work there too.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any

import nats

from tests import jwt_issuer as ji
from tests.integration.test_operator_wired import _creds, _full_config, _login

IMPLS = ["nats-server", "jetraft"]


def _read_for(s: socket.socket, seconds: float) -> bytes:
    """What arrives within `seconds`, stopping early at a close."""
    out = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = s.recv(4096)
        except TimeoutError:
            break
        except OSError:
            return out + b"<closed>"
        if not chunk:
            return out + b"<closed>"
        out += chunk
    return out


async def _lower_limit(server: Any, tmp: Path, op: ji.Key, sys_: ji.Key,
                       acc: ji.Key) -> dict[str, Any]:
    sysc = await nats.connect(server.url, user_credentials=_creds(tmp, sys_, f"s{server.port}"),
                              allow_reconnect=False)

    async def update(jwt: str) -> Any:
        msg = await sysc.request(f"$SYS.REQ.ACCOUNT.{acc.public}.CLAIMS.UPDATE", jwt.encode(),
                                 timeout=5)
        return json.loads(msg.data)["data"]["code"]

    out: dict[str, Any] = {"v1": await update(ji.account_jwt(acc, op, name="v1"))}
    socks = []
    for _ in range(3):
        user = ji.user_key()
        s, first = _login(server.port, ji.user_jwt(user, acc), user)
        socks.append(s)
        await asyncio.sleep(0.05)  # distinct start times: the newest go first
    await asyncio.to_thread(lambda: [_read_for(s, 0.3) for s in socks])  # PONGs
    limited = ji.account_jwt(acc, op, name="v2", limits={
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": True, "conn": 1, "leaf": -1})
    out["v2"] = await update(limited)
    seen = await asyncio.to_thread(lambda: [_read_for(s, 1.5) for s in socks])
    out["connections"] = [x.replace(b"PING\r\n", b"").decode() for x in seen]
    conns = await sysc.request(f"$SYS.REQ.ACCOUNT.{acc.public}.CONNZ", b"", timeout=5)
    out["connz"] = json.loads(conns.data)["data"]["num_connections"]
    for s in socks:
        s.close()
    await sysc.close()
    return out


def test_lowering_the_connection_limit_closes_the_newest_like_nats_server(
        servers: Any, tmp_path: Path) -> None:
    op, sys_, acc = ji.operator_key(), ji.account_key(), ji.account_key()
    seen = {}
    for impl, start in (("nats-server", servers.nats_server), ("jetraft", servers.jetraft)):
        srv = start(_full_config(tmp_path, op, sys_, impl))
        seen[impl] = asyncio.run(_lower_limit(srv, tmp_path, op, sys_, acc))
        srv.stop()
    assert seen["jetraft"] == seen["nats-server"]
    over = "-ERR 'maximum account active connections exceeded'\r\n<closed>"
    assert seen["nats-server"]["connections"] == ["", over, over]
    assert seen["nats-server"]["connz"] == 1
