"""Encryption at rest (`jetstream { key, cipher }`, docs/jetstream.md "Encryption at rest"),
with real node processes, real files and nats-py:

- markers in a payload, a header, a consumer's name-free state and a stream description never
  appear in any file under the store dir (WAL, LMDB, snapshots, key file), for both ciphers;
  the same run without a key finds them, so the grep can fail;
- a restart with the right key serves every message;
- a wrong key, a missing key, or a key on an unencrypted store stops the node ([FTL]) and
  changes no byte of the store; the right key still opens it afterwards;
- kill -9 during encrypted publishing loses nothing acknowledged.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest

from node.jetstream import crypt
from tests.integration.conftest import ServerProc, Servers

KEY = "3f1c0a9e8b7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b"
PAYLOAD = b"PAYLOAD-MARKER-7Q2Z"
HEADER = "HEADER-MARKER-K8W3"
DESC = "DESC-MARKER-J5V1"
SUBJ = "SUBJ-MARKER-R4"  # in subjects: sealed in records, tokens in the index keys
MSGID = "MSGID-MARKER-P3"  # Nats-Msg-Id: sealed in headers, a token in the dedup keys
MARKERS = (PAYLOAD, HEADER.encode(), DESC.encode(), SUBJ.encode(), MSGID.encode())
N = 60


def _config(store: Path, key: str | None, cipher: str | None) -> str:
    parts = [f"store_dir: {json.dumps(str(store))}"]
    if key is not None:
        parts.append(f"key: {json.dumps(key)}")
    if cipher is not None:
        parts.append(f"cipher: {cipher}")
    return "jetstream { " + ", ".join(parts) + " }\n"


def _start(servers: Servers, store: Path, key: str | None, cipher: str | None,
           port: int | None = None) -> ServerProc:
    return servers.jetraft(config=_config(store, key, cipher), port=port)


def _run_refused(servers: Servers, tmp_path: Path, store: Path, key: str | None,
                 cipher: str | None) -> subprocess.CompletedProcess[str]:
    conf = tmp_path / f"refused-{random.randrange(1 << 30)}.conf"
    conf.write_text(_config(store, key, cipher))
    argv = servers.jetraft_argv(servers.free_port(), ["-c", str(conf)])
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _files(store: Path) -> dict[str, str]:
    """Every file under the store with its digest (lock.mdb: LMDB's reader table, rewritten
    by every open, holds no data)."""
    out = {}
    for path in sorted(store.rglob("*")):
        if path.is_file() and path.name != "lock.mdb":
            out[str(path.relative_to(store))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _grep(store: Path) -> list[tuple[str, bytes]]:
    hits = []
    for path in sorted(store.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            hits += [(str(path.relative_to(store)), m) for m in MARKERS if m in data]
    return hits


async def _fill(port: int) -> None:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    await js.add_stream(name="ENC", subjects=["enc.>"], description=DESC)
    for i in range(N):
        ack = await js.publish(f"enc.{SUBJ}.{i % 3}", PAYLOAD + b"-%d" % i,
                               headers={"X-M": HEADER, "Nats-Msg-Id": f"{MSGID}-{i}"})
        assert ack.seq == i + 1
    # More than JETRAFT_JS_SNAPSHOT_EVERY meta entries: the meta group writes a snapshot
    # file holding the catalogue (every stream config, descriptions included).
    for i in range(22):
        await js.add_stream(name=f"D{i}", subjects=[f"d{i}.>"], description=DESC)
    # A memory stream: nothing of it in a file but its Raft entries, which are sealed too.
    await js.add_stream(name="MEM", subjects=["mem.>"], storage="memory")
    for i in range(5):
        await js.publish("mem.x", PAYLOAD + b"-mem-%d" % i)
    sub = await js.pull_subscribe("enc.>", durable="C")
    got = await sub.fetch(10, timeout=5)
    for m in got:
        await m.ack_sync()
    await nc.close()


async def _check_all(port: int, dedup: bool = True) -> None:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    info = await js.stream_info("ENC")
    assert info.state.messages == N and info.config.description == DESC
    for i in range(N):
        msg = await js.get_msg("ENC", i + 1)
        assert msg.data == PAYLOAD + b"-%d" % i and msg.subject == f"enc.{SUBJ}.{i % 3}"
        assert msg.headers == {"X-M": HEADER, "Nats-Msg-Id": f"{MSGID}-{i}"}
    # the per-subject index (tokens when encrypted) and its subject list
    last = await js.get_msg("ENC", subject=f"enc.{SUBJ}.1")
    assert last.seq == max(i + 1 for i in range(N) if i % 3 == 1)
    info = await js.stream_info("ENC", subjects_filter=">")
    assert info.state.subjects == {f"enc.{SUBJ}.{k}": N // 3 for k in range(3)}
    if dedup:  # deduplication still finds a msg id in the window (a restore does not keep it)
        ack = await js.publish(f"enc.{SUBJ}.0", b"again",
                               headers={"Nats-Msg-Id": f"{MSGID}-5"})
        assert ack.duplicate and ack.seq == 6
    ci = await js.consumer_info("ENC", "C")
    assert ci.ack_floor.stream_seq == 10
    await nc.close()


async def _memory_stream_is_empty(port: int) -> None:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:  # as a standalone nats-server: a memory stream does not outlive a restart
        await nc.jetstream().stream_info("MEM")
        raise AssertionError("the memory stream outlived the restart")
    except nats.js.errors.NotFoundError:
        pass
    finally:
        await nc.close()


@pytest.fixture
def small_snapshots(monkeypatch: pytest.MonkeyPatch) -> None:
    # Inherited by the node: WAL compactions and snapshot files within this short run.
    monkeypatch.setenv("JETRAFT_JS_SNAPSHOT_EVERY", "20")


@pytest.mark.parametrize("cipher", ["chacha", "aes", None])
def test_no_marker_in_any_file_and_restart_serves_all(
        servers: Servers, tmp_path: Path, small_snapshots: None, cipher: str | None) -> None:
    store = tmp_path / "store"
    key = KEY if cipher else None
    node = _start(servers, store, key, cipher)
    asyncio.run(_fill(node.port))
    assert node.stop() == 0
    meta_snap = (store / "raft" / "snap").glob(b"$js".hex() + ".*.data")
    assert [p for p in meta_snap if p.stat().st_size], "the run was meant to snapshot $js"
    hits = _grep(store)
    if cipher is None:
        # Without a key the same run leaves every marker readable: the grep can fail.
        assert {m for _, m in hits} == set(MARKERS), hits
        return
    assert hits == [], hits
    assert (store / "crypt").exists()
    node = _start(servers, store, key, cipher, port=node.port)
    asyncio.run(_check_all(node.port))
    asyncio.run(_memory_stream_is_empty(node.port))  # R1 memory: empty after a restart
    assert node.stop() == 0


def test_wrong_or_missing_key_stops_the_node_and_changes_nothing(
        servers: Servers, tmp_path: Path) -> None:
    store = tmp_path / "store"
    node = _start(servers, store, KEY, "chacha")
    asyncio.run(_fill(node.port))
    assert node.stop() == 0
    before = _files(store)
    cases = [
        ("wrong-key", KEY[::-1], "chacha", "wrong key"),
        ("no-key", None, None, "no jetstream.key"),
        ("other-cipher", KEY, "aes", "encrypted with cipher 'chacha'"),
    ]
    for name, key, cipher, why in cases:
        proc = _run_refused(servers, tmp_path, store, key, cipher)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, (name, out[-2000:])
        assert "[FTL]" in out and why in out, (name, out[-2000:])
        assert "Server is ready" not in out, name
        assert _files(store) == before, f"{name}: the refused start changed the store"
    node = _start(servers, store, KEY, "chacha")
    asyncio.run(_check_all(node.port))
    assert node.stop() == 0


def test_a_key_on_an_unencrypted_store_is_refused(servers: Servers, tmp_path: Path) -> None:
    store = tmp_path / "store"
    node = _start(servers, store, None, None)
    asyncio.run(_fill(node.port))
    assert node.stop() == 0
    before = _files(store)
    proc = _run_refused(servers, tmp_path, store, KEY, "aes")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "[FTL]" in out and "unencrypted data" in out, out[-2000:]
    assert _files(store) == before
    node = _start(servers, store, None, None)
    asyncio.run(_check_all(node.port))
    assert node.stop() == 0


async def _publish_until_killed(port: int, acked: dict[int, bytes], sent: list[int],
                                stop_at: float) -> None:
    nc = await nats.connect(f"nats://127.0.0.1:{port}", max_reconnect_attempts=0)
    js = nc.jetstream()
    try:
        while time.monotonic() < stop_at:
            sent[0] += 1
            payload = PAYLOAD + b"-%d" % sent[0]
            ack = await js.publish("k.x", payload, timeout=2)
            acked[ack.seq] = payload
    except Exception:  # noqa: BLE001 - the kill cuts the connection: expected
        pass
    finally:
        try:
            await nc.close()
        except Exception:  # noqa: BLE001
            pass


async def _kill_during(node: ServerProc, acked: dict[int, bytes], sent: list[int],
                       secs: float) -> None:
    stop_at = time.monotonic() + 30
    task = asyncio.ensure_future(_publish_until_killed(node.port, acked, sent, stop_at))
    await asyncio.sleep(secs)
    assert node.proc is not None
    os.kill(node.proc.pid, signal.SIGKILL)
    node.proc.wait(10)
    await task


async def _create_k(port: int) -> None:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    await nc.jetstream().add_stream(name="K", subjects=["k.>"])
    await nc.close()


async def _check_k(port: int, acked: dict[int, bytes]) -> None:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    items = sorted(acked.items())
    for i in range(0, len(items), 64):  # 64 requests in flight: no round trip wait each
        window = items[i:i + 64]
        msgs = await asyncio.gather(*(js.get_msg("K", seq) for seq, _ in window))
        for (seq, payload), msg in zip(window, msgs, strict=True):
            assert msg.data == payload, seq
    await nc.close()


def test_kill9_during_encrypted_publishing_loses_nothing_acked(
        servers: Servers, tmp_path: Path, small_snapshots: None) -> None:
    store = tmp_path / "store"
    rng = random.Random(int(os.environ.get("JS_KILL_SEED", "8")))
    node = _start(servers, store, KEY, "aes")
    asyncio.run(_create_k(node.port))
    acked: dict[int, bytes] = {}
    sent = [0]
    for _cycle in range(int(os.environ.get("JS_CRYPT_KILLS", "3"))):
        asyncio.run(_kill_during(node, acked, sent, rng.uniform(0.5, 2.0)))
        node = _start(servers, store, KEY, "aes", port=node.port)
        asyncio.run(_check_k(node.port, acked))
    assert len(acked) > 20, "too few acknowledged publishes to mean anything"
    assert node.stop() == 0
    assert _grep(store) == []


@pytest.mark.parametrize("spelling,valid", [
    ("chacha", True), ("chachapoly", True), ("CHACHA", True), ("ChaChaPoly", True),
    ("aes", True), ("AES", True), ("ChaCha20", False), ("aesgcm", False), ("aes-gcm", False),
    ("xchacha", False), ("none", False),
])
@pytest.mark.parametrize("impl", ["nats-server", "jetraft"])
def test_cipher_spellings_as_nats_server(impl: str, tmp_path: Path, spelling: str,
                                         valid: bool) -> None:
    """Which `cipher` values nats-server 2.15 accepts (`-t`), and that Jetraft agrees."""
    conf = tmp_path / "c.conf"
    conf.write_text(_config(tmp_path / "s", KEY, spelling))
    argv = (["nats-server"] if impl == "nats-server" else
            [sys.executable, "-m", "node.cli", "serve"]) + ["-t", "-c", str(conf)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert (proc.returncode == 0) == valid, proc.stdout + proc.stderr
    if not valid:
        assert f'Unknown cipher type: "{spelling}"' in proc.stdout + proc.stderr


def test_audit_refuses_an_encrypted_store_clearly(servers: Servers, tmp_path: Path) -> None:
    store = tmp_path / "store"
    node = _start(servers, store, KEY, "chacha")
    asyncio.run(_create_k(node.port))
    assert node.stop() == 0
    proc = subprocess.run([sys.executable, "-m", "node.cli", "audit", str(store),
                           "--out", str(tmp_path / "report")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "encrypted at rest" in proc.stderr and "refusing" in proc.stderr
    assert not (tmp_path / "report").exists()


async def _backup_and_restore(port: int, store: Path) -> None:
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    chunks: list[bytes] = []
    done = asyncio.Event()

    async def cb(msg: Any) -> None:
        chunks.append(msg.data)
        if msg.reply:
            await nc.publish(msg.reply, b"")
        if not msg.data:
            done.set()

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=cb)
    await nc.request("$JS.API.STREAM.SNAPSHOT.ENC",
                     json.dumps({"deliver_subject": inbox}).encode(), timeout=10)
    await asyncio.wait_for(done.wait(), 20)
    await sub.unsubscribe()
    js = nc.jetstream()
    info = await js.stream_info("ENC")
    await js.delete_stream("ENC")
    start = json.loads((await nc.request("$JS.API.STREAM.RESTORE.ENC", json.dumps(
        {"config": info.config.as_dict(), "state": {}}).encode(), timeout=10)).data)
    for chunk in chunks[:-1]:
        await nc.request(start["deliver_subject"], chunk, timeout=10)
    # The upload waits in the store dir until its last chunk: sealed like everything else.
    uploads = list(store.glob("restore-*"))
    assert len(uploads) == 1 and uploads[0].read_bytes().startswith(crypt.FILE_MAGIC)
    final = await nc.request(start["deliver_subject"], b"", timeout=20)
    assert "error" not in json.loads(final.data), final.data
    await nc.close()


def test_backup_and_restore_of_an_encrypted_stream(servers: Servers, tmp_path: Path) -> None:
    store = tmp_path / "store"
    node = _start(servers, store, KEY, "aes")
    asyncio.run(_fill(node.port))
    asyncio.run(_backup_and_restore(node.port, store))
    asyncio.run(_check_all(node.port, dedup=False))
    assert node.stop() == 0
    assert _grep(store) == []


def test_a_cipher_without_a_key_is_refused(tmp_path: Path) -> None:
    """nats-server accepts it and stores in the clear; asking for a cipher and getting none
    would fail open, so Jetraft refuses the config."""
    conf = tmp_path / "c.conf"
    conf.write_text(_config(tmp_path / "s", None, "aes"))
    proc = subprocess.run([sys.executable, "-m", "node.cli", "serve", "-t", "-c", str(conf)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "jetstream.cipher is set but jetstream.key is not" in proc.stdout + proc.stderr
