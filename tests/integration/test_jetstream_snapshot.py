"""STREAM.SNAPSHOT / STREAM.RESTORE over the raw API, driven as the Go client (`nats stream
backup/restore`) drives it, next to nats-server: the replies (errors included), the chunk
protocol (ack replies on all chunks but the last, an empty message at the end), and a
restore into a deleted stream that brings back the messages at their sequences and times,
the interior delete, and the consumer's exact state. Each server restores its own backup
(nats-server's chunks are a compressed tar of its file store; Jetraft's its own format)."""

from __future__ import annotations

import asyncio
import json
import random
import signal
from pathlib import Path
from typing import Any

import nats
from nats.js.api import ConsumerConfig

from tests.integration.conftest import Servers
from tests.integration.jsdiff import assert_same_steps

# times are each server's own (their relation is checked: a restore keeps first_ts, and the
# state after equals the state before or not, as nats-server's does)
ALLOWED_TO_DIFFER = {"created", "ts", "leader", "last_active", "first_ts", "last_ts"}


async def _api(nc: Any, subject: str, body: Any = b"") -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return json.loads((await nc.request("$JS.API." + subject, data, timeout=10)).data)


def _no_req_level(info: dict[str, Any]) -> dict[str, Any]:
    # nats-server's restored config lacks `_nats.req.level` (its snapshot reply has only that
    # key): the one metadata key whose presence may differ after a restore
    info["config"]["metadata"].pop("_nats.req.level", None)
    return info


def _progress(info: dict[str, Any]) -> tuple[Any, ...]:
    return (info["delivered"]["consumer_seq"], info["delivered"]["stream_seq"],
            info["ack_floor"]["consumer_seq"], info["ack_floor"]["stream_seq"],
            info["num_ack_pending"], info["num_pending"])


async def _backup(nc: Any, body: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    chunks: list[Any] = []
    done = asyncio.Event()

    async def cb(msg: Any) -> None:
        chunks.append((msg.data, msg.reply))
        if msg.reply:
            await nc.publish(msg.reply, b"")  # the client's ack, as the Go client sends it
        if not msg.data:
            done.set()

    sub = await nc.subscribe(body["deliver_subject"], cb=cb)
    reply = await _api(nc, "STREAM.SNAPSHOT.S", body)
    await asyncio.wait_for(done.wait(), 10)
    await sub.unsubscribe()
    return reply, chunks


async def _script(url: str) -> list[Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: list[Any] = []
    events: list[Any] = []

    async def on_event(msg: Any) -> None:
        events.append((msg.subject, json.loads(msg.data)))

    try:
        await nc.subscribe("$JS.EVENT.ADVISORY.STREAM.>", cb=on_event)
        await js.add_stream(name="S", subjects=["s.>"])
        for i in range(40):
            await js.publish(f"s.{i % 4}", random.Random(i).randbytes(200 + 50 * i),
                             headers={"n": str(i)} if i % 3 == 0 else None)
        await js.delete_msg("S", 2)
        await js.delete_msg("S", 40)  # the last one: the restored stream still ends at 40
        await js.add_consumer("S", ConsumerConfig(durable_name="c", ack_wait=60))
        psub = await js.pull_subscribe_bind("c", "S")
        got = await psub.fetch(3, timeout=5)
        await got[0].ack_sync()
        await got[2].ack_sync()
        before = await _api(nc, "STREAM.INFO.S")
        consumer_before = await _api(nc, "CONSUMER.INFO.S.c")
        out.append(await _api(nc, "STREAM.SNAPSHOT.S", b""))
        out.append(await _api(nc, "STREAM.SNAPSHOT.NOPE", {"deliver_subject": "x"}))
        out.append(await _api(nc, "STREAM.SNAPSHOT.S", {"deliver_subject": "a b"}))
        out.append(await _api(nc, "STREAM.SNAPSHOT.S", {"deliver_subject": ""}))
        reply, chunks = await _backup(nc, {"deliver_subject": "snap.in", "chunk_size": 4096})
        out.append(reply)
        data = [c for c in chunks if c[0]]
        out.append((chunks[-1] == (b"", None) or chunks[-1][0] == b"",
                    all(r for _, r in data[:-1]), not data[-1][1], len(data) > 1))
        out.append(await _api(nc, "STREAM.RESTORE.S", {"config": {"name": "S"}, "state": {}}))
        await js.delete_stream("S")
        out.append(await _api(nc, "STREAM.RESTORE.S", b""))
        start = await _api(nc, "STREAM.RESTORE.S", {"config": before["config"],
                                                    "state": before["state"]})
        out.append((start["type"], start["deliver_subject"].startswith(
            "$JS.SNAPSHOT.RESTORE.S.")))
        final = None
        for chunk, _ in chunks:
            rep = await nc.request(start["deliver_subject"], chunk, timeout=10)
            if chunk:
                assert rep.data == b""
            else:
                final = json.loads(rep.data)
        assert final is not None
        out.append(_no_req_level(final))
        after = await _api(nc, "STREAM.INFO.S")
        out.append(_no_req_level(after))
        out.append(after["state"] == before["state"])
        consumer_after = await _api(nc, "CONSUMER.INFO.S.c")
        out.append(consumer_after)
        out.append(_progress(consumer_after) == _progress(consumer_before))
        for seq in (1, 3, 39):
            msg = await js.get_msg("S", seq)
            out.append((msg.seq, msg.subject, msg.data, dict(msg.headers or {})))
        psub = await js.pull_subscribe_bind("c", "S")
        nxt = await psub.fetch(1, timeout=5)
        out.append(nxt[0].metadata.sequence.stream)
        ack = await js.publish("s.x", b"after restore")
        out.append((ack.stream, ack.seq))
        # a damaged backup restores nothing: 500 10062 "restore failed: <why>"
        start = await _api(nc, "STREAM.RESTORE.G", {"config": {"name": "G"}, "state": {}})
        await nc.request(start["deliver_subject"], b"garbage" * 100, timeout=5)
        failed = json.loads((await nc.request(start["deliver_subject"], b"", timeout=5)).data)
        err = failed["error"]
        out.append((failed["type"], err["code"], err["err_code"],
                    err["description"].startswith("restore failed: ")))
        out.append(await _api(nc, "STREAM.INFO.G"))
        # until 1 s passed with no new advisory (at most 10 s): a loaded server sends some
        # after its replies, so a fixed 0.3 s could cut the list short
        seen_n, quiet_since = -1, 0.0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while loop.time() < deadline:
            if len(events) != seen_n:
                seen_n, quiet_since = len(events), loop.time()
            elif loop.time() - quiet_since >= 1.0:
                break
            await asyncio.sleep(0.05)
        # the advisories: snapshot create/complete, restore create/complete and the restored
        # stream's create; their keys, not their times or sizes. nats-server sends the
        # restored stream's create from another goroutine than its restore complete, so
        # the two arrive in either order there: each stream's restore events are compared
        # in order, the create advisories apart from them.
        seen = [(subject, body["type"], sorted(body), sorted(body.get("client", {})))
                for subject, body in events]
        created = [e for e in seen if e[0].startswith("$JS.EVENT.ADVISORY.STREAM.CREATED.")]
        out.append(([e for e in seen if e not in created], created))
    finally:
        await nc.close()
    return out


async def test_snapshot_and_restore_match_nats_server(servers: Servers, tmp_path: Path) -> None:
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    ours = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    their, mine = await _script(theirs.url), await _script(ours.url)
    assert_same_steps(mine, their, ALLOWED_TO_DIFFER)
    assert their[5] == (True, True, True, True) and their[13] is True
    assert their[10]["state"]["first_ts"] == their[4]["state"]["first_ts"]
    assert mine[10]["state"]["first_ts"] == mine[4]["state"]["first_ts"]
    # the restore went through the stream's log: kill -9 and the restored stream is back
    nc = await nats.connect(ours.url)
    try:
        info = await _api(nc, "STREAM.INFO.S")
        consumer = await _api(nc, "CONSUMER.INFO.S.c")
    finally:
        await nc.close()
    ours.stop(signal.SIGKILL)
    again = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    nc = await nats.connect(again.url)
    try:
        assert (await _api(nc, "STREAM.INFO.S"))["state"] == info["state"]
        assert _progress(await _api(nc, "CONSUMER.INFO.S.c")) == _progress(consumer)
    finally:
        await nc.close()
