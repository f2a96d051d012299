"""The server's own `jetstream { max_mem, max_file }` against the accounts and streams that
reserve it, against nats-server 2.15 (standalone).

* The configured accounts' limits together may not exceed the server's: nats-server stops
  at start with [FTL] "Can't start JetStream: Error enabling jetstream on configured
  accounts: insufficient storage resources available (10047)"; so must Jetraft.
* Stream creates and updates in every account share the server's limits through their
  `max_bytes` (10047 file, 10028 memory), and a publish once the node's stored bytes are past
  `max_file` is refused with 10023 "insufficient resources".

Mutation (docs/notes/tiered.md): `server_admits_accounts` returning None lets Jetraft start
(the FTL test fails); `check_server_stream` returning at once accepts S's create."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import nats

from tests.integration.conftest import ServerProc, Servers, jetraft_argv, nats_server_argv
from tests.integration.jsdiff import assert_same_steps
from tests.integration.test_jetstream_accounts_diff import ALLOWED, _req, _stream

CONF = """
jetstream { store_dir: "%s", max_mem: 2000, max_file: 10000 }
accounts {
  A { users: [{user: a, password: p}], jetstream: { max_file: %d, max_mem: 1000 } }
  B { users: [{user: b, password: p}], jetstream: { max_file: 6000 } }
  C { users: [{user: c, password: p}], jetstream: enabled }
}
"""


async def _script(srv: ServerProc) -> list[Any]:
    c = await nats.connect(f"nats://c:p@127.0.0.1:{srv.port}")
    steps: list[Any] = []
    try:
        for body in (_stream("S", ["s"], max_bytes=20_000), _stream("S", ["s"], max_bytes=8000),
                     _stream("T", ["t"], max_bytes=3000), _stream("U", ["u"]),
                     _stream("M", ["m"], storage="memory", max_bytes=3000)):
            steps.append(await _req(c, f"$JS.API.STREAM.CREATE.{body['name']}", body))
        for max_bytes in (10_000, 10_001, 8000):  # an update's reservation: 10047 past it
            steps.append(await _req(c, "$JS.API.STREAM.UPDATE.S",
                                    _stream("S", ["s"], max_bytes=max_bytes)))
        for _ in range(12):  # ~1031 bytes a record: the 11th finds 10310 > 10000 stored
            steps.append(await _req(c, "u", b"x" * 1000))
        steps.append(await _req(c, "$JS.API.INFO"))
    finally:
        await c.close()
    return steps


async def test_server_reservations_like_nats_server(servers: Servers, tmp_path: Path) -> None:
    theirs = await _script(servers.nats_server(CONF % (tmp_path / "theirs", 4000)))
    ours = await _script(servers.jetraft(CONF % (tmp_path / "ours", 4000)))
    assert_same_steps(ours, theirs, ALLOWED)
    codes = [s.get("error", {}).get("err_code") for s in ours]
    assert codes[:8] == [10047, None, 10047, None, 10028, None, 10047, None]
    assert codes[8:18] == [None] * 10 and codes[18:20] == [10023, 10023]


async def _exit_line(argv: list[str], tmp: Path) -> tuple[int, str]:
    """Run a server that is expected to stop at start: its exit code and its [FTL] line."""
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT, cwd=tmp)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    ftl = [line for line in out.decode().splitlines() if "[FTL]" in line]
    return proc.returncode or 0, ftl[0].split("[FTL] ", 1)[1] if ftl else out.decode()[-2000:]


async def test_accounts_over_the_server_stop_it_at_start(tmp_path: Path) -> None:
    want = ("Can't start JetStream: Error enabling jetstream on configured accounts: "
            "insufficient storage resources available (10047)")
    # 6000 + 6000 of file storage reserved by accounts A and B: over the server's 10000
    for name in ("theirs", "ours"):
        conf = CONF % (tmp_path / name, 6000)
        ports = (Servers.free_port(), Servers.free_port())
        argv = nats_server_argv(*ports, tmp_path, conf, []) if name == "theirs" else \
            jetraft_argv(*ports, tmp_path, conf, [], None)
        code, line = await _exit_line(argv, tmp_path)
        assert code != 0 and line == want, (name, code, line)
