"""A `mem_storage` consumer on a file stream, single node, next to nats-server 2.15: while the
server runs it behaves as any consumer; a restart forgets it (config and state), the file
consumer beside it keeps its delivered / ack floor, and the stream keeps every message the
forgotten consumer had not acked, even under interest retention. Re-created, it starts again
from the stream's first message. Whole replies compared (times and ids masked)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import nats

from tests.integration.conftest import ServerProc, Servers
from tests.integration.jsdiff import assert_same_steps

ALLOWED_TO_DIFFER = {"created", "ts", "last_active", "first_ts", "last_ts", "cluster",
                     "_nats.ver", "_nats.level"}


async def _api(nc: Any, subject: str, body: Any = b"") -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return json.loads((await nc.request("$JS.API." + subject, data, timeout=10)).data)


def _progress(info: dict[str, Any]) -> Any:
    if "error" in info:
        return info
    return {k: info[k] for k in ("delivered", "ack_floor", "num_pending", "num_ack_pending",
                                  "num_redelivered")} | {"mem": info["config"].get("mem_storage")}


async def _before(url: str, steps: list[Any]) -> None:
    nc = await nats.connect(url)
    try:
        await _api(nc, "STREAM.CREATE.S", {"name": "S", "subjects": ["s"],
                                           "retention": "interest"})
        for name, mem in (("M", True), ("F", False)):
            steps.append(await _api(nc, f"CONSUMER.CREATE.S.{name}", {
                "stream_name": "S", "config": {"durable_name": name, "ack_policy": "explicit",
                                               "mem_storage": mem}}))
        js = nc.jetstream()
        for i in range(5):
            await js.publish("s", b"m%d" % i)
        for name in ("M", "F"):
            sub = await js.pull_subscribe("s", name, stream="S")
            msgs = await sub.fetch(3, timeout=5)
            for m in msgs[:2]:
                await m.ack_sync()
            steps.append(_progress(await _api(nc, f"CONSUMER.INFO.S.{name}")))
        steps.append((await _api(nc, "STREAM.INFO.S"))["state"])
    finally:
        await nc.close()


async def _after(url: str, steps: list[Any]) -> None:
    nc = await nats.connect(url)
    try:
        steps.append(await _api(nc, "CONSUMER.NAMES.S"))
        for name in ("M", "F"):
            steps.append(_progress(await _api(nc, f"CONSUMER.INFO.S.{name}")))
        steps.append((await _api(nc, "STREAM.INFO.S"))["state"])
        # re-created under the same name, it starts over: the first message still stored
        await _api(nc, "CONSUMER.CREATE.S.M", {"stream_name": "S", "config": {
            "durable_name": "M", "ack_policy": "explicit", "mem_storage": True}})
        sub = await nc.jetstream().pull_subscribe("s", "M", stream="S")
        steps.append([m.metadata.sequence.stream for m in await sub.fetch(5, timeout=5)])
    finally:
        await nc.close()


async def _run(proc: ServerProc, sig: int) -> list[Any]:
    steps: list[Any] = []
    await _before(proc.url, steps)
    proc.stop(sig)
    proc.start()
    await _after(proc.url, steps)
    return steps


async def test_mem_storage_consumer_is_forgotten_at_restart_as_nats_server(
        servers: Servers, tmp_path: Path) -> None:
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    ours = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    their = await _run(theirs, signal.SIGTERM)
    mine = await _run(ours, signal.SIGTERM)
    assert_same_steps(mine, their, ALLOWED_TO_DIFFER)
    # the test can fail: M is gone, F kept its floor, messages 3..5 stay, M starts at 3
    assert their[5]["consumers"] == ["F"] and their[6]["error"]["err_code"] == 10014
    assert their[7]["ack_floor"]["stream_seq"] == 2 and their[8]["messages"] == 3
    assert their[9] == [3, 4, 5]
    # kill -9 on our side: the same (nats-server's file consumer may lose its floor then)
    again = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours9")])
    assert_same_steps(await _run(again, signal.SIGKILL), their, ALLOWED_TO_DIFFER)
