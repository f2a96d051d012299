"""Mirrors, sources and STREAM.SNAPSHOT/RESTORE inside a named account, against nats-server.

The whole mirror/source script of test_jetstream_mirrors.py and the snapshot/restore script
of test_jetstream_snapshot.py run as a user of account A (jetstream enabled per account),
against `nats-server -c conf` and `jetraft serve -c conf`; every step is compared as those
tests compare it. Before each script, account B creates streams named like A's origins
(`O`, `P`, `S`) on the same subjects holding other data: a mirror, source or restore that
reached B's streams (or the global account) would change A's results, and B's streams must
be untouched after.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats

from tests.integration import test_jetstream_mirrors as mirrors
from tests.integration import test_jetstream_snapshot as snapshots
from tests.integration.conftest import ServerProc, Servers
from tests.integration.jsdiff import assert_same_steps

CONF = """
jetstream { store_dir: "%s" }
accounts {
  A { users: [{user: a, password: p}], jetstream: enabled }
  B { users: [{user: b, password: p}], jetstream: enabled }
  SYS { users: [{user: s, password: p}] }
}
system_account: SYS
"""
DECOYS = ("O", "P", "S")


def _pair(servers: Servers, tmp_path: Path) -> dict[str, ServerProc]:
    return {"nats-server": servers.nats_server(CONF % (tmp_path / "theirs")),
            "jetraft": servers.jetraft(CONF % (tmp_path / "ours"))}


def _url(srv: ServerProc, user: str) -> str:
    return f"nats://{user}:p@127.0.0.1:{srv.port}"


async def _decoys(srv: ServerProc) -> list[Any]:
    """Account B's streams named like A's, on the same subjects, 5 messages each."""
    nc = await nats.connect(_url(srv, "b"))
    js = nc.jetstream()
    try:
        for name in DECOYS:
            await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
            for i in range(5):
                await js.publish(f"{name.lower()}.b", f"B-{name}-{i}".encode())
        return await _b_state(nc)
    finally:
        await nc.close()


async def _b_state(nc: Any) -> list[Any]:
    out = []
    for name in DECOYS:
        reply = await nc.request(f"$JS.API.STREAM.INFO.{name}", b"", timeout=5)
        state = json.loads(reply.data)["state"]
        out.append((name, state["messages"], state["first_seq"], state["last_seq"]))
    return out


async def _b_after(srv: ServerProc) -> list[Any]:
    nc = await nats.connect(_url(srv, "b"))
    try:
        return await _b_state(nc)
    finally:
        await nc.close()


async def test_mirrors_and_sources_in_an_account_match_nats_server(
        servers: Servers, tmp_path: Path) -> None:
    pair = _pair(servers, tmp_path)

    async def run(impl: str, srv: ServerProc) -> list[Any]:
        before = await _decoys(srv)
        out = await mirrors._script(_url(srv, "a"))
        assert await _b_after(srv) == before == [(n, 5, 1, 5) for n in DECOYS], impl
        return out

    # Both servers at once: most of nats-server's time is its sourcing timers, not CPU.
    their, mine = await asyncio.gather(run("nats-server", pair["nats-server"]),
                                       run("jetraft", pair["jetraft"]))
    diffs = [f"step {i}:\n  ours:   {mirrors._strip(a)}\n  theirs: {mirrors._strip(b)}"
             for i, (a, b) in enumerate(zip(mine, their, strict=True))
             if mirrors._strip(a) != mirrors._strip(b)]
    assert not diffs, "\n".join(diffs)
    # the script's mirror M holds A's O messages (o0..o5 less the deleted seq 2), not B's
    m_info = mine[12]  # after 3 setup steps and 9 creates: M settled
    assert m_info["config"]["name"] == "M" and m_info["state"]["messages"] == 5


async def test_snapshot_and_restore_in_an_account_match_nats_server(
        servers: Servers, tmp_path: Path) -> None:
    pair = _pair(servers, tmp_path)
    results = {}
    for impl, srv in pair.items():
        before = await _decoys(srv)
        results[impl] = await snapshots._script(_url(srv, "a"))
        assert await _b_after(srv) == before, impl
    mine, their = results["jetraft"], results["nats-server"]
    assert_same_steps(mine, their, snapshots.ALLOWED_TO_DIFFER)
    assert their[5] == (True, True, True, True) and their[13] is True
    assert mine[10]["state"]["first_ts"] == mine[4]["state"]["first_ts"]
