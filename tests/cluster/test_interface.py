"""The interface jscluster builds on (docs/notes/routes.md): two real nodes in
one event loop, talking over their real gRPC cluster ports."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from node.cluster import RequestError
from node.options import ClusterOptions, JetStreamOptions, Options
from node.server import Server
from raft.types import Message, MsgType
from tests.ports import free_port


def _opts(name: str, cport: int, seeds: list[int], store: Path | None = None) -> Options:
    o = Options(host="127.0.0.1", port=-1, server_name=name, server_tags=[f"az:{name}"])
    o.cluster = ClusterOptions(name="T", host="127.0.0.1", port=cport,
                               routes=[f"nats-route://127.0.0.1:{p}" for p in seeds])
    if store is not None:
        o.jetstream = JetStreamOptions(enabled=False, store_dir=str(store))
    return o


async def _until(cond, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.02)


@pytest.mark.asyncio
async def test_members_request_and_raft_transport() -> None:
    p1, p2 = free_port(), free_port()
    s1 = Server(_opts("a", p1, [p2]))
    s2 = Server(_opts("b", p2, [p1]))
    await s1.start()
    await s2.start()
    try:
        c1, c2 = s1.cluster, s2.cluster
        seen: list[tuple[int, bool]] = []
        c1.on_members(lambda m: seen.append((m.peer_id, m.up)))
        await _until(lambda: c2.self_id in c1.members() and c1.members()[c2.self_id].up
                     and c1.self_id in c2.members() and c2.members()[c1.self_id].up)
        m2 = c1.members()[c2.self_id]
        assert m2.name == "b" and m2.cluster_addr == f"127.0.0.1:{p2}"
        assert m2.tags == ["az:b"] and m2.client_url == f"127.0.0.1:{s2.port}"
        assert c1.members()[c1.self_id].is_self

        async def echo(frm: int, payload: bytes) -> bytes:
            assert frm == c1.self_id
            return b"echo:" + payload

        c2.handle("echo", echo)
        assert await c1.request(c2.self_id, "echo", b"x", timeout=2) == b"echo:x"
        with pytest.raises(RequestError):
            await c1.request(c2.self_id, "nope", b"", timeout=2)
        with pytest.raises(RequestError):
            await c1.request(12345, "echo", b"", timeout=2)

        got: list[Message] = []
        t1 = c1.raft_transport(lambda msgs: None)
        t2 = c2.raft_transport(got.extend)
        await t1.start()
        await t2.start()
        t1.add_peer(c2.self_id, m2.cluster_addr)
        t2.add_peer(c1.self_id, c1.members()[c1.self_id].cluster_addr)
        await _until(lambda: t1.lanes_up(c2.self_id) == 2 and t2.lanes_up(c1.self_id) == 2)
        t1.send([Message(MsgType.HEARTBEAT, "g", frm=c1.self_id, to=c2.self_id, term=3)])
        await _until(lambda: any(m.type == MsgType.HEARTBEAT for m in got))
        await t1.stop()
        await t2.stop()
    finally:
        await s2._close_everything()
    # c1 sees b go down once its process is gone.
    await _until(lambda: not s1.cluster.members()[s2.cluster.self_id].up)
    assert (s2.cluster.self_id, False) in seen
    await s1._close_everything()


def test_identity_persists_and_a_wiped_dir_gets_a_new_one(tmp_path: Path) -> None:
    from node.cluster.identity import load_or_create

    d = tmp_path / "cluster"
    a = load_or_create(str(d))
    assert a == load_or_create(str(d)) and 0 < a < 1 << 63
    (d / "identity").unlink()
    assert load_or_create(str(d)) != a
    (d / "identity").write_text("zz\n")
    with pytest.raises(ValueError):
        load_or_create(str(d))
