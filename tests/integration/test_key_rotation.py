"""Key rotation of a store encrypted at rest (`jetstream { key, prev_key }`, docs/jetstream.md
"Key rotation"), with real node processes, real files and nats-py:

- a store sealed under key A, restarted with `key: B, prev_key: A`, serves everything (messages,
  last-by-subject and subject counts through the index tokens, dedup hits, the consumer's
  floor); from then on B alone opens it and A is refused; no marker shows in any file;
- B without prev_key, or with a wrong prev_key, stops the node ([FTL], a clear message) and
  changes no byte of the store;
- kill -9 at every step of the key file's rewrite (the node SIGKILLs itself there): before
  the rename the old key still opens the store, after it the new one does, and no message
  is lost either way;
- a store made by the code before envelope keys (key file v1: the node as of commit d5f2fab,
  run from a git archive) opens, rotates and serves;
- the three spellings of prev_key; prev_key without key is a config error.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import nats
import nats.js.errors
import pytest

from node.jetstream import crypt
from tests.integration.conftest import ServerProc, Servers
from tests.integration.test_jetstream_encryption import (
    KEY,
    _check_all,
    _files,
    _fill,
    _grep,
)
from tests.ports import free_port

pytest.importorskip("cryptography")
pytestmark = pytest.mark.timeout(300)

NEW = "9d8c7b6a5f4e3d2c1b0a-rotated-key-7e6d5c4b3a291807"
ROOT = Path(__file__).resolve().parents[2]
# The last commit whose crypt.py wrote only key file v1 (before envelope keys).
V1_COMMIT = "d5f2fab2fd2d6f97a8f7ae5f76fa67c513313b6e"


def _config(store: Path, key: str | None, prev: str | None = None,
            cipher: str = "aes") -> str:
    parts = [f'store_dir: "{store}"', f"cipher: {cipher}"]
    if key is not None:
        parts.append(f'key: "{key}"')
    if prev is not None:
        parts.append(f'prev_key: "{prev}"')
    return "jetstream { " + ", ".join(parts) + " }\n"


def _start(servers: Servers, store: Path, key: str | None, prev: str | None = None
           ) -> ServerProc:
    return servers.jetraft(config=_config(store, key, prev))


def _run(servers: Servers, tmp_path: Path, store: Path, key: str | None,
         prev: str | None = None, env: dict[str, str] | None = None,
         timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A node run that is expected to end by itself (refused, or killed at a crash point)."""
    conf = tmp_path / f"run-{time.monotonic_ns()}.conf"
    conf.write_text(_config(store, key, prev))
    argv = servers.jetraft_argv(free_port(), ["-c", str(conf)])
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _refused(servers: Servers, tmp_path: Path, store: Path, key: str | None,
             prev: str | None, why: str) -> None:
    before = _files(store)
    proc = _run(servers, tmp_path, store, key, prev)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "[FTL]" in out and why in out, out[-2000:]
    assert "Server is ready" not in out
    assert _files(store) == before, f"the refused start ({key}, {prev}) changed the store"


@pytest.fixture
def small_snapshots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETRAFT_JS_SNAPSHOT_EVERY", "20")


@pytest.fixture(scope="module")
def sealed(module_servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store sealed under KEY (made once; each test works on its own copy): streams,
    messages with headers and msg ids, an acked consumer, snapshot files."""
    store = tmp_path_factory.mktemp("sealed") / "store"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JETRAFT_JS_SNAPSHOT_EVERY", "20")
        node = _start(module_servers, store, KEY)
        asyncio.run(_fill(node.port))
        assert node.stop() == 0
    assert list((store / "raft" / "snap").glob("*.data")), "meant to write snapshot files"
    return store


def _sealed_store(sealed: Path, store: Path) -> None:
    shutil.copytree(sealed, store)


def test_rotation_keeps_the_store_readable_and_retires_the_old_key(
        servers: Servers, tmp_path: Path, small_snapshots: None, sealed: Path) -> None:
    store = tmp_path / "store"
    _sealed_store(sealed, store)
    _refused(servers, tmp_path, store, NEW, None, "give the old one as jetstream.prev_key")
    _refused(servers, tmp_path, store, NEW, NEW + "x", "neither jetstream.key nor "
             "jetstream.prev_key opens")
    node = _start(servers, store, NEW, KEY)
    assert "re-wrapped under the new jetstream.key" in node.log_text()
    asyncio.run(_check_all(node.port))
    assert node.stop() == 0
    raw = (store / crypt.KEY_FILE).read_bytes()
    assert raw.startswith(b"JRCRYPT2\n") and KEY.encode() not in raw and NEW.encode() not in raw
    assert _grep(store) == []
    # The old key is retired: refused, store untouched.
    _refused(servers, tmp_path, store, KEY, None, "wrong key")
    node = _start(servers, store, NEW)  # prev_key no longer needed
    assert "re-wrapped" not in node.log_text()
    asyncio.run(_check_all(node.port))
    assert node.stop() == 0


@pytest.mark.parametrize("step", ["written", "synced", "renamed", "dir-synced"])
def test_kill9_at_each_step_of_the_rotation(servers: Servers, tmp_path: Path,
                                            small_snapshots: None, sealed: Path,
                                            step: str) -> None:
    store = tmp_path / "store"
    _sealed_store(sealed, store)
    old = (store / crypt.KEY_FILE).read_bytes()
    proc = _run(servers, tmp_path, store, NEW, KEY, env={crypt.CRASH_ENV: step})
    assert proc.returncode == -9, (proc.returncode, (proc.stdout + proc.stderr)[-2000:])
    now = (store / crypt.KEY_FILE).read_bytes()
    renamed = step in ("renamed", "dir-synced")
    assert (now != old) == renamed
    # Either key alone: the one the key file is wrapped under at that moment.
    node = _start(servers, store, NEW if renamed else KEY)
    asyncio.run(_check_all(node.port))
    assert node.stop() == 0


def _old_tree(dest: Path) -> Path | None:
    """The node as it was before envelope keys (git archive of V1_COMMIT), or None when this
    checkout lacks that commit (a shallow clone)."""
    archive = dest / "v1.tar"
    with open(archive, "wb") as out:
        got = subprocess.run(["git", "-C", str(ROOT), "archive", V1_COMMIT, "node", "raft",
                              "proto"], stdout=out, stderr=subprocess.PIPE)
    if got.returncode != 0:
        return None
    tree = dest / "v1"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def test_a_store_made_before_envelope_keys_opens_and_rotates(
        servers: Servers, tmp_path: Path, small_snapshots: None) -> None:
    tree = _old_tree(tmp_path)
    if tree is None:
        pytest.skip(f"commit {V1_COMMIT[:7]} is not in this checkout")
    store = tmp_path / "store"
    conf = tmp_path / "v1.conf"
    conf.write_text(_config(store, KEY))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(tree), "JETRAFT_PURE_PYTHON": "1"}
    old = subprocess.Popen([sys.executable, "-m", "node.cli", "serve", "-a", "127.0.0.1",
                            "-p", str(port), "-m", str(free_port()), "-c", str(conf)],
                           cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        asyncio.run(_wait_and_fill(port))
    finally:
        old.terminate()
        old.wait(30)
    assert (store / crypt.KEY_FILE).read_bytes().startswith(b"JRCRYPT1\n")
    # Rotated straight from v1 (a start with the same key upgrades the key file the same
    # way: tests/unit/test_crypt.py::test_a_v1_store_keeps_its_keys_and_rotates).
    node = _start(servers, store, NEW, KEY)
    asyncio.run(_check_all(node.port))
    assert node.stop() == 0
    assert (store / crypt.KEY_FILE).read_bytes().startswith(b"JRCRYPT2\n")
    node = _start(servers, store, NEW)
    asyncio.run(_check_all(node.port))
    assert node.stop() == 0
    assert _grep(store) == []
    shutil.rmtree(tree)


async def _wait_and_fill(port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            nc = await nats.connect(f"nats://127.0.0.1:{port}", allow_reconnect=False,
                                    connect_timeout=1)
            await nc.jetstream().account_info()
            await nc.close()
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    await _fill(port)


async def _serves(port: int, fill: bool = False) -> object:
    """What a client sees of stream S: its messages, last-by-subject and a dedup hit; or the
    error that stops it."""
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    try:
        if fill:
            await js.add_stream(name="S", subjects=["s.>"])
            for i in range(5):
                await js.publish(f"s.{i}", b"m%d" % i, headers={"Nats-Msg-Id": f"id{i}"})
        info = await js.stream_info("S")
        msgs = [(await js.get_msg("S", i + 1)).data for i in range(info.state.messages)]
        last = (await js.get_msg("S", subject="s.3")).seq
        dup = (await js.publish("s.0", b"x", headers={"Nats-Msg-Id": "id0"})).duplicate
        return msgs, last, dup
    except nats.js.errors.NotFoundError:
        return "stream not found"
    finally:
        await nc.close()


@pytest.mark.parametrize("impl", ["nats-server", "jetraft"])
def test_rotation_as_nats_server_does_it(servers: Servers, tmp_path: Path, impl: str) -> None:
    """The same rotation on both servers: created under A; `key: B, prev_key: A` serves it;
    then B alone does. The one difference: the retired key A. nats-server starts and serves
    the stream as missing (WRN "Error decrypting our stream metafile"); jetraft refuses to
    start ([FTL], fail closed) and leaves the store as it was."""
    store = tmp_path / "store"
    start = servers.nats_server if impl == "nats-server" else servers.jetraft
    want = ([b"m%d" % i for i in range(5)], 4, True)
    for key, prev, fill in ((KEY, None, True), (NEW, KEY, False), (NEW, None, False)):
        node = start(config=_config(store, key, prev))
        assert asyncio.run(_serves(node.port, fill)) == want, (impl, key, prev)
        node.stop()
    if impl == "nats-server":
        node = start(config=_config(store, KEY, None))
        assert asyncio.run(_serves(node.port)) == "stream not found"
        node.stop()
    else:
        _refused(servers, tmp_path, store, KEY, None, "wrong key")
    node = start(config=_config(store, NEW, None))  # nothing was harmed
    assert asyncio.run(_serves(node.port)) == want
    node.stop()


@pytest.mark.parametrize("name", ["prev_key", "prev_ek", "prev_encryption_key"])
def test_prev_key_spellings_and_prev_key_without_key(tmp_path: Path, name: str) -> None:
    from node.config import ConfigError, load_options

    conf = tmp_path / "n.conf"
    conf.write_text(f'jetstream {{ key: "{NEW}", {name}: "{KEY}" }}\n')
    js = load_options(str(conf)).jetstream
    assert (js.key, js.prev_key) == (NEW, KEY)
    # Without a key: nats-server accepts and ignores it; decrypting a store is not built.
    conf.write_text(f'jetstream {{ {name}: "{KEY}" }}\n')
    with pytest.raises(ConfigError, match="prev_key is set but jetstream.key is not"):
        load_options(str(conf))
