"""`jetstream { domain: hub }` against nats-server 2.15.1 (issue 8, the `jetstream {}` block).

The same nats-py script runs against `nats-server -c conf` and `jetraft serve -c conf`, both
with the domain configured, and every reply's whole JSON is compared (times and ids masked):
`nc.jetstream(domain="hub")` driving streams, consumers (pull fetch + ack), KV and the Object
Store; raw `$JS.hub.API.*` requests (INFO, STREAM.CREATE/UPDATE/INFO/LIST, CONSUMER.*,
MSG.GET, DIRECT.GET, `$JS.hub.API.$KV.*`); the PubAck's `domain`; what subscribers on
`$JS.hub.API.>` and `$JS.API.>` see (the prefix is an account mapping: only the mapped subject
is seen); the advisories' `domain`; an account without JetStream and the system account
(10039 through the prefix); another domain's prefix (no responders); INFO, /varz and /jsz.
Then the start-up errors for invalid domain names, next to nats-server's.

Mutations (docs/notes/domain.md): dropping the domain table from the router
(`node/server.py` `_wire_router`) fails test_domain_as_nats_server (no responders on the
prefix); a domain check that lets `.` through fails test_invalid_domain_names_as_nats_server.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from tests.integration.conftest import ServerProc, Servers
from tests.integration.jsdiff import assert_same_steps, kv_history, kv_keys
from tests.ports import free_port

ALLOWED = {"created", "ts", "first_ts", "last_ts", "time", "last_active", "leader", "id",
           "server_id", "now", "timestamp", "mtime", "nuid", "client", "response",
           "max_memory", "max_storage", "store_dir", "sync_interval", "metadata",
           "Nats-Time-Stamp"}

CONF = """
jetstream { store_dir: "%s", domain: hub }
accounts {
  A { users: [{user: a, password: p}], jetstream: enabled }
  B { users: [{user: b, password: p}] }
  SYS { users: [{user: s, password: p}] }
}
system_account: SYS
"""


async def _req(nc: Any, subject: str, body: Any = b"") -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        msg = await nc.request(subject, data, timeout=5)
    except Exception as exc:  # noqa: BLE001 (the step records what happened)
        return type(exc).__name__
    if msg.data and msg.data[:1] == b"{":
        return json.loads(msg.data)
    return {"headers": dict(msg.headers or {}), "data": msg.data.decode(errors="replace")}


def _drain(sub: Any) -> list[Any]:
    out = []
    while True:
        try:
            msg = sub.messages._queue.get_nowait()  # noqa: SLF001 (no wait: what arrived)
        except asyncio.QueueEmpty:
            return out
        out.append(msg)


async def _until_stream_deleted(sub: Any, stream: str, limit: float = 5.0) -> list[Any]:
    """The advisories that arrived by the deletion of `stream`'s advisory (at most `limit`
    seconds), and until quiet after it."""
    seen: list[Any] = []
    for _ in range(int(limit / 0.1)):
        seen += [json.loads(m.data) for m in _drain(sub)]
        if any(a["type"].endswith("stream_action") and a.get("action") == "delete"
               and a.get("stream") == stream for a in seen):
            break
        await asyncio.sleep(0.1)
    await _quiet(sub)
    return seen + [json.loads(m.data) for m in _drain(sub)]


async def _quiet(sub: Any, quiet: float = 1.0, limit: float = 6.0) -> None:
    """Until `sub` got nothing new for `quiet` seconds (a loaded nats-server sends some
    advisories well after the reply), at most `limit` seconds."""
    waited, last = 0.0, -1
    while waited < limit:
        size = sub.messages._queue.qsize()  # noqa: SLF001
        if size == last:
            return
        last = size
        await asyncio.sleep(quiet)
        waited += quiet


def _masked(subject: str) -> str:
    """A KV watcher's ephemeral consumer name is random."""
    return re.sub(r"^(\$JS\.API\.CONSUMER\.INFO\.KV_B)\..*", r"\1.*", subject)


def _http(srv: ServerProc, path: str) -> Any:
    with urllib.request.urlopen(srv.http + path, timeout=10) as resp:
        return json.loads(resp.read())


async def _script(srv: ServerProc) -> tuple[list[Any], list[Any]]:
    out: list[Any] = []
    nc = await nats.connect(f"nats://a:p@127.0.0.1:{srv.port}")
    nb = await nats.connect(f"nats://b:p@127.0.0.1:{srv.port}")
    try:
        info = nc._server_info  # noqa: SLF001 (INFO as the client got it)
        out.append({k: info.get(k) for k in ("jetstream", "domain", "api_lvl")})
        out.append(await _req(nc, "$JS.other.API.INFO"))
        out.append(await _req(nb, "$JS.hub.API.INFO"))
        out.append(await _req(nb, "$JS.hub.API.STREAM.CREATE.X", {"name": "X"}))
        ns = await nats.connect(f"nats://s:p@127.0.0.1:{srv.port}")
        try:  # the system account gets the mappings too
            out.append(await _req(ns, "$JS.hub.API.INFO"))
            out.append(await _req(ns, "$JS.hub.API.STREAM.CREATE.X", {"name": "X"}))
        finally:
            await ns.close()
        plain = await nc.subscribe("$JS.API.>")
        prefixed = await nc.subscribe("$JS.hub.API.>")
        advisories = await nc.subscribe("$JS.EVENT.>")
        out.append(await _req(nc, "$JS.hub.API.INFO"))
        out.append(await _req(nc, "$JS.hub.API.STREAM.CREATE.S",
                              {"name": "S", "subjects": ["s.>"], "allow_direct": True}))
        out.append(await _req(nc, "$JS.hub.API.STREAM.UPDATE.S",
                              {"name": "S", "subjects": ["s.>"], "allow_direct": True,
                               "max_msgs": 100}))
        js = nc.jetstream(domain="hub")
        for i in range(3):
            ack = await js.publish(f"s.{i}", b"m%d" % i)
            out.append({"stream": ack.stream, "seq": ack.seq, "domain": ack.domain})
        out.append(await _req(nc, "s.3", b"raw"))
        out.append(await _req(nc, "$JS.hub.API.STREAM.INFO.S"))
        out.append(await _req(nc, "$JS.hub.API.STREAM.LIST"))
        out.append(await _req(nc, "$JS.hub.API.STREAM.NAMES"))
        out.append(await _req(nc, "$JS.hub.API.STREAM.MSG.GET.S", {"seq": 2}))
        out.append(await _req(nc, "$JS.hub.API.DIRECT.GET.S", {"last_by_subj": "s.1"}))
        out.append(await _req(nc, "$JS.hub.API.CONSUMER.CREATE.S.C", {
            "stream_name": "S", "config": {"durable_name": "C", "ack_policy": "explicit"}}))
        psub = await js.pull_subscribe("s.>", "D")
        msgs = await psub.fetch(2, timeout=5)
        for m in msgs:
            md = m.metadata
            out.append([m.subject, m.data.decode(), md.sequence.stream, md.sequence.consumer,
                        md.num_pending, md.domain])
            await m.ack_sync()
        esub = await js.pull_subscribe("s.2", "E", config=ConsumerConfig(
            ack_policy=AckPolicy.EXPLICIT, sample_freq="100%"))
        (m,) = await esub.fetch(1, timeout=5)
        await m.nak()
        (m,) = await esub.fetch(1, timeout=5)
        await m.term()
        await asyncio.sleep(0.2)
        out.append(await _req(nc, "$JS.hub.API.CONSUMER.INFO.S.D"))
        out.append(await _req(nc, "$JS.hub.API.CONSUMER.LIST.S"))
        out.append(await _req(nc, "$JS.hub.API.CONSUMER.DELETE.S.C"))
        out.append(await _req(nc, "$JS.hub.API.STREAM.INFO.NOPE"))
        kv = await js.create_key_value(bucket="B", history=3)
        await kv.put("k", b"v1")
        rev = await kv.update("k", b"v2", last=1)
        out.append([rev, (await kv.get("k")).value, [e.value for e in await kv_history(kv, "k")],
                    await kv_keys(kv)])
        out.append(await _req(nc, "$JS.hub.API.$KV.B.k", b"v3"))  # mapped onto $KV.B.k
        out.append((await kv.get("k")).value)
        obs = await js.create_object_store(bucket="O")
        await obs.put("f", b"data" * 100)
        got = await obs.get("f")
        out.append([got.data[:8], got.info.size, [o.name for o in await obs.list()]])
        out.append(await _req(nc, "$JS.hub.API.STREAM.DELETE.S"))
        seen = await _until_stream_deleted(advisories, "S")
        # (the KV watchers' ephemeral consumer names are random)
        out.append(sorted({_masked(m.subject) for m in _drain(plain)}))
        out.append([m.subject for m in _drain(prefixed)])
        # every advisory names the domain (one each: a MSG.GET that found nothing is audited).
        # Deletions are compared apart: a loaded nats-server sends those of a deleted stream
        # and of idle ephemeral consumers late, some only after the script ended.
        advised = sorted((a["type"], _masked(a.get("subject", a.get("stream", ""))),
                          a.get("domain"), a.get("action")) for a in seen)
        out.append([a for a in advised if a[3] != "delete"])
        deletions = [a for a in advised if a[3] == "delete"]
    finally:
        await nc.close()
        await nb.close()
    varz, jsz = _http(srv, "/varz")["jetstream"]["config"], _http(srv, "/jsz")["config"]
    out.append([varz.get("domain"), jsz.get("domain")])
    return out, deletions


async def test_domain_as_nats_server(servers: Servers, tmp_path: Path) -> None:
    theirs = servers.nats_server(config=CONF % (tmp_path / "theirs"))
    ours = servers.jetraft(config=CONF % (tmp_path / "ours"))
    their_out, their_deletions = await _script(theirs)
    our_out, our_deletions = await _script(ours)
    # the script's premises, on nats-server itself
    assert their_out[0]["domain"] == "hub"
    assert their_out[1] == "NoRespondersError"
    assert their_out[2]["error"]["err_code"] == 10039
    assert their_out[-1] == ["hub", "hub"]
    assert_same_steps(our_out, their_out, ALLOWED)
    # S's three consumers (C, D, E) and S itself, each advised deleted in the domain; what
    # nats-server advised in time is among them (apart from its idle ephemeral consumers)
    consumer, stream = "io.nats.jetstream.advisory.v1.consumer_action", \
        "io.nats.jetstream.advisory.v1.stream_action"
    expected = [(consumer, "S", "hub", "delete")] * 3 + [(stream, "S", "hub", "delete")]
    assert [a for a in our_deletions if a[1] == "S"] == expected
    assert not Counter(a for a in their_deletions if a[1] == "S") - Counter(expected)


def _start_error(argv: list[str]) -> str:
    """The last line a server prints when it refuses to start (it must exit)."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)  # a served name: hangs
    assert proc.returncode != 0, (argv, proc.stdout, proc.stderr)
    lines = (proc.stderr + proc.stdout).strip().splitlines()
    return lines[-1] if lines else ""


@pytest.mark.parametrize("name", ["a.b", "x\\ty"])  # one per check; the rest: tests/unit
def test_invalid_domain_names_as_nats_server(name: str, tmp_path: Path) -> None:
    conf = tmp_path / "d.conf"
    conf.write_text(f'listen: 127.0.0.1:{free_port()}\n'
                    f'jetstream {{ store_dir: "{tmp_path}", domain: "{name}" }}\n')
    theirs = _start_error(["nats-server", "-c", str(conf)])
    ours = _start_error([sys.executable, "-m", "node.cli", "serve", "-c", str(conf)])
    assert theirs.startswith("nats-server: invalid domain name")
    assert ours.endswith(theirs.removeprefix("nats-server: ")), (ours, theirs)
