"""`jetraft serve -js` with real nats-py clients over TCP, next to `nats-server -js`.

The same script runs against both servers and the whole JSON of every `$JS.API` reply is
compared; only the keys in ALLOWED_TO_DIFFER (times the servers make up) may differ. Then
restarts: SIGTERM and kill -9 keep every acknowledged message and the consumers' ack floors.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import nats
import pytest

from tests.integration.conftest import RawConn, ServerProc, Servers

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
