"""Fail-stop across real processes: a leader whose disk fills up (a real
ENOSPC from a small tmpfs, not an injected error) stops with [FTL] and exit
status 70; the others elect a new leader and keep every acknowledged write.

Needs permission to mount a tmpfs (root in a container); skipped otherwise."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from tests.raft import test_process_raft
from tests.raft.test_process_raft import ProcCluster

pytestmark = pytest.mark.timeout(150)
cluster = test_process_raft.cluster  # the process-cluster fixture


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
                       capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


async def test_leader_with_a_full_disk_stops_and_the_others_carry_on(cluster, small_disk):
    c: ProcCluster = cluster()
    full = c.procs[1]
    full.dir = small_disk / "n1"
    for p in c.procs.values():
        await p.start()
    leader = await c.leader()
    if leader is not full:
        await leader.call(op="transfer", node=1)
    async with asyncio.timeout(30):
        while (await c.leader()) is not full:
            await asyncio.sleep(0.05)
    big = "x" * (32 << 10)  # below the control port's 64 KiB line limit
    async with asyncio.timeout(60):
        k = 0
        while full.popen.poll() is None:
            try:
                resp = await full.call(op="propose", data=f"{k}:{big}", timeout=5)
            except (ConnectionError, TimeoutError):
                break
            if resp["ok"]:
                c.acked.append(f"{k}:{big}")
            k += 1
    async with asyncio.timeout(30):
        while full.popen.poll() is None:
            await asyncio.sleep(0.05)
    assert full.popen.returncode == 70
    assert b"[FTL]" in (c.tmp / "n1.log").read_bytes()
    full.kill9()  # closes the control connection
    assert len(c.acked) > 3
    await c.write("after the failure")
    async with asyncio.timeout(60):
        while True:
            seqs = [await _entries(c.procs[n].control) for n in (2, 3)]
            if seqs[0] == seqs[1] and "after the failure" in seqs[0]:
                break
            await asyncio.sleep(0.2)
    assert set(c.acked) <= set(seqs[0])


async def _entries(port: int) -> list[str]:
    """The applied entries, over a connection that takes the multi-MB reply."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=64 << 20)
    try:
        writer.write(json.dumps({"id": 1, "op": "entries"}).encode() + b"\n")
        resp = json.loads(await reader.readline())
        return [d for _, d in resp["entries"]]
    finally:
        writer.close()
