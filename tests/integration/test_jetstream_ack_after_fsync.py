"""A standalone node's PubAck leaves only after the WAL fsync of its entry returned, and
an acknowledged message survives kill -9 (a standalone node's groups have one voter:
its own fsync is the whole quorum).

Real node process (tests/integration/fsync_gate_node.py: the WAL's fdatasync waits while
a gate file exists), real nats-py client, real LMDB and WAL: each lone publish is held
inside its WAL fsync; no PubAck may reach the client meanwhile; once the fsync returns the
PubAck comes with the right sequence. Then kill -9 and a restart keep every acked message.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import nats
import pytest

from tests.integration.conftest import ServerProc, free_port

HELD = 0.4  # how long each fsync is held: a PubAck sent during it would arrive by then
GATED = 4
ROOT = Path(__file__).resolve().parents[2]


def _node(tmp_path: Path, gate: Path, store: Path, port: int) -> ServerProc:
    argv = [sys.executable, str(ROOT / "tests/integration/fsync_gate_node.py"), "serve",
            "-js", "-sd", str(store), "-a", "127.0.0.1", "-p", str(port)]
    return ServerProc("jetraft", argv, port, 0, tmp_path)


async def _wait_file(path: Path, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not path.exists():
            await asyncio.sleep(0.005)


@pytest.mark.timeout(120)
async def test_no_puback_before_the_wal_fsync_returns_and_acked_survives_kill9(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate, store, port = tmp_path / "gate", tmp_path / "store", free_port()
    held = Path(str(gate) + ".held")
    monkeypatch.setenv("JETRAFT_FSYNC_GATE", str(gate))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    node = _node(tmp_path, gate, store, port).start()
    try:
        nc = await nats.connect(node.url)
        js = nc.jetstream(timeout=10)
        await js.add_stream(name="AF", subjects=["af.>"])
        acked = [(await js.publish("af.x", b"warm")).seq]
        for k in range(GATED):
            gate.touch()
            held.unlink(missing_ok=True)
            pub = asyncio.ensure_future(js.publish("af.x", b"m%d" % k))
            await _wait_file(held)  # the node is inside the WAL fsync of this publish
            await asyncio.sleep(HELD)
            assert not pub.done(), "PubAck received while its WAL fsync was still held"
            gate.unlink()
            ack = await asyncio.wait_for(pub, 10)
            assert ack.seq == acked[-1] + 1
            acked.append(ack.seq)
        for k in range(20):  # ungated: lone publishes acked at full speed
            acked.append((await js.publish("af.x", b"n%d" % k)).seq)
        await nc.close()
        node.stop(signal.SIGKILL)
        node = _node(tmp_path, gate, store, port).start()
        nc = await nats.connect(node.url)
        js = nc.jetstream(timeout=10)
        info = await js.stream_info("AF")
        assert info.state.last_seq >= acked[-1] and info.state.messages >= len(acked)
        for seq in acked:
            await js.get_msg("AF", seq)
        await nc.close()
    finally:
        gate.unlink(missing_ok=True)
        node.stop(signal.SIGKILL)
