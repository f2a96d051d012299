"""Atomic batches and mirror/source copies against account limits (issue 8): held in
flight like publishes (node/jetstream/inflight.py), compared with nats-server 2.15.1 (R1).

- A batch larger than the account's room: nats-server stores its messages up to the limit
  and never answers the commit (a partial "atomic" batch); Jetraft refuses it whole with
  10002 on the commit's reply. Both stay within the limit.
- Thirty concurrent batches, each fitting alone: the commits that fit are acked, the rest
  get 10002, and the stored bytes stay within the limit, on both.
- A mirror and a source of a memory stream into file storage past `max_file`: both copy up
  to the account's limit, warn as nats-server does, and keep a lag (retried later).
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from typing import Any

import nats

from tests.integration.conftest import Servers

LIMIT = 100 * 1024
CONF = """
jetstream: { store_dir: "%s" }
accounts {
  A { users: [{user: a, password: p}], jetstream: { max_file: 100K, max_mem: 1M } }
}
"""
ERR_10002 = "10002 resource limits exceeded for account"


def _answer(data: bytes) -> str:
    if not data:
        return "empty"
    err = json.loads(data).get("error")
    return f"{err['err_code']} {err['description']}" if err else "ok"


async def _batch(nc: Any, subject: str, batch_id: str, n: int, timeout: float) -> str:
    """One atomic batch of `n` 1,000-byte messages; the commit's answer (or the first
    error, or the exception's name when there is no answer)."""
    for seq in range(1, n + 1):
        hdrs = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(seq)}
        if seq == n:
            hdrs["Nats-Batch-Commit"] = "1"
        try:
            msg = await nc.request(subject, b"x" * 1000, headers=hdrs, timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - no answer is an answer here
            return type(exc).__name__
        got = _answer(msg.data)
        if seq == n or got != "empty":
            return got
    raise AssertionError("unreachable")


async def _req(nc: Any, subject: str, body: dict | None = None) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else b""
    return json.loads((await nc.request(subject, data, timeout=10)).data)


async def _state(nc: Any, name: str) -> dict[str, Any]:
    return await _req(nc, f"$JS.API.STREAM.INFO.{name}")


async def _batches(nc: Any, slow: float) -> dict[str, Any]:
    cfg = {"name": "F", "subjects": ["F"], "storage": "file", "allow_atomic": True}
    await _req(nc, "$JS.API.STREAM.CREATE.F", cfg)
    out: dict[str, Any] = {"big": await _batch(nc, "F", "big", 150, timeout=3)}
    out["big bytes"] = (await _state(nc, "F"))["state"]["bytes"]
    await _req(nc, "$JS.API.STREAM.PURGE.F")
    got = await asyncio.gather(*[_batch(nc, "F", f"b{i}", 10, timeout=slow) for i in range(30)])
    out["many"] = dict(collections.Counter(got))
    out["many bytes"] = (await _state(nc, "F"))["state"]["bytes"]
    await _req(nc, "$JS.API.STREAM.DELETE.F")
    return out


async def _copies(nc: Any, log: Any) -> dict[str, Any]:
    await _req(nc, "$JS.API.STREAM.CREATE.O", {"name": "O", "subjects": ["o"],
                                              "storage": "memory"})
    await asyncio.gather(*[nc.request("o", b"x" * 1000, timeout=20) for _ in range(150)])
    await _req(nc, "$JS.API.STREAM.CREATE.M", {"name": "M", "storage": "file",
                                              "mirror": {"name": "O"}})
    await _req(nc, "$JS.API.STREAM.CREATE.S", {"name": "S", "storage": "file",
                                              "sources": [{"name": "O"}]})
    warned = ("Error processing inbound mirror message for 'A' > 'M': " + "resource limits "
              "exceeded for account (10002)",
              "Error processing inbound source \"O > >\" for 'A' > 'S': resource limits "
              "exceeded for account (10002)")
    deadline = time.monotonic() + 60
    while not all(w in log() for w in warned):
        assert time.monotonic() < deadline, log()[-2000:]
        await asyncio.sleep(0.1)
    m, s = await _state(nc, "M"), await _state(nc, "S")
    out = {"warned": True, "copied bytes": m["state"]["bytes"] + s["state"]["bytes"],
           "lag": m["mirror"]["lag"] + s["sources"][0]["lag"]}
    # Two sources of one stream start together: each link's entries are held in flight,
    # so neither checks the account without the other's copies on their way.
    for name in ("M", "S"):
        await _req(nc, f"$JS.API.STREAM.DELETE.{name}")
    await _req(nc, "$JS.API.STREAM.CREATE.P", {"name": "P", "subjects": ["p"],
                                              "storage": "memory"})
    await asyncio.gather(*[nc.request("p", b"x" * 1000, timeout=20) for _ in range(150)])
    await _req(nc, "$JS.API.STREAM.CREATE.T", {"name": "T", "storage": "file",
                                              "sources": [{"name": "O"}, {"name": "P"}]})
    deadline = time.monotonic() + 60
    while log().count("for 'A' > 'T': resource limits exceeded") < 2:
        assert time.monotonic() < deadline, log()[-2000:]
        await asyncio.sleep(0.1)
    out["two sources bytes"] = (await _state(nc, "T"))["state"]["bytes"]
    return out


async def test_batches_and_copies_stay_within_the_account_limits(servers: Servers) -> None:
    got = {}
    for name, start in (("nats-server", servers.nats_server), ("jetraft", servers.jetraft)):
        store = servers.workdir / name
        store.mkdir()
        srv = start(CONF % store)
        nc = await nats.connect(srv.url, user="a", password="p")
        try:
            # nats-server leaves a partly stored batch unanswered: wait less for its answers
            slow = 4.0 if name == "nats-server" else 20.0
            got[name] = {**await _batches(nc, slow), **await _copies(nc, srv.log_text)}
        finally:
            await nc.close()
    ours, theirs = got["jetraft"], got["nats-server"]
    for out in (ours, theirs):
        assert out["big bytes"] <= LIMIT and out["many bytes"] <= LIMIT, out
        assert out["many"].get(ERR_10002, 0) > 0 and out["many"].get("ok", 0) > 0, out
        assert out["copied bytes"] <= LIMIT and out["lag"] > 0, out
        assert out["two sources bytes"] <= LIMIT, out
    # nats-server leaves the commit unanswered with a part stored; Jetraft refuses it whole.
    assert theirs["big"] == "TimeoutError" and theirs["big bytes"] > 0, theirs
    assert ours["big"] == ERR_10002 and ours["big bytes"] == 0, ours


async def test_batches_and_copies_stay_within_the_nodes_own_limit(servers: Servers) -> None:
    """The node's `jetstream { max_file }` (10023), no account limits: a batch whose
    messages ahead of its last would take the node past it is refused whole, and a source's
    copies stop at it (each checked as a publish: one message may go past, as in
    nats-server, which stopped at 100,455 B). Mutations: the batch checked without its
    messages (`before`), or copies without the node's limit -> FAILS."""
    store = servers.workdir / "own"
    store.mkdir()
    srv = servers.jetraft(f'jetstream: {{ store_dir: "{store}", max_file: 100K, max_mem: 4M }}\n')
    nc = await nats.connect(srv.url)
    try:
        await _req(nc, "$JS.API.STREAM.CREATE.F", {"name": "F", "subjects": ["F"],
                                                  "storage": "file", "allow_atomic": True})
        assert await _batch(nc, "F", "big", 150, timeout=10) == "10023 insufficient resources"
        assert (await _state(nc, "F"))["state"]["bytes"] == 0
        await _req(nc, "$JS.API.STREAM.DELETE.F")
        await _req(nc, "$JS.API.STREAM.CREATE.O", {"name": "O", "subjects": ["o"],
                                                  "storage": "memory"})
        await asyncio.gather(*[nc.request("o", b"x" * 1000, timeout=20) for _ in range(150)])
        await _req(nc, "$JS.API.STREAM.CREATE.S", {"name": "S", "storage": "file",
                                                  "sources": [{"name": "O"}]})
        warned = "Error processing inbound source \"O > >\" for '$G' > 'S': insufficient " \
                 "resources (10023)"
        deadline = time.monotonic() + 60
        while warned not in srv.log_text():
            assert time.monotonic() < deadline, srv.log_text()[-2000:]
            await asyncio.sleep(0.1)
        # The warning is logged when a batch of copies is cut to what fits, before the
        # fitting ones are committed (node/jetstream/sourcing_wire.py `_within_limits`): at
        # load 20 a read right after it found 0 bytes. Until they are stored (bounded).
        s, stored_by = await _state(nc, "S"), time.monotonic() + 20
        while s["state"]["bytes"] == 0 and time.monotonic() < stored_by:
            await asyncio.sleep(0.1)
            s = await _state(nc, "S")
        assert 0 < s["state"]["bytes"] <= LIMIT + 1100 and s["sources"][0]["lag"] > 0, s
    finally:
        await nc.close()
