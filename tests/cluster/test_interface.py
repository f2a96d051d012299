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

        # A JetStream-style delivery: matched on the inbox, shown with the stored subject.
        seen: list[tuple[str, bytes]] = []
        s2.subscribe_internal("_INBOX.pull", lambda sub, subj, rep, h, p: seen.append((subj, p)))
        await _until(lambda: s1.global_account.has_interest("_INBOX.pull"))
        assert not s1.global_account.sublist.has_interest("_INBOX.pull")  # local: none
        s1.global_account.deliver_as(None, "_INBOX.pull", "orders.1", None, None, b"m1")
        await _until(lambda: seen == [("orders.1", b"m1")])
        # 10,000 interest changes in one loop turn cross in several batches.
        for i in range(10_000):
            s2.subscribe_internal(f"many.{i}", lambda *a: None)
        await _until(lambda: s1.global_account.has_interest("many.9999"))

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


async def test_no_advertise_and_websocket_urls() -> None:
    from node.auth import CONN_WEBSOCKET
    from node.client import Client, Kind
    from node.options import WebsocketOptions

    p1, p2, p3 = free_port(), free_port(), free_port()
    o1 = _opts("a", p1, [p2, p3])
    o1.websocket = WebsocketOptions(host="127.0.0.1", port=free_port(), no_tls=True)
    o2 = _opts("b", p2, [p1])
    o2.cluster.no_advertise = True  # b is a member, but clients are not told about it
    o3 = _opts("c", p3, [p1])
    o3.websocket = WebsocketOptions(host="127.0.0.1", port=free_port(), no_tls=True)
    servers = [Server(o) for o in (o1, o2, o3)]
    for s in servers:
        await s.start()
    try:
        s1, s2, s3 = servers
        await _until(lambda: all(m.up for m in s1.cluster.members().values())
                     and len(s1.cluster.members()) == 3)
        await _until(lambda: len(s1.cluster.connect_urls()[0]) == 2)
        urls, ws = s1.cluster.connect_urls()
        assert urls == [f"127.0.0.1:{s1.port}", f"127.0.0.1:{s3.port}"]  # no b
        assert ws == [f"127.0.0.1:{s1.ws_port}", f"127.0.0.1:{s3.ws_port}"]
        ws_client = Client(s1, Kind.CLIENT, CONN_WEBSOCKET)
        info = s1.info_for(ws_client)
        assert info["ws_connect_urls"] == ws and "connect_urls" not in info
        assert s1.info_for(Client(s1, Kind.CLIENT))["connect_urls"] == urls
        # A no_advertise node tells its own clients nothing either (nats-server).
        assert s2.cluster.connect_urls() == ([], [])
        assert "connect_urls" not in s2.info_for(Client(s2, Kind.CLIENT))
    finally:
        for s in servers:
            await s._close_everything()
