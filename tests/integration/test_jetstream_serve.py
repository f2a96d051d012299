"""`jetraft serve -js` with real nats-py clients over TCP, next to `nats-server -js`.

The same script runs against both servers and the whole JSON of every `$JS.API` reply is
compared; only the keys in ALLOWED_TO_DIFFER (times the servers make up) may differ. Then
restarts: SIGTERM and kill -9 keep every acknowledged message and the consumers' ack floors.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import nats
import pytest

from tests.integration.conftest import RawConn, ServerProc, Servers
from tests.integration.jsdiff import kv_history, kv_keys, watch_initial, watch_next
from tests.jetstream import test_batch_differential as batch_script

# `leader` is each server's own (random) name.
ALLOWED_TO_DIFFER = {"created", "ts", "first_ts", "last_ts", "last_active", "time", "leader"}


def _strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in ALLOWED_TO_DIFFER}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _js_server(servers: Servers, store: Path) -> ServerProc:
    return servers.jetraft(args=["-js", "-sd", str(store)])


async def _api(nc: Any, subject: str, body: Any = b"") -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await nc.request("$JS.API." + subject, data, timeout=10)
    return json.loads(msg.data)


def test_info_advertises_jetstream_as_nats_server(servers: Servers, tmp_path: Path) -> None:
    ours = _js_server(servers, tmp_path / "ours")
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    keys = ("max_payload", "jetstream", "client_id", "client_ip", "api_lvl")
    infos = [RawConn(s.port).info for s in (ours, theirs)]
    assert [k for k in infos[0] if k in keys] == [k for k in infos[1] if k in keys]
    assert (infos[0]["jetstream"], infos[0]["api_lvl"]) == (True, 5) == \
        (infos[1]["jetstream"], infos[1]["api_lvl"])


async def _script(url: str) -> list[Any]:
    """Streams, publishes, gets, a pull consumer with acks, deletes and purges: every reply."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: list[Any] = []
    try:
        out.append(await _api(nc, "STREAM.CREATE.ORD", {"name": "ORD", "subjects": ["o.>"]}))
        out.append(await _api(nc, "STREAM.CREATE.BAD", {"name": "BAD", "subjects": ["o.x"]}))
        for i in range(6):
            ack = await js.publish(f"o.{'ab'[i % 2]}", f"m{i}".encode(),
                                   headers={"k": str(i)} if i == 4 else None)
            out.append((ack.stream, ack.seq, ack.duplicate))
        out.append(await _api(nc, "STREAM.MSG.GET.ORD", {"seq": 5}))
        out.append(await _api(nc, "STREAM.MSG.GET.ORD", {"last_by_subj": "o.a"}))
        out.append(await _api(nc, "STREAM.MSG.GET.ORD", {"seq": 99}))
        out.append(await _api(nc, "STREAM.MSG.GET.NOPE", {"seq": 1}))
        out.append(await _api(nc, "CONSUMER.CREATE.ORD.dur", {"stream_name": "ORD", "config": {
            "durable_name": "dur", "ack_policy": "explicit", "filter_subject": "o.>"}}))
        psub = await js.pull_subscribe("o.>", "dur", stream="ORD")
        msgs = await psub.fetch(4, timeout=5)
        out.append([(m.subject, m.data, m.metadata.sequence.stream,
                     m.metadata.sequence.consumer, m.metadata.num_pending) for m in msgs])
        await msgs[0].ack_sync()
        await msgs[1].ack_sync()
        await msgs[3].ack_sync()
        out.append(await _api(nc, "CONSUMER.INFO.ORD.dur"))
        out.append(await _api(nc, "CONSUMER.INFO.ORD.nope"))
        out.append(await _api(nc, "CONSUMER.NAMES.ORD"))
        out.append(await _api(nc, "STREAM.LEADER.STEPDOWN.ORD"))
        out.append(await _api(nc, "CONSUMER.LEADER.STEPDOWN.ORD.dur"))
        out.append(await _api(nc, "STREAM.MSG.DELETE.ORD", {"seq": 6}))
        out.append(await _api(nc, "STREAM.INFO.ORD"))
        out.append(await _api(nc, "STREAM.NAMES"))
        out.append(await _api(nc, "STREAM.PURGE.ORD", {"filter": "o.a"}))
        out.append(await _api(nc, "STREAM.INFO.ORD", {"subjects_filter": ">"}))
        out.append(await _api(nc, "CONSUMER.DELETE.ORD.dur"))
        out.append(await _api(nc, "STREAM.DELETE.ORD"))
        out.append(await _api(nc, "STREAM.INFO.ORD"))
    finally:
        await nc.close()
    return out


async def test_script_matches_nats_server(servers: Servers, tmp_path: Path) -> None:
    ours = _js_server(servers, tmp_path / "ours")
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    mine, their = await _script(ours.url), await _script(theirs.url)
    diffs = [f"step {i}:\n  ours:   {_strip(a)}\n  theirs: {_strip(b)}"
             for i, (a, b) in enumerate(zip(mine, their, strict=True)) if _strip(a) != _strip(b)]
    assert not diffs, "\n".join(diffs)


async def _fill(url: str, n: int) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name="R", subjects=["r.*"])
    for i in range(n):
        ack = await js.publish("r.x", f"{i}".encode())
        assert ack.seq == i + 1
    psub = await js.pull_subscribe("r.*", "keep", stream="R")
    msgs = await psub.fetch(10, timeout=5)
    for m in msgs[:5]:
        await m.ack_sync()  # confirmed: must survive any restart
    await js.add_stream(name="GONE", subjects=["g"])
    await js.publish("g", b"x")
    await js.delete_stream("GONE")  # the delete is an entry too: it stays deleted
    await nc.close()


async def _check_after_restart(url: str, n: int) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        info = await js.stream_info("R")
        assert (info.state.messages, info.state.first_seq, info.state.last_seq) == (n, 1, n)
        for seq in range(1, n + 1):
            assert (await js.get_msg("R", seq)).data == f"{seq - 1}".encode()
        ci = await js.consumer_info("R", "keep")
        assert (ci.ack_floor.stream_seq, ci.delivered.stream_seq) == (5, 10)
        assert (ci.num_ack_pending, ci.num_pending) == (5, n - 10)
        psub = await js.pull_subscribe("r.*", "keep", stream="R")
        msgs = await psub.fetch(1, timeout=5)
        assert msgs[0].metadata.sequence.stream == 11  # the next new one, nothing skipped
        ack = await js.publish("r.x", b"after")
        assert ack.seq == n + 1
        assert (await _api(nc, "STREAM.NAMES"))["streams"] == ["R"]
    finally:
        await nc.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill9"])
async def test_restart_keeps_acked_messages_and_ack_floor(servers: Servers, tmp_path: Path,
                                                           sig: int) -> None:
    store = tmp_path / "store"
    first = _js_server(servers, store)
    await _fill(first.url, 30)
    first.stop(sig)
    second = _js_server(servers, store)
    await _check_after_restart(second.url, 30)


# --------------------------------------------------------------------------- kill -9 loop

KILL_CYCLES = int(os.environ.get("JS_KILL_CYCLES", "3"))  # 50 by hand
PUBLISHERS = 3
WORKER = nats.js.api.ConsumerConfig(ack_wait=1.0)  # unacked ones come back within a second


async def _publisher(js: Any, tag: str, acked: list[tuple[int, str]]) -> None:
    """Publish `<tag>:<i>` for i = 0, 1, ... in order; record (seq, payload) of every PubAck.
    The tag (publisher, cycle) keeps payloads unique across restarts."""
    i = 0
    while True:
        payload = f"{tag}:{i:06d}"
        try:
            ack = await js.publish("k.x", payload.encode(), timeout=2)
        except Exception:  # noqa: BLE001 - the node was killed under us
            return
        acked.append((ack.seq, payload))
        i += 1


async def _acker(js: Any, confirmed: list[int], tried: list[int]) -> None:
    """Fetch and double-ack in order; record every stream seq whose ack was sent (`tried`)
    and whose ack was confirmed."""
    try:
        psub = await js.pull_subscribe("k.x", "worker", stream="K", config=WORKER)
        while True:
            for m in await psub.fetch(5, timeout=1):
                tried.append(m.metadata.sequence.stream)
                await m.ack_sync(timeout=2)
                confirmed.append(m.metadata.sequence.stream)
    except Exception:  # noqa: BLE001 - killed, or a fetch timed out at the very end
        return


async def _cycle(cycle: int, url: str, rng: random.Random, acked: list[tuple[int, str]],
                 confirmed: list[int], tried: list[int], proc: ServerProc) -> None:
    nc = await nats.connect(url, allow_reconnect=False)
    js = nc.jetstream()
    await js.add_stream(name="K", subjects=["k.*"])  # an identical re-create is a no-op
    tasks = [asyncio.ensure_future(_publisher(js, f"{w}:{cycle:03d}", acked))
             for w in range(PUBLISHERS)]
    tasks.append(asyncio.ensure_future(_acker(js, confirmed, tried)))
    await asyncio.sleep(rng.uniform(0.3, 1.5))
    proc.stop(signal.SIGKILL)
    await asyncio.wait(tasks, timeout=15)
    try:
        await nc.close()
    except Exception:  # noqa: BLE001 - the connection is already gone
        pass


async def test_kill_9_loop_keeps_every_acked_message_once_in_order(
        servers: Servers, tmp_path: Path) -> None:
    store = tmp_path / "store"
    seed = int(os.environ.get("JS_KILL_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    acked: list[tuple[int, str]] = []
    confirmed: list[int] = []
    tried: list[int] = []
    for cycle in range(KILL_CYCLES):
        proc = _js_server(servers, store)
        await _cycle(cycle, proc.url, rng, acked, confirmed, tried, proc)
    final = _js_server(servers, store)
    nc = await nats.connect(final.url)
    js = nc.jetstream()
    try:
        info = await js.stream_info("K")
        stored: dict[int, str] = {}
        for seq in range(1, info.state.last_seq + 1):
            stored[seq] = (await js.get_msg("K", seq)).data.decode()
        rest = await _drain(js)
    finally:
        await nc.close()
    assert acked, f"seed {seed}: nothing was acknowledged"
    for seq, payload in acked:  # present, at the sequence its PubAck named
        got = stored.get(seq)
        assert got == payload, f"seed {seed}: acked {payload}@{seq} holds {got}"
    payloads = list(stored.values())
    assert len(payloads) == len(set(payloads)), f"seed {seed}: a message is stored twice"
    for w in range(PUBLISHERS):  # each publisher's messages in its order (cycle, i)
        mine = [p for p in payloads if p.startswith(f"{w}:")]
        assert mine == sorted(mine), f"seed {seed}: publisher {w} out of order"
    # The consumer never hands out again a message whose ack was confirmed, and never
    # skips one nobody acked: all that is not left over had its ack at least sent (an ack
    # applied just before the kill may have lost only its confirmation).
    assert not set(rest) & set(confirmed), f"seed {seed}: a confirmed ack was lost"
    gone = set(stored) - set(rest) - set(confirmed)
    assert gone <= set(tried), f"seed {seed}: skipped without an ack: {sorted(gone - set(tried))}"
    assert len(rest) == len(set(rest)), f"seed {seed}: the drain got a message twice"


async def _drain(js: Any) -> list[int]:
    """Fetch and ack until the consumer has nothing left, redeliveries included."""
    psub = await js.pull_subscribe("k.x", "worker", stream="K", config=WORKER)
    got: list[int] = []
    idle = 0
    while idle < 3:  # ack_wait is 1 s: three empty 1 s fetches in a row mean nothing is left
        try:
            msgs = await psub.fetch(100, timeout=1)
        except nats.errors.TimeoutError:
            msgs = []
        idle = 0 if msgs else idle + 1  # an expired request may also end with no messages
        for m in msgs:
            await m.ack_sync()
            got.append(m.metadata.sequence.stream)
    return got


async def test_wal_compaction_below_lmdb_then_kill_9(servers: Servers, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With a compaction every 50 entries, acked publishes compact the WAL; after kill -9
    every message is still there (LMDB held what the WAL dropped)."""
    monkeypatch.setenv("JETRAFT_JS_SNAPSHOT_EVERY", "50")
    store = tmp_path / "store"
    first = _js_server(servers, store)
    nc = await nats.connect(first.url)
    js = nc.jetstream()
    await js.add_stream(name="C", subjects=["c"])
    snap_dir = store / "raft" / "snap"
    acks: list[Any] = []
    # until a snapshot is committed (the image is written async); the 100 publishes of a
    # round are merged into a few STREAM_MSGS entries, so 50 rounds were not always enough
    for _round in range(200):
        acks += await asyncio.gather(*(js.publish("c", f"{len(acks) + i}".encode())
                                       for i in range(100)))
        if any(p.suffix == ".meta" for p in snap_dir.iterdir()):
            break
    acks += await asyncio.gather(*(js.publish("c", f"{len(acks) + i}".encode())
                                   for i in range(100)))  # more on top of the compaction
    await nc.close()
    first.stop(signal.SIGKILL)
    assert any(p.suffix == ".meta" for p in snap_dir.iterdir())  # it did compact
    second = _js_server(servers, store)
    nc = await nats.connect(second.url)
    js = nc.jetstream()
    try:
        got = [int((await js.get_msg("C", ack.seq)).data) for ack in acks]
        assert sorted(got) == list(range(len(acks)))
    finally:
        await nc.close()


async def _kv_script(url: str) -> list[Any]:
    """Key/Value as nats-py drives it, and a durable push consumer."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: list[Any] = []
    try:
        kv = await js.create_key_value(bucket="cfg", history=3)
        out += [await kv.put("a", b"1"), await kv.put("a", b"2"), await kv.put("b", b"x")]
        entry = await kv.get("a")
        out.append((entry.key, entry.value, entry.revision))
        out.append(await kv.create("c", b"new"))
        for call in (kv.create("c", b"again"), kv.update("c", b"u", last=1)):
            try:
                await call
            except nats.js.errors.KeyWrongLastSequenceError as err:
                out.append(("wrong last", err.description))
        out.append(await kv.update("c", b"upd", last=4))
        await kv.delete("b")
        try:
            await kv.get("b")
        except nats.js.errors.KeyNotFoundError:
            out.append("b deleted")
        for i in range(3, 6):
            await kv.put("a", f"{i}".encode())
        out.append(sorted(await kv_keys(kv)))
        out.append([(e.value, e.revision) for e in await kv_history(kv, "a")])  # 3 kept
        watch = await kv.watchall()
        seen = [(e.key, e.value, e.operation) for e in await watch_initial(watch)]
        await kv.put("z", b"9")
        e = await watch_next(watch)
        seen.append((e.key, e.value, e.revision))
        out.append(seen)
        status = await kv.status()
        out.append((status.values, status.history, status.bucket))
        sub = await js.subscribe("$KV.cfg.>", durable="pushd")
        for _ in range(3):
            m = await sub.next_msg(timeout=5)
            out.append((m.subject, m.data, m.metadata.sequence.stream, m.metadata.num_pending))
            await m.ack_sync()
        info = await js.consumer_info("KV_cfg", "pushd")
        out.append((info.ack_floor.stream_seq, info.num_ack_pending, info.num_pending))
    finally:
        await nc.close()
    return out


async def test_key_value_and_push_consumer_match_nats_server(servers: Servers,
                                                            tmp_path: Path) -> None:
    ours = _js_server(servers, tmp_path / "ours")
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    their = await _kv_script(theirs.url)
    mine = await _kv_script(ours.url)
    assert mine == their


async def test_inactive_consumers_are_deleted_as_in_nats_server(servers: Servers,
                                                                tmp_path: Path) -> None:
    """An ephemeral (and a durable with inactive_threshold) nobody uses goes away; a plain
    durable stays. Same answers from both servers."""
    results = []
    for srv in (_js_server(servers, tmp_path / "ours"),
                servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])):
        nc = await nats.connect(srv.url)
        try:
            await _api(nc, "STREAM.CREATE.I", {"name": "I", "subjects": ["i"]})
            for name, extra in (("eph", {}), ("lazy", {"durable_name": "lazy"}),
                                ("keep", {"durable_name": "keep"})):
                cfg = {"ack_policy": "explicit", **extra}
                if name != "keep":
                    cfg["inactive_threshold"] = 500_000_000
                await _api(nc, f"CONSUMER.CREATE.I.{name}", {"stream_name": "I", "config": cfg})
            await asyncio.sleep(2.5)
            names = await _api(nc, "CONSUMER.NAMES.I")
            results.append(names["consumers"])
        finally:
            await nc.close()
    assert results[0] == results[1] == ["keep"]


BAD_BODIES = [b"", b"{", b"[]", b"null", b"42", b'"x"', b'{"name": 5}', b'{"config": []}',
              b'{"stream_name": "F", "config": {"durable_name": 7}}', b'{"seq": -1}',
              b'{"batch": "x", "expires": -5}', b"\xff\xfe", b'{"filter": 1, "keep": "a"}',
              b'{"offset": -3, "subject": 9}', b'{"last_by_subj": "a.*.>", "seq": 2}']
API_SUBJECTS = ["INFO", "STREAM.CREATE.F", "STREAM.UPDATE.F", "STREAM.INFO.F", "STREAM.NAMES",
                "STREAM.LIST", "STREAM.MSG.GET.F", "STREAM.MSG.DELETE.F", "STREAM.PURGE.F",
                "CONSUMER.CREATE.F", "CONSUMER.CREATE.F.c", "CONSUMER.DURABLE.CREATE.F.c",
                "CONSUMER.INFO.F.c", "CONSUMER.NAMES.F", "CONSUMER.LIST.F",
                "CONSUMER.MSG.NEXT.F.c", "DIRECT.GET.F", "CONSUMER.DELETE.F.c",
                "STREAM.DELETE.F"]


async def test_bad_api_requests_get_answers_and_harm_nothing(servers: Servers,
                                                             tmp_path: Path) -> None:
    srv = _js_server(servers, tmp_path / "store")
    nc = await nats.connect(srv.url)
    js = nc.jetstream()
    try:
        await js.add_stream(name="F", subjects=["f.>"], allow_direct=True)
        await js.add_consumer("F", durable_name="c", ack_policy="explicit")
        for i in range(5):
            await js.publish("f.x", f"{i}".encode())
        unanswered = []
        for subject in API_SUBJECTS:
            if subject.startswith("STREAM.DELETE") or subject.startswith("CONSUMER.DELETE"):
                continue  # the garbage must not delete what we check below
            for body in BAD_BODIES:
                waits = subject.startswith("CONSUMER.MSG.NEXT")  # a pull request may wait
                try:
                    await nc.request("$JS.API." + subject, body, timeout=0.5 if waits else 5)
                except nats.errors.TimeoutError:
                    unanswered.append((subject, body))
        # A pull request may legitimately wait (it has no expiry); everything else answers.
        assert all(s.startswith("CONSUMER.MSG.NEXT") for s, _ in unanswered), unanswered
        assert srv.alive()
        info = await js.stream_info("F")
        assert info.state.messages <= 5 and info.state.last_seq == 5
        assert "[ERR]" not in srv.log_text(), srv.log_text()[-2000:]
        assert (await js.publish("f.y", b"still")).seq == 6
    finally:
        await nc.close()


async def test_memory_stream_is_gone_after_restart_as_in_nats_server(
        servers: Servers, tmp_path: Path) -> None:
    results = []
    for kind in ("ours", "theirs"):
        store = tmp_path / kind

        def start(store: Path = store, kind: str = kind) -> ServerProc:
            if kind == "ours":
                return _js_server(servers, store)
            return servers.nats_server(args=["-js", "-sd", str(store)])

        srv = start()
        nc = await nats.connect(srv.url)
        js = nc.jetstream()
        await js.add_stream(name="M", subjects=["m"], storage="memory")
        await js.add_stream(name="FILE", subjects=["f"])
        for _ in range(3):
            await js.publish("m", b"x")
        await nc.close()
        srv.stop(signal.SIGTERM)
        srv = start()
        nc = await nats.connect(srv.url)
        try:
            results.append((await _api(nc, "STREAM.NAMES"), await _api(nc, "STREAM.INFO.M")))
        finally:
            await nc.close()
    assert _strip(results[0]) == _strip(results[1])


async def test_atomic_batch_publish_matches_nats_server(servers: Servers, tmp_path: Path) -> None:
    """The pure test's batch script (tests/jetstream/test_batch_differential.py) over TCP to
    both servers: every reply, the stream state and every stored message."""
    ours = _js_server(servers, tmp_path / "ours")
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    mine = await batch_script._oracle(ours.port)
    their = await batch_script._oracle(theirs.port)
    for step, a, b in zip(batch_script.STEPS, mine[0], their[0], strict=True):
        assert batch_script._norm(a) == batch_script._norm(b), step
    assert mine[1] == their[1]
