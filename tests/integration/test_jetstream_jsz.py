"""`/jsz` on the monitor port next to nats-server's, and JetStream series in `/metrics`.

The same streams and consumers on both servers; then /jsz with each query form. Compared: the
key paths in order (every nested key, list items included) and the values that do not depend
on the machine or the moment (counts, sequences, configs, states). May differ: times, ids,
limits computed from this machine's memory and disk, the store path, the sync interval, and
byte counts of file storage (VALUES_MAY_DIFFER)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import nats
from nats.js.api import ConsumerConfig, StorageType, StreamConfig

from tests.integration.conftest import ServerProc, Servers

VALUES_MAY_DIFFER = {"server_id", "now", "created", "ts", "first_ts", "last_ts", "leader",
                     "max_memory", "max_storage", "store_dir", "sync_interval", "last_active"}
QUERIES = ["", "?accounts=true", "?streams=true", "?streams=true&config=true",
           "?streams=true&consumers=true&config=true", "?consumers=true"]


def _paths(obj: Any, prefix: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append(prefix + "/" + k)
            out += _paths(v, prefix + "/" + k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, f"{prefix}[{i}]")
    return out


def _values(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: "*" if k in VALUES_MAY_DIFFER else _values(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_values(v) for v in obj]
    return obj


def _sorted(body: dict[str, Any]) -> dict[str, Any]:
    """nats-server lists streams and consumers in Go map order: compare them by name."""
    for acc in body.get("account_details", []):
        acc.get("stream_detail", []).sort(key=lambda d: d["name"])
        for sd in acc.get("stream_detail", []):
            sd.get("consumer_detail", []).sort(key=lambda d: d["name"])
    return body


def _get(srv: ServerProc, path: str) -> str:
    with urllib.request.urlopen(srv.http + path, timeout=10) as resp:
        return resp.read().decode()


async def _fill(url: str) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        await js.add_stream(StreamConfig(name="J1", subjects=["j1.>"]))
        await js.add_stream(StreamConfig(name="J2", subjects=["j2"], storage=StorageType.MEMORY))
        for i in range(5):
            await js.publish(f"j1.{i % 2}", b"x" * 10)
        await js.publish("j2", b"y")
        await js.add_consumer("J1", ConsumerConfig(durable_name="d1"))
        await js.add_consumer("J1", ConsumerConfig(durable_name="d2", filter_subject="j1.1"))
        psub = await js.pull_subscribe_bind("d1", "J1")
        for m in await psub.fetch(2, timeout=5):
            await m.ack_sync()
        await nc.request("$JS.API.STREAM.INFO.NOPE", b"", timeout=5)  # one API error
    finally:
        await nc.close()


async def test_jsz_matches_nats_server(servers: Servers, tmp_path: Path) -> None:
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    ours = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    await _fill(theirs.url)
    await _fill(ours.url)
    for query in QUERIES:
        mine = _sorted(json.loads(_get(ours, "/jsz" + query)))
        their = _sorted(json.loads(_get(theirs, "/jsz" + query)))
        # Jetraft fsyncs before every ack and says so; nats-server only under `always`
        # (tests/integration/test_jetstream_sync_config.py)
        assert mine["config"].pop("sync_always") is True
        assert _paths(mine) == _paths(their), query
        if "consumers" in query:
            assert len(_paths(their)) > 80  # the details are there to compare
        # file storage byte counts follow each store's own record format
        for body in (mine, their):
            body["storage"] = body["bytes"] = "*"
            for acc in body.get("account_details", []):
                acc["storage"] = "*"
                for sd in acc.get("stream_detail", []):
                    if sd["name"] == "J1":
                        sd["state"]["bytes"] = "*"
        a, b = _values(mine), _values(their)
        assert a == b, f"{query}\n ours:   {json.dumps(a)}\n theirs: {json.dumps(b)}"


def test_metrics_carry_jetstream_series(servers: Servers, tmp_path: Path) -> None:
    import asyncio

    ours = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    asyncio.run(_fill(ours.url))
    text = _get(ours, "/metrics")
    samples = {line.split(" ")[0]: line.split(" ")[1] for line in text.splitlines()
               if line and not line.startswith("#")}
    sid = next(k for k in samples if k.startswith("jetstream_server_total_streams"))
    assert samples[sid] == "2"
    assert samples[sid.replace("streams", "consumers")] == "2"
    assert samples[sid.replace("streams", "messages")] == "6"
    label = sid[sid.index("{") + 1:-1]
    assert samples[f'jetstream_stream_messages{{{label},stream_name="J1"}}'] == "5"
    assert samples[f'jetstream_consumer_ack_floor_stream_seq{{{label},stream_name="J1",'
                   f'consumer_name="d1"}}'] == "2"
    assert samples[f'jetstream_consumer_num_pending{{{label},stream_name="J1",'
                   f'consumer_name="d2"}}'] == "2"
    assert "# TYPE jetstream_server_api_errors_total counter" in text
