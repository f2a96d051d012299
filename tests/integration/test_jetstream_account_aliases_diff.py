"""Every spelling nats-server accepts for an account's JetStream limits is enforced, against
nats-server 2.15: `disk_max_stream_bytes` / `mem_max_stream_bytes` (10122) and
`max_stream_bytes` (a bool: max bytes required, 10113) were read and silently ignored
before, which left those limits open.

Mutation (docs/notes/tiered.md): putting the three keys back among the ignored ones
(`accountconf._JS_IGNORED`) fails this test (the creates are accepted, INFO shows -1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nats

from tests.integration.conftest import ServerProc, Servers
from tests.integration.jsdiff import assert_same_steps
from tests.integration.test_jetstream_accounts_diff import ALLOWED, _req, _stream

CONF = """
jetstream { store_dir: "%s" }
accounts {
  D { users: [{user: d, password: p}], jetstream: { max_file: 1M, disk_max_stream_bytes: 100 } }
  M { users: [{user: m, password: p}], jetstream: { max_mem: 1M, mem_max_stream_bytes: 100 } }
  R { users: [{user: r, password: p}], jetstream: { max_file: 1M, max_stream_bytes: true } }
}
"""


async def _script(srv: ServerProc) -> list[Any]:
    steps: list[Any] = []
    for user, body in (("d", _stream("S", ["s"], max_bytes=200)),
                       ("m", _stream("S", ["s"], max_bytes=200, storage="memory")),
                       ("r", _stream("S", ["s"]))):
        nc = await nats.connect(f"nats://{user}:p@127.0.0.1:{srv.port}")
        try:
            steps.append(await _req(nc, "$JS.API.INFO"))
            steps.append(await _req(nc, "$JS.API.STREAM.CREATE.S", body))
        finally:
            await nc.close()
    return steps


async def test_limit_aliases_like_nats_server(servers: Servers, tmp_path: Path) -> None:
    theirs = await _script(servers.nats_server(CONF % (tmp_path / "theirs")))
    ours = await _script(servers.jetraft(CONF % (tmp_path / "ours")))
    assert_same_steps(ours, theirs, ALLOWED)
    assert [ours[i]["error"]["err_code"] for i in (1, 3, 5)] == [10122, 10122, 10113]
