"""Chained service imports against nats-server 2.15: A imports a service from
B, which imports it from C. The request reaches C's responder, the reply comes
back to A, and what B's own subscriber sees is the same on both servers."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import pytest

CONFIG = """
accounts {
  A: { users: [{user: a, password: a}]
       imports: [{service: {account: B, subject: "svc.>"}, to: "ask.>"}] }
  B: { users: [{user: b, password: b}]
       exports: [{service: "svc.>"}]
       imports: [{service: {account: C, subject: "deep.>"}, to: "svc.>"}] }
  C: { users: [{user: c, password: c}]
       exports: [{service: "deep.>", response_type: stream}] }
}
"""


@pytest.fixture(scope="module")
def both(module_servers: Any) -> dict[str, Any]:
    return module_servers.both(CONFIG)


async def _chain(server: Any) -> dict[str, Any]:
    def url(u: str) -> str:
        return f"nats://{u}:{u}@127.0.0.1:{server.port}"

    a, b, c = [await nats.connect(url(u), allow_reconnect=False) for u in "abc"]
    seen: dict[str, list[str]] = {"b": [], "c": []}

    async def on_b(msg: Any) -> None:
        seen["b"].append(msg.subject)

    answered: list[str] = []

    async def on_c(msg: Any) -> None:
        seen["c"].append(msg.subject)
        await c.publish(msg.reply, b"from c:" + msg.subject.encode())
        await c.publish(msg.reply, b"second")  # a stream export: both may pass C's hop
        answered.append(msg.subject)

    await b.subscribe(">", cb=on_b)
    await c.subscribe("deep.>", cb=on_c)
    for nc in (a, b, c):
        await nc.flush()
    await asyncio.sleep(0.3)  # nats-server makes service subscriptions visible lazily
    out: dict[str, Any] = {}
    try:
        out["reply"] = (await a.request("ask.x", b"q", timeout=3)).data.decode()
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError) as err:
        out["reply"] = type(err).__name__
    inbox = a.new_inbox()
    replies: list[bytes] = []

    async def on_reply(msg: Any) -> None:
        replies.append(msg.data)

    await a.subscribe(inbox, cb=on_reply)
    await a.publish("ask.y", b"q", reply=inbox)
    await a.flush()
    await asyncio.sleep(0.5)
    # Under load the request reaches C, and C's replies reach A, later than 0.5 s: wait
    # (bounded) until C answered, then for C's publishes to pass the server (C's round trip)
    # and for what the server queued for B and A before their own round trips.
    deadline = asyncio.get_running_loop().time() + 10
    while "deep.y" not in answered and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)  # (past the bound: whatever came is compared)
    for nc in (c, b, a):
        await nc.flush()
    await asyncio.sleep(0.1)  # the subscriptions' callbacks
    out["replies"] = sorted(r.decode() for r in replies)
    out["b_saw"] = sorted(s for s in seen["b"] if not s.startswith("_R_"))
    out["c_saw"] = sorted(seen["c"])
    for nc in (a, b, c):
        await nc.close()
    return out


def test_chained_service_import_like_nats_server(both: dict[str, Any]) -> None:
    seen = {impl: asyncio.run(_chain(s)) for impl, s in both.items()}
    assert seen["jetraft"] == seen["nats-server"]
    assert seen["nats-server"]["reply"] == "from c:deep.x"
