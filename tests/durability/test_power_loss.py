"""Power loss under acked publishing: nothing acknowledged is lost, the store opens every time.

The node's whole store_dir (Raft WAL, snapshots, LMDB) lives on `powerfs`. Each cycle starts
`jetraft serve -js` on the surviving state, runs publishers with acks (and a consumer that
double-acks) for a random while, then cuts the power: `kill -9` the node, and the disk keeps
only what was fsynced (tests/durability/powerfs.py). `kill -9` alone keeps the page cache;
the cut does not, which is what tells a node that acknowledges before its fsync from one
that does not (the mutants in tests/durability/mutants.py).

Two disk models: `strict` (every unsynced write and directory change is gone) and `torn`
(each dirty page independently reached the disk or not: reordered write-back).

    pytest tests/durability/test_power_loss.py                   # CI: 3 + 2 cuts
    JETRAFT_LONG=1 pytest tests/durability/test_power_loss.py    # 20 cuts per model
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import pytest

from tests.durability.disk import PowerDisk
from tests.integration.conftest import ServerProc, Servers

LONG = os.environ.get("JETRAFT_LONG") == "1"
# kill9: the same cycles with `kill -9` only (the page cache survives): the comparison run
# for the mutants (tests/durability/mutants.py sets JETRAFT_POWER_KILL9=1), off in CI.
KILL9 = LONG or os.environ.get("JETRAFT_POWER_KILL9") == "1"
CUTS = {"strict": 20 if LONG else 3, "torn": 20 if LONG else 2, "kill9": 20 if LONG else 4}
if os.environ.get("JETRAFT_POWER_CUTS"):  # the mutants run every model with the same count
    CUTS = dict.fromkeys(CUTS, int(os.environ["JETRAFT_POWER_CUTS"]))
PUBLISHERS = 4  # the last one keeps WINDOW publishes of PAD bytes in flight
WINDOW = 16
PAD = "." * 6000
WORKER = nats.js.api.ConsumerConfig(ack_wait=1.0)
GET_WINDOW = 64  # get_msg requests in flight at once when reading the stream back


async def _publisher(js: Any, tag: str, acked: list[tuple[int, str]]) -> None:
    """Publish `<tag>:<i>` in order and record (seq, payload) of every PubAck."""
    i = 0
    while True:
        payload = f"{tag}:{i:06d}"
        try:
            ack = await js.publish("p.x", payload.encode(), timeout=3)
        except Exception:  # noqa: BLE001 - the node died under us
            return
        acked.append((ack.seq, payload))
        i += 1


async def _window_publisher(js: Any, tag: str, acked: list[tuple[int, str]]) -> None:
    """`_publisher` with WINDOW publishes in flight (sent in order on the shared connection):
    the leader merges what queued into STREAM_MSGS entries. Big enough (> 64 KiB a pass)
    that the WAL fsyncs in its thread while the loop goes on: a node that answered a merged
    entry before its fsync would have the answers out during it."""
    i = 0
    while True:
        payloads = [f"{tag}:{k:06d}{PAD}" for k in range(i, i + WINDOW)]
        acks = await asyncio.gather(*(js.publish("p.x", p.encode(), timeout=3)
                                      for p in payloads), return_exceptions=True)
        for ack, payload in zip(acks, payloads, strict=True):
            if not isinstance(ack, BaseException):
                acked.append((ack.seq, payload))
        if any(isinstance(ack, BaseException) for ack in acks):
            return  # the node died under us
        i += WINDOW


async def _acker(js: Any, confirmed: list[int], tried: list[int]) -> None:
    try:
        psub = await js.pull_subscribe("p.x", "worker", stream="P", config=WORKER)
        while True:
            for m in await psub.fetch(5, timeout=1):
                tried.append(m.metadata.sequence.stream)
                await m.ack_sync(timeout=3)
                confirmed.append(m.metadata.sequence.stream)
    except Exception:  # noqa: BLE001 - the node died, or the last fetch timed out
        return


def _start(servers: Servers, disk: PowerDisk) -> ServerProc:
    return servers.jetraft(args=["-js", "-sd", str(disk.path / "store")])


async def _get(js: Any, seq: int) -> str | None:
    try:
        return (await js.get_msg("P", seq)).data.decode()
    except nats.js.errors.NotFoundError:
        return None


async def _check_acked(url: str, acked: list[tuple[int, str]], where: str) -> dict[int, str]:
    """Every acked payload at the sequence its PubAck named; returns the stored messages."""
    nc = await nats.connect(url)
    # 64 requests in flight through a FUSE disk: on a loaded machine (4 test workers on 2
    # cores) the last answers took over nats-py's default 5 s.
    js = nc.jetstream(timeout=30)
    try:
        info = await js.stream_info("P")
        seqs = range(info.state.first_seq, info.state.last_seq + 1)
        stored: dict[int, str] = {}
        for i in range(0, len(seqs), GET_WINDOW):  # requests in flight together: less waiting
            window = seqs[i:i + GET_WINDOW]
            got = await asyncio.gather(*(_get(js, seq) for seq in window))
            stored.update((seq, data) for seq, data in zip(window, got, strict=True)
                          if data is not None)
    finally:
        await nc.close()
    # The counters (one LMDB put per batch, trusted at restart) and the messages they count
    # come back from the same sync point: never one without the other.
    assert info.state.messages == len(stored), \
        f"{where}: the stream counts {info.state.messages} messages, holds {len(stored)}"
    lost = [(seq, p) for seq, p in acked if stored.get(seq) != p]
    assert not lost, f"{where}: {len(lost)} acknowledged messages lost or moved, first " \
                     f"{lost[:3]} (stored there: {[stored.get(s) for s, _ in lost[:3]]})"
    return stored


async def _cycle(cycle: int, proc: ServerProc, rng: random.Random,
                 acked: list[tuple[int, str]], confirmed: list[int], tried: list[int]) -> None:
    nc = await nats.connect(proc.url, allow_reconnect=False)
    js = nc.jetstream()
    await js.add_stream(name="P", subjects=["p.*"])  # an identical re-create is a no-op
    tasks = [asyncio.ensure_future(
        (_window_publisher if w == PUBLISHERS - 1 else _publisher)(js, f"{w}:{cycle:03d}", acked))
        for w in range(PUBLISHERS)]
    tasks.append(asyncio.ensure_future(_acker(js, confirmed, tried)))
    await asyncio.sleep(rng.uniform(0.5, 2.0))
    proc.stop(signal.SIGKILL)
    await asyncio.wait(tasks, timeout=15)
    try:
        await nc.close()
    except Exception:  # noqa: BLE001 - already gone
        pass


async def power_cut_run(servers: Servers, disk: PowerDisk, cuts: int, seed: int,
                        cut: Callable[[PowerDisk], dict[str, Any]] | None = None) -> dict:
    """`cuts` cycles of publish-then-cut on `disk`; asserts after each restart that every
    message acked so far is there. `cut` replaces the power cut (the kill -9 comparison
    passes a no-op). Returns figures for the notes."""
    rng = random.Random(seed)
    acked: list[tuple[int, str]] = []
    confirmed: list[int] = []
    tried: list[int] = []
    dropped_pages = 0
    for cycle in range(cuts):
        proc = _start(servers, disk)  # raises if the store does not open
        if acked:
            await _check_acked(proc.url, acked, f"seed {seed} after cut {cycle}")
        await _cycle(cycle, proc, rng, acked, confirmed, tried)
        stats = (cut or PowerDisk.cut)(disk)
        if cut is None:
            disk.mount()
        dropped_pages += sum(s.get("dropped_pages", 0) for s in stats.values())
    final = _start(servers, disk)
    stored = await _check_acked(final.url, acked, f"seed {seed} at the end")
    payloads = list(stored.values())
    assert len(payloads) == len(set(payloads)), f"seed {seed}: a message is stored twice"
    for w in range(PUBLISHERS):
        mine = [p for p in payloads if p.startswith(f"{w}:")]
        assert mine == sorted(mine), f"seed {seed}: publisher {w} out of order"
    rest = await _drain(final.url)
    assert not set(rest) & set(confirmed), f"seed {seed}: a confirmed ack was lost"
    gone = set(stored) - set(rest) - set(confirmed)
    assert gone <= set(tried), f"seed {seed}: skipped unacked: {sorted(gone - set(tried))[:5]}"
    final.stop()
    return {"acked": len(acked), "confirmed": len(confirmed), "dropped_pages": dropped_pages}


def _kill_only(disk: PowerDisk) -> dict[str, Any]:
    """No power cut: the node was killed with -9 and the disk (page cache) stays as it is."""
    return {}


async def _drain(url: str) -> list[int]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    got: list[int] = []
    try:
        psub = await js.pull_subscribe("p.x", "worker", stream="P", config=WORKER)
        idle = 0
        while idle < 3:
            try:
                msgs = await psub.fetch(100, timeout=1)
            except nats.errors.TimeoutError:
                msgs = []
            idle = 0 if msgs else idle + 1
            for m in msgs:  # no ack round trip each: only what is redelivered matters here
                await m.ack()
                got.append(m.metadata.sequence.stream)
    finally:
        await nc.close()
    return got


@pytest.mark.timeout(1800 if LONG else 240)
@pytest.mark.parametrize("model", ["strict", "torn", "kill9"])
async def test_power_cuts_lose_nothing_acknowledged(
        power_disk: Callable[..., PowerDisk], servers: Servers, model: str,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # `power_disk` before `servers`: nodes are stopped before the disk is unmounted.
    if model == "kill9" and not KILL9:
        pytest.skip("the kill -9 comparison runs with JETRAFT_LONG=1 or JETRAFT_POWER_KILL9=1")
    # Compaction every 200 applied entries: cuts also land after WAL truncations, so the
    # rule "compact only below what LMDB holds durably" is under test too.
    monkeypatch.setenv("JETRAFT_JS_SNAPSHOT_EVERY", "200")
    seed = int(os.environ.get("JETRAFT_POWER_SEED", str(random.randrange(1 << 30))))
    disk = power_disk(torn=0.5 if model == "torn" else None, seed=seed)
    figures = await power_cut_run(servers, disk, CUTS[model], seed,
                                  cut=_kill_only if model == "kill9" else None)
    assert figures["acked"] > 0, f"seed {seed}: nothing was acknowledged"
    if model != "kill9":  # the cuts dropped unsynced pages: the layer saw the node's writes
        assert figures["dropped_pages"] > 0, figures
    print(f"power cuts ({model}, seed {seed}): {figures}")
