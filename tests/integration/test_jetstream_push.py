"""Push consumers' flow control and idle heartbeats, and ordered consumers, next to nats-server.

The same nats-py script runs against `nats-server -js` and `jetraft serve -js`. The flow
control and heartbeat scripts listen on the deliver subject with a plain subscription, so
every frame the server sends (messages, `100 FlowControl Request`, `100 Idle Heartbeat` with
its `Nats-Last-Consumer` / `Nats-Last-Stream` / `Nats-Consumer-Stalled` headers) is recorded
in order and compared. Only values the servers make up may differ: the flow control reply
subject's random tail and times (ALLOWED_TO_DIFFER in the JSON replies).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats

from tests.integration.conftest import ServerProc, Servers

# Their values may differ (times, generated names, inboxes); their presence may not.
ALLOWED_TO_DIFFER = {"created", "ts", "last_active", "name", "deliver_subject",
                     "opt_start_seq"}
BIG = 100_000  # payload: the 2 MiB first window holds 21 of them, half of it 11


def _strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: "*" if k in ALLOWED_TO_DIFFER else _strip(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strip(v) for v in obj]
    return obj


def _same(mine: list[Any], their: list[Any]) -> None:
    diffs = [f"step {i}:\n  ours:   {_strip(a)}\n  theirs: {_strip(b)}"
             for i, (a, b) in enumerate(zip(mine, their, strict=True)) if _strip(a) != _strip(b)]
    assert not diffs, "\n".join(diffs)


def _pair(servers: Servers, tmp_path: Path) -> tuple[ServerProc, ServerProc]:
    return (servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")]),
            servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")]))


async def _api(nc: Any, subject: str, body: Any = b"") -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return json.loads((await nc.request("$JS.API." + subject, data, timeout=10)).data)


class Frames:
    """Every message on a deliver subject, in order, as comparable tuples."""

    def __init__(self) -> None:
        self.frames: list[tuple[Any, ...]] = []
        self.fc_replies: list[str] = []

    async def on_msg(self, msg: Any) -> None:
        hdr = msg.headers or {}
        if hdr.get("Status") == "100":
            desc = hdr.get("Description", "")
            if desc.startswith("FlowControl"):
                self.fc_replies.append(msg.reply)
                self.frames.append(("fc", msg.reply.rsplit(".", 1)[0]))
            else:
                self.frames.append(("hb", desc, hdr.get("Nats-Last-Consumer"),
                                    hdr.get("Nats-Last-Stream"),
                                    "Nats-Consumer-Stalled" in hdr,
                                    hdr.get("Nats-Consumer-Stalled", "x") in self.fc_replies))
            return
        tokens = msg.reply.split(".")
        self.frames.append(("msg", msg.subject, len(msg.data), int(tokens[5]), int(tokens[6]),
                            int(tokens[8])))

    def take(self) -> list[tuple[Any, ...]]:
        out, self.frames = self.frames, []
        return out

    async def take_at_heartbeat(self, msgs: int, limit: float = 15.0) -> list[tuple[Any, ...]]:
        """What came until an idle heartbeat followed `msgs` messages (at most `limit`
        seconds): a loaded server sends its heartbeat later than its interval says, so a
        fixed wait would take one frame too few."""
        deadline = asyncio.get_running_loop().time() + limit
        while not (self.frames and self.frames[-1][0] == "hb"
                   and sum(f[0] == "msg" for f in self.frames) >= msgs):
            if asyncio.get_running_loop().time() > deadline:
                break  # (what came is compared: the difference shows)
            await asyncio.sleep(0.02)
        return self.take()


async def _flow_control_script(url: str) -> list[Any]:
    """30 messages of 100 kB to a push consumer with flow control whose client does not
    answer at first: 11 messages, a request, 10 more, then the consumer stalls and its
    heartbeats say so; the answer lets the rest through."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: list[Any] = []
    try:
        await js.add_stream(name="FC", subjects=["fc.>"])
        for i in range(30):
            await js.publish(f"fc.{i % 3}", bytes([i]) * BIG)
        frames = Frames()
        await nc.subscribe("dlv.fc", cb=frames.on_msg)
        await nc.flush()
        out.append(await _api(nc, "CONSUMER.CREATE.FC.pfc", {"stream_name": "FC", "config": {
            "durable_name": "pfc", "deliver_subject": "dlv.fc", "flow_control": True,
            "idle_heartbeat": 1_000_000_000, "ack_policy": "none"}}))
        out.append(await frames.take_at_heartbeat(21))  # stalled: a heartbeat after the last
        out.append(await _api(nc, "CONSUMER.INFO.FC.pfc"))
        await nc.publish(frames.fc_replies[-1], b"")  # the client's answer
        out.append(await frames.take_at_heartbeat(9))
        out.append(await _api(nc, "CONSUMER.INFO.FC.pfc"))
    finally:
        await nc.close()
    return out


async def test_flow_control_matches_nats_server(servers: Servers, tmp_path: Path) -> None:
    theirs, ours = _pair(servers, tmp_path)
    their, mine = await _flow_control_script(theirs.url), await _flow_control_script(ours.url)
    _same(mine, their)
    # what the script is about, spelled out (so a change of script cannot hollow it)
    kinds = [f[0] for f in their[1]]
    assert kinds == ["msg"] * 11 + ["fc"] + ["msg"] * 10 + ["hb"]
    assert their[1][-1][4:] == (True, True)  # stalled on the request sent
    assert [f[0] for f in their[3]] == ["msg"] * 9 + ["hb"]


async def _heartbeat_script(url: str) -> list[Any]:
    """Idle heartbeats name the last delivered sequences: before any delivery (deliver
    policy new on a filled stream, with a filter), after deliveries and acks."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: list[Any] = []
    try:
        await js.add_stream(name="HB", subjects=["hb.>"])
        for i in range(5):
            await js.publish(f"hb.{i % 2}", b"x")
        frames = Frames()
        await nc.subscribe("dlv.hb", cb=frames.on_msg)
        await nc.flush()
        out.append(await _api(nc, "CONSUMER.CREATE.HB.phb", {"stream_name": "HB", "config": {
            "durable_name": "phb", "deliver_subject": "dlv.hb", "deliver_policy": "new",
            "filter_subject": "hb.1", "idle_heartbeat": 500_000_000, "ack_policy": "none"}}))
        out.append(await frames.take_at_heartbeat(0))
        await js.publish("hb.0", b"y")
        await js.publish("hb.1", b"z")
        out.append(await frames.take_at_heartbeat(1))
    finally:
        await nc.close()
    return out


async def test_idle_heartbeats_match_nats_server(servers: Servers, tmp_path: Path) -> None:
    theirs, ours = _pair(servers, tmp_path)
    their, mine = await _heartbeat_script(theirs.url), await _heartbeat_script(ours.url)
    _same(mine, their)
    assert their[1] == [("hb", "Idle Heartbeat", "0", "5", False, False)]
    assert [f[0] for f in their[2]] == ["msg", "hb"]


async def _ordered_script(url: str) -> list[Any]:
    """An ordered consumer as nats-py drives it: in order, kept alive by heartbeats while
    idle, and re-created where it left off when its consumer disappears."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: list[Any] = []
    got: list[tuple[str, bytes, int]] = []

    async def on_msg(msg: Any) -> None:
        got.append((msg.subject, msg.data, msg.metadata.sequence.stream))

    try:
        await js.add_stream(name="ORD", subjects=["ord.>"])
        for i in range(10):
            await js.publish(f"ord.{i % 3}", f"m{i}".encode())
        sub = await js.subscribe("ord.>", cb=on_msg, ordered_consumer=True, idle_heartbeat=0.5)
        for _ in range(400):  # at most 20 s (a loaded machine)
            if len(got) >= 10:
                break
            await asyncio.sleep(0.05)
        out.append(list(got))
        names = (await _api(nc, "CONSUMER.NAMES.ORD"))["consumers"]
        first = names[0]
        info = await _api(nc, f"CONSUMER.INFO.ORD.{first}")
        out.append(info)
        await asyncio.sleep(2.5)  # idle: heartbeats keep it; without them nats-py re-creates
        out.append((await _api(nc, "CONSUMER.NAMES.ORD"))["consumers"] == [first])
        out.append(await _api(nc, f"CONSUMER.DELETE.ORD.{first}"))
        await asyncio.sleep(1.6)  # no heartbeats: nats-py notices and re-creates the consumer
        for i in range(10, 15):
            await js.publish(f"ord.{i % 3}", f"m{i}".encode())
        for _ in range(400):
            if len(got) >= 15:
                break
            await asyncio.sleep(0.05)
        out.append(got[10:])
        names = (await _api(nc, "CONSUMER.NAMES.ORD"))["consumers"]
        out.append((len(names), names != [first]))
        info = await _api(nc, f"CONSUMER.INFO.ORD.{names[0]}")
        out.append((info["config"]["deliver_policy"], info["config"]["opt_start_seq"],
                    info["delivered"], info["num_pending"]))
        await sub.unsubscribe()
    finally:
        await nc.close()
    return out


async def test_ordered_consumer_matches_nats_server(servers: Servers, tmp_path: Path) -> None:
    theirs, ours = _pair(servers, tmp_path)
    their, mine = await _ordered_script(theirs.url), await _ordered_script(ours.url)
    _same(mine, their)
    assert [g[2] for g in their[0]] == list(range(1, 11))
    assert their[2] is True and [g[2] for g in their[4]] == list(range(11, 16))
    assert their[6][:2] == ("by_start_sequence", 11)
