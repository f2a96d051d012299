"""Mirrors and sources: the same nats-py script against `nats-server -js` and `jetraft serve
-js`, whole JSON replies compared; then kill -9 while a mirror and a source catch up.

Fields that may differ (ALLOWED_TO_DIFFER): times the servers make up, the leader's name,
and `active` (nanoseconds since the origin was last heard from: only its sign, "never" (-1)
or "heard", is compared). A source's origin identity (the last token of its
`Nats-Stream-Source` header) names the origin's incarnation and differs per server.
Messages that several sources interleave are compared per source, in origin order (the
interleaving between two sources is a race in nats-server too).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import pytest

from tests.integration.conftest import ServerProc, Servers
from tests.integration.jsdiff import kv_history

ALLOWED_TO_DIFFER = {"created", "ts", "first_ts", "last_ts", "time", "leader",
                     "opt_start_time"}
CONVERGE_S = 20.0


def _strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in ALLOWED_TO_DIFFER:
                continue
            out[k] = (v > 0 if v != -1 else -1) if k == "active" else _strip(v)
            if k == "sources" and v and isinstance(v[0], dict) and "lag" in v[0]:
                # nats-server builds the info list from a Go map: its order is random
                out[k] = sorted(out[k], key=lambda b: json.dumps(b, sort_keys=True))
        return out
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


async def _api(nc: Any, subject: str, body: Any = b"") -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await nc.request("$JS.API." + subject, data, timeout=10)
    return json.loads(msg.data)


async def _info(nc: Any, name: str) -> dict[str, Any]:
    return await _api(nc, "STREAM.INFO." + name)


async def _settle(nc: Any, name: str, last_seq: int = 0, msgs: int = -1,
                  heard: bool = True) -> dict[str, Any]:
    """STREAM.INFO once the stream reached `last_seq` / `msgs` and its origins were heard."""
    deadline = time.monotonic() + CONVERGE_S
    while True:
        info = await _info(nc, name)
        state = info.get("state", {})
        blocks = ([info["mirror"]] if "mirror" in info else []) + info.get("sources", [])
        if state.get("last_seq", 0) >= last_seq and (msgs < 0 or state.get("messages") == msgs) \
                and (not heard or all(b["active"] >= 0 for b in blocks)):
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} did not converge: {info}")
        await asyncio.sleep(0.1)


def _ident_free(hdrs: str | None) -> str | None:
    if not hdrs:
        return None
    text = base64.b64decode(hdrs).decode()
    lines = []
    for line in text.split("\r\n"):
        if line.startswith("Nats-Stream-Source:"):
            line = line.rsplit(" ", 1)[0]  # the origin identity differs per server
        lines.append(line)
    return "\r\n".join(lines)


async def _messages(nc: Any, name: str, last: int) -> list[Any]:
    out = []
    for seq in range(1, last + 1):
        r = await _api(nc, f"STREAM.MSG.GET.{name}", {"seq": seq})
        m = r.get("message")
        if m is not None:
            out.append((m["seq"], m["subject"], base64.b64decode(m.get("data", "")),
                        _ident_free(m.get("hdrs")), m["time"]))
    return out


def _rfc3339_now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


async def _script(url: str) -> list[Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: list[Any] = []

    async def step(what: Any) -> None:
        out.append(what)

    try:
        await step(await _api(nc, "STREAM.CREATE.O", {"name": "O", "subjects": ["o.>"]}))
        await step(await _api(nc, "STREAM.CREATE.P", {"name": "P", "subjects": ["p.>"]}))
        for i in range(3):
            await js.publish(f"o.{'ab'[i % 2]}", f"o{i}".encode(),
                             headers={"h": "1"} if i == 1 else None)
            await js.publish(f"p.{'xy'[i % 2]}", f"p{i}".encode())
        await asyncio.sleep(0.2)
        start_time = _rfc3339_now()
        await asyncio.sleep(0.2)
        for i in range(3, 6):
            await js.publish(f"o.{'ab'[i % 2]}", f"o{i}".encode())
        await step(await _api(nc, "STREAM.MSG.DELETE.O", {"seq": 2}))
        creates = {
            "M": {"name": "M", "mirror": {"name": "O"}},
            "MS": {"name": "MS", "mirror": {"name": "O", "opt_start_seq": 3}},
            "MF": {"name": "MF", "mirror": {"name": "O", "filter_subject": "o.a"}},
            "MT": {"name": "MT", "mirror": {"name": "O", "opt_start_time": start_time}},
            "MX": {"name": "MX", "mirror": {"name": "NOPE"}},
            "MR": {"name": "MR", "mirror": {"name": "O", "subject_transforms": [
                {"src": "o.a", "dest": "r.a"}, {"src": "o.b", "dest": ""}]}},
            "S": {"name": "S", "subjects": ["s.>"], "sources": [
                {"name": "O", "subject_transforms": [{"src": "o.*", "dest": "s.o.$1"}]},
                {"name": "P", "filter_subject": "p.x"}]},
            "ST": {"name": "ST", "sources": [{"name": "O", "opt_start_time": start_time}]},
            "SS": {"name": "SS", "sources": [{"name": "P", "opt_start_seq": 2}]},
        }
        for name, cfg in creates.items():
            reply = await _api(nc, f"STREAM.CREATE.{name}", cfg)
            for block in [reply.get("mirror")] + reply.get("sources", []):
                if block:
                    block.pop("active")  # -1 or not yet: the setup races the reply
            await step(reply)
        targets = {"M": (6, 5), "MS": (6, 4), "MF": (5, 3), "MT": (6, 3), "MR": (6, 5),
                   "S": (7, 7),
                   "ST": (3, 3), "SS": (2, 2)}
        for name, (last, count) in targets.items():
            info = await _settle(nc, name, last, count)
            await step(info)
        mx = await _settle(nc, "MX", heard=False)
        deadline = time.monotonic() + CONVERGE_S
        while "error" not in mx["mirror"] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            mx = await _info(nc, "MX")
        await step(mx)
        listed = await _api(nc, "STREAM.LIST")  # live mirror / sources blocks too
        await step([{"name": x["config"]["name"], "keys": list(x), "mirror": x.get("mirror"),
                     "sources": x.get("sources")} for x in listed["streams"]])
        origin = await _messages(nc, "O", 6)
        for name in ("M", "MS", "MF", "MT", "MR"):
            mirrored = await _messages(nc, name, 6)
            # a mirror keeps the origin's seq, data, headers AND time (subject: transformed)
            await step([m[:4] for m in mirrored])
            await step(all((m[0], m[2], m[4]) in {(o[0], o[2], o[4]) for o in origin}
                           for m in mirrored))
        for name in ("S", "ST", "SS"):
            got = await _messages(nc, name, 7)
            await step(sorted((m[1], m[2], m[3]) for m in got))
            await step([m[0] for m in got])
        try:  # a mirror has no subjects: nothing answers a publish to its name
            await nc.request("M", b"x", timeout=2)
            await step("answered")
        except nats.errors.NoRespondersError:
            await step("no responders")
        # live: more messages flow to every mirror and source
        for i in range(6, 9):
            await js.publish(f"o.{'ab'[i % 2]}", f"o{i}".encode())
        await js.publish("p.x", b"p-late")
        await step(await _settle(nc, "M", 9, 8))
        await step(await _settle(nc, "S", 11, 11))
        # a third source added by an update: one origin, two transforms
        sources = creates["S"]["sources"] + [{"name": "P", "subject_transforms": [
            {"src": "p.x", "dest": "s.px"}, {"src": "p.y", "dest": "s.py"}]}]
        updated = await _api(nc, "STREAM.UPDATE.S", {"name": "S", "subjects": ["s.>"],
                                                     "sources": sources})
        for block in updated.get("sources", []):
            block.pop("active", None)
        await step(updated)
        await step(await _settle(nc, "S", 15, 15))
        await step(sorted((m[1], m[2], m[3]) for m in await _messages(nc, "S", 15)))
        # promotion: an update without `mirror` makes M an ordinary stream
        promoted = await _api(nc, "STREAM.UPDATE.M", {"name": "M", "subjects": ["m.>"]})
        await step(promoted)
        ack = await js.publish("m.own", b"mine")
        await step((ack.stream, ack.seq))
        await js.publish("o.a", b"after-promotion")
        await step(await _settle(nc, "MS", 10, 8))
        await asyncio.sleep(0.5)
        await step(await _info(nc, "M"))  # the origin's seq 10 did not arrive
        # origin deleted and re-created: sourcing resumes after the last seq it stored
        await step(await _api(nc, "STREAM.DELETE.O"))
        await step(await _api(nc, "STREAM.CREATE.O", {"name": "O", "subjects": ["o.>"]}))
        for i in range(12):
            await js.publish("o.a", f"again{i}".encode())
        await step(await _settle(nc, "MS", 12, 10))
        await step([m[:4] for m in (await _messages(nc, "MS", 12))[-2:]])
        deadline = time.monotonic() + CONVERGE_S
        st = await _info(nc, "ST")
        while st["sources"][0].get("seq", 0) < 12 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            st = await _info(nc, "ST")
        await step(st)
        await step([m[:4] for m in await _messages(nc, "ST", 25)])
    finally:
        await nc.close()
    return out


async def test_mirrors_and_sources_match_nats_server(servers: Servers, tmp_path: Path) -> None:
    ours = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    # Both at once: most of nats-server's time is its sourcing timers, not CPU.
    mine, their = await asyncio.gather(_script(ours.url), _script(theirs.url))
    diffs = [f"step {i}:\n  ours:   {_strip(a)}\n  theirs: {_strip(b)}"
             for i, (a, b) in enumerate(zip(mine, their, strict=True)) if _strip(a) != _strip(b)]
    assert not diffs, "\n".join(diffs)


async def _direct(nc: Any, subject: str, body: Any) -> Any:
    try:
        m = await nc.request("$JS.API." + subject, json.dumps(body).encode(), timeout=2)
    except nats.errors.NoRespondersError:
        return "no responders"
    hdrs = {k: v for k, v in (m.headers or {}).items() if k != "Nats-Time-Stamp"}
    return hdrs, m.data


async def _kv_script(url: str) -> list[Any]:
    """A KV bucket mirrored with `mirror_direct`: direct gets of the origin's keys, also
    once the origin is gone (the mirror answers for it); a bucket sourced from it, read with
    nats-py's KV API."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: list[Any] = []
    try:
        kv = await js.create_key_value(bucket="KO", direct=True)
        await kv.put("a", b"1")
        await kv.put("b", b"2")
        await kv.put("a", b"3")
        out.append(await _api(nc, "STREAM.CREATE.KV_KM", {
            "name": "KV_KM", "mirror": {"name": "KV_KO"}, "mirror_direct": True,
            "allow_direct": True, "max_msgs_per_subject": 1, "allow_rollup_hdrs": True,
            "deny_delete": True, "discard": "new"}))
        out[-1]["mirror"].pop("active")
        out.append(await _settle(nc, "KV_KM", 3, 2))
        out.append(await _direct(nc, "DIRECT.GET.KV_KM", {"last_by_subj": "$KV.KO.a"}))
        out.append(await _direct(nc, "DIRECT.GET.KV_KM", {"seq": 2}))
        # a bucket sourced from KO, its keys moved into its own namespace (as nats.go
        # configures sourced buckets): nats-py reads it as an ordinary bucket
        out.append(await _api(nc, "STREAM.CREATE.KV_KS", {
            "name": "KV_KS", "subjects": ["$KV.KS.>"], "sources": [{
                "name": "KV_KO", "subject_transforms": [{"src": "$KV.KO.>",
                                                         "dest": "$KV.KS.>"}]}],
            "allow_direct": True, "max_msgs_per_subject": 5, "allow_rollup_hdrs": True,
            "deny_delete": True, "discard": "new"}))
        out[-1]["sources"][0].pop("active")
        await _settle(nc, "KV_KS", 2, 2)
        ks = await js.key_value("KS")
        out.append([(e.key, e.value, e.revision) for e in [await ks.get("a"),
                                                            await ks.get("b")]])
        out.append(sorted(await ks.keys()))
        out.append([(e.key, e.value) for e in await kv_history(ks, "a")])
        out.append(await ks.put("own", b"4"))
        await kv.put("b", b"5")
        await _settle(nc, "KV_KS", 4, 4)
        out.append((await ks.get("b")).value)
        out.append(await _api(nc, "STREAM.DELETE.KV_KO"))
        out.append(await _direct(nc, "DIRECT.GET.KV_KO", {"last_by_subj": "$KV.KO.a"}))
        out.append(await _direct(nc, "DIRECT.GET.KV_KO", {"last_by_subj": "$KV.KO.zz"}))
        out.append(await _direct(nc, "DIRECT.GET.NOPE", {"seq": 1}))
    finally:
        await nc.close()
    return out


async def test_kv_mirror_direct_matches_nats_server(servers: Servers, tmp_path: Path) -> None:
    ours = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    mine, their = await _kv_script(ours.url), await _kv_script(theirs.url)
    diffs = [f"step {i}:\n  ours:   {_strip(a)}\n  theirs: {_strip(b)}"
             for i, (a, b) in enumerate(zip(mine, their, strict=True)) if _strip(a) != _strip(b)]
    assert not diffs, "\n".join(diffs)


# --------------------------------------------------------------------------- kill -9

KILL_CYCLES = int(os.environ.get("JS_MIRROR_KILL_CYCLES", "3"))
ORIGIN_MSGS = 1500


async def _publish_origin(url: str, first: int, count: int) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name="O", subjects=["o.*"])
    for at in range(first, first + count, 100):  # 100 publishes in flight at a time
        await asyncio.gather(*(js.publish(f"o.{'ab'[i % 2]}", f"{i}".encode())
                               for i in range(at, min(at + 100, first + count))))
    await nc.close()


async def _keep_publishing(url: str, tag: str) -> None:
    """Publish until the node dies under us (what was stored is what the checker reads)."""
    nc = await nats.connect(url, allow_reconnect=False)
    js = nc.jetstream()
    i = 0
    try:
        while True:
            # 10 s: a PubAck later than 2 s at load 20-30 ended the publisher early, the
            # copies caught up, and no kill landed while they lagged (0/3 in a CI-style run).
            await asyncio.gather(*(js.publish(f"o.{'ab'[j % 2]}", f"{tag}:{j}".encode(),
                                              timeout=10) for j in range(i, i + 20)))
            i += 20
    except Exception:  # noqa: BLE001 - killed
        return
    finally:
        await nc.close()


async def _read_all(js: Any, stream: str, n: int) -> list[Any]:
    """Every message of `stream` in order, by a pull through a fresh consumer."""
    psub = await js.pull_subscribe("", stream=stream, config=nats.js.api.ConsumerConfig(
        ack_policy="none", inactive_threshold=30.0))
    out: list[Any] = []
    while len(out) < n:
        try:
            out += await psub.fetch(min(500, n - len(out)), timeout=5)
        except nats.errors.TimeoutError:
            break
    await psub.unsubscribe()
    return out


async def _check_exactly_once(url: str) -> int:
    """The checker: M holds exactly O's messages at O's seqs; S holds every O message
    exactly once, in O's order, at seqs 1..n. Returns n."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        total = (await _info(nc, "O"))["state"]["last_seq"]
        await _settle(nc, "M", total, total)
        await _settle(nc, "S", total, total)
        origin = await _read_all(js, "O", total)
        mirror = await _read_all(js, "M", total)
        source = await _read_all(js, "S", total)
        assert [m.metadata.sequence.stream for m in origin] == list(range(1, total + 1))
        assert [(m.metadata.sequence.stream, m.subject, m.data) for m in mirror] == \
            [(m.metadata.sequence.stream, m.subject, m.data) for m in origin]
        seen = [int(m.headers["Nats-Stream-Source"].split(" ")[1]) for m in source]
        assert seen == list(range(1, total + 1)), "the source lost or repeated messages"
        assert [m.metadata.sequence.stream for m in source] == list(range(1, total + 1))
        assert [(m.subject, m.data) for m in source] == \
            [("s." + m.subject, m.data) for m in origin]
        return total
    finally:
        await nc.close()


async def _copied(url: str) -> tuple[int, int, int]:
    nc = await nats.connect(url)
    try:
        # The three requests at once: the node answers them back to back, so the copies are
        # compared with the origin of (nearly) the same moment. One after the other on a
        # loaded machine, the copies had caught up with an origin read a while earlier.
        infos = await asyncio.gather(*(_info(nc, n) for n in ("O", "M", "S")))
        return tuple(i["state"]["last_seq"] for i in infos)  # type: ignore[return-value]
    finally:
        await nc.close()


async def test_kill_9_while_sourcing_then_exactly_once(servers: Servers, tmp_path: Path) -> None:
    """kill -9 while a mirror and a source copy the origin and publishers write to it: after
    each restart both resume at their durable progress. At least one kill must land while
    the copies lag behind the origin (else the test proves nothing)."""
    store = tmp_path / "store"
    rng = random.Random(int(os.environ.get("JS_MIRROR_SEED", "8")))
    proc: ServerProc = servers.jetraft(args=["-js", "-sd", str(store)])
    await _publish_origin(proc.url, 0, ORIGIN_MSGS)
    nc = await nats.connect(proc.url)
    await _api(nc, "STREAM.CREATE.M", {"name": "M", "mirror": {"name": "O"}})
    await _api(nc, "STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"], "sources": [
        {"name": "O", "subject_transforms": [{"src": "o.*", "dest": "s.o.$1"}]}]})
    await nc.close()
    behind = 0
    for cycle in range(KILL_CYCLES):
        first = (await _copied(proc.url))[0]
        pub = asyncio.ensure_future(_keep_publishing(proc.url, f"c{cycle}"))
        # The random wait starts once the publisher writes: on a loaded machine its connect
        # alone outlasted the wait, and a kill before any new write caught no copy lagging.
        async with asyncio.timeout(30):
            while (await _copied(proc.url))[0] == first:
                await asyncio.sleep(0.02)
        await asyncio.sleep(rng.uniform(0.05, 0.8))
        o, m, s = await _copied(proc.url)
        for _ in range(50):  # then (bounded) until a copy lags: the kill must land then
            if m < o or s < o or pub.done():
                break
            await asyncio.sleep(0.1)
            o, m, s = await _copied(proc.url)
        behind += m < o or s < o
        proc.stop(signal.SIGKILL)
        await pub
        proc = servers.jetraft(args=["-js", "-sd", str(store)])
    total = await _check_exactly_once(proc.url)
    print(f"sourcing kill -9: {total} origin messages, {behind}/{KILL_CYCLES} kills while "
          "a copy lagged")
    assert total > ORIGIN_MSGS and behind, (total, behind)


@pytest.mark.skipif(not os.environ.get("JETRAFT_LONG"), reason="JETRAFT_LONG=1: 20 cycles")
@pytest.mark.timeout(900)
async def test_kill_9_while_sourcing_long(servers: Servers, tmp_path: Path) -> None:
    global KILL_CYCLES
    saved, KILL_CYCLES = KILL_CYCLES, 20
    try:
        await test_kill_9_while_sourcing_then_exactly_once(servers, tmp_path)
    finally:
        KILL_CYCLES = saved


async def test_bad_sourcing_requests_get_answers_and_harm_nothing(servers: Servers,
                                                                  tmp_path: Path) -> None:
    """Malformed origin-consumer requests (the `direct` + `sourcing` form) are answered
    with an error, the node stays up, and a mirror keeps working."""
    proc = servers.jetraft(args=["-js", "-sd", str(tmp_path / "s")])
    nc = await nats.connect(proc.url)
    js = nc.jetstream()
    try:
        await js.add_stream(name="O", subjects=["o.>"])
        await _api(nc, "STREAM.CREATE.M", {"name": "M", "mirror": {"name": "O"}})
        good = {"direct": True, "sourcing": True, "deliver_subject": "d.x", "name": "X"}
        bad = [
            {**good, "opt_start_time": "yesterday", "deliver_policy": "by_start_time"},
            {**good, "filter_subjects": 7},
            {**good, "idle_heartbeat": "soon"},
            {**good, "name": 5},
            {**good, "name": ""},
            {**good, "inactive_threshold": [1]},
            {**good, "opt_start_seq": "x", "deliver_policy": "by_start_sequence"},
        ]
        for cfg in bad:
            reply = await _api(nc, "CONSUMER.CREATE.O.X", {"stream_name": "O", "config": cfg})
            assert "error" in reply, (cfg, reply)
        missing = await _api(nc, "CONSUMER.CREATE.NOPE.X", {"stream_name": "NOPE",
                                                             "config": good})
        assert missing["error"]["err_code"] == 10059
        ack = await js.publish("o.a", b"still")
        await _settle(nc, "M", ack.seq, 1)
        assert proc.alive() and "[ERR]" not in proc.log_text()
    finally:
        await nc.close()


async def _discard_new_script(url: str) -> list[Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: list[Any] = []
    try:
        await js.add_stream(name="DO", subjects=["do.>"])
        for i in range(4):
            await js.publish("do.a", f"m{i}".encode())
        created = await _api(nc, "STREAM.CREATE.DS", {
            "name": "DS", "subjects": ["ds"], "sources": [{"name": "DO"}], "max_msgs": 2,
            "discard": "new"})
        created["sources"][0].pop("active")
        out.append(created)
        out.append(await _settle(nc, "DS", 2, 2))
        await asyncio.sleep(0.5)
        out.append(await _info(nc, "DS"))  # full: the rest is refused, progress stays at 2
        out.append(await _api(nc, "STREAM.PURGE.DS"))
        out.append(await _settle(nc, "DS", 4, 2))  # room again: the source retried
        out.append([m[:4] for m in await _messages(nc, "DS", 4)])
    finally:
        await nc.close()
    return out


async def _seal_script(url: str) -> list[Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: list[Any] = []
    try:
        await js.add_stream(name="O", subjects=["o.>"])
        await js.publish("o.a", b"1")
        await _api(nc, "STREAM.CREATE.M", {"name": "M", "mirror": {"name": "O",
                                                                 "filter_subject": "o.*"}})
        await _api(nc, "STREAM.CREATE.S", {"name": "S", "sources": [{"name": "O"}]})
        await _settle(nc, "M", 1, 1)
        await _settle(nc, "S", 1, 1)
        out.append(await _api(nc, "STREAM.UPDATE.M", {
            "name": "M", "mirror": {"name": "O", "filter_subject": "o.*"}, "sealed": True}))
        out.append(await _api(nc, "STREAM.UPDATE.S", {"name": "S", "sources": [{"name": "O"}],
                                                      "sealed": True}))
        await js.publish("o.a", b"2")
        await asyncio.sleep(1.5)
        out.append(await _info(nc, "M"))  # sealed: nothing more comes in
        out.append(await _info(nc, "S"))
    finally:
        await nc.close()
    return out


async def test_sealed_targets_take_nothing_in_as_nats_server(servers: Servers,
                                                             tmp_path: Path) -> None:
    ours = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    mine, their = await _seal_script(ours.url), await _seal_script(theirs.url)
    diffs = [f"step {i}:\n  ours:   {_strip(a)}\n  theirs: {_strip(b)}"
             for i, (a, b) in enumerate(zip(mine, their, strict=True)) if _strip(a) != _strip(b)]
    assert not diffs, "\n".join(diffs)


async def test_full_discard_new_source_retries_as_nats_server(servers: Servers,
                                                              tmp_path: Path) -> None:
    ours = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    mine, their = await _discard_new_script(ours.url), await _discard_new_script(theirs.url)
    diffs = [f"step {i}:\n  ours:   {_strip(a)}\n  theirs: {_strip(b)}"
             for i, (a, b) in enumerate(zip(mine, their, strict=True)) if _strip(a) != _strip(b)]
    assert not diffs, "\n".join(diffs)
