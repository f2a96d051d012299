"""JetStream per account, against nats-server 2.15 (issue 8 "Account scoped", issue 7).

The same nats-py script runs against `nats-server -c conf` and `jetraft serve -c conf` and
every reply's whole JSON is compared (times and ids masked). It covers: two accounts with
a stream of the same name (independent data, consumers, acks, deletes); an account's
`max_streams`, `max_consumers`, `max_mem` / `max_file` with nats-server's error JSON; an
account without JetStream and the global account once accounts exist (10039); INFO's
per-account stats, reservations and limits. Then jetraft alone: restart keeps each account's
streams apart.

Mutation (docs/notes/jsacct.md): `jsaccount.key` returning the bare name (the registry ignoring
the account) fails test_two_accounts_same_stream_name and test_restart_keeps_accounts_apart.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import nats
import nats.errors

from tests.integration.conftest import ServerProc, Servers
from tests.integration.jsdiff import assert_same_steps, kv_history, watch_initial

ALLOWED = {"created", "ts", "first_ts", "last_ts", "time", "last_active", "leader",
           "server_id", "now", "config"}

CONF = """
jetstream { store_dir: "%s" }
accounts {
  A { users: [{user: a, password: p}], jetstream: enabled }
  B { users: [{user: b, password: p}],
      jetstream: { max_mem: 1000, max_file: 1M, max_streams: 2, max_consumers: 1 } }
  C { users: [{user: c, password: p}] }
  SYS { users: [{user: s, password: p}] }
}
system_account: SYS
authorization { users: [{user: g, password: p}] }
"""


async def _req(nc: Any, subject: str, body: Any = b"") -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        msg = await nc.request(subject, data, timeout=3)
    except Exception as exc:  # noqa: BLE001 (the step records what happened)
        return type(exc).__name__
    return json.loads(msg.data) if msg.data else {"headers": dict(msg.headers or {})}


async def _connect(srv: ServerProc, user: str) -> Any:
    return await nats.connect(f"nats://{user}:p@127.0.0.1:{srv.port}")


def _stream(name: str, subjects: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "subjects": subjects, **extra}


async def _isolation_script(srv: ServerProc) -> list[Any]:
    a, b = await _connect(srv, "a"), await _connect(srv, "b")
    steps: list[Any] = []
    try:
        # the same name and the same subjects in two accounts: two streams, no overlap
        steps.append(await _req(a, "$JS.API.STREAM.CREATE.S", _stream("S", ["orders.>"])))
        steps.append(await _req(b, "$JS.API.STREAM.CREATE.S",
                                _stream("S", ["orders.>"], storage="memory")))
        for i in range(3):
            steps.append(await _req(a, "orders.a", f"from-a-{i}".encode()))
        steps.append(await _req(b, "orders.b", b"from-b"))
        for nc in (a, b):
            steps.append(await _req(nc, "$JS.API.STREAM.INFO.S"))
            steps.append(await _req(nc, "$JS.API.STREAM.NAMES"))
            steps.append(await _req(nc, "$JS.API.STREAM.MSG.GET.S", {"seq": 1}))
        # consumers and acks stay in their account
        cfg = {"stream_name": "S", "config": {"durable_name": "d", "ack_policy": "explicit"}}
        steps.append(await _req(a, "$JS.API.CONSUMER.CREATE.S.d", cfg))
        steps.append(await _req(b, "$JS.API.CONSUMER.INFO.S.d"))
        js = a.jetstream()
        sub = await js.pull_subscribe("orders.>", durable="d", stream="S")
        msgs = await sub.fetch(3, timeout=3)
        steps.append([m.data.decode() for m in msgs])
        for m in msgs:
            await m.ack_sync()
        steps.append(await _req(a, "$JS.API.CONSUMER.INFO.S.d"))
        # deleting B's stream leaves A's alone
        steps.append(await _req(b, "$JS.API.STREAM.DELETE.S"))
        steps.append(await _req(a, "$JS.API.STREAM.INFO.S"))
        steps.append(await _req(b, "$JS.API.STREAM.INFO.S"))
        steps.append(await _req(a, "$JS.API.INFO"))
        steps.append(await _req(b, "$JS.API.INFO"))
        # /jsz: every account with JetStream, and one account's streams
        for query in ("accounts=true", "acc=A&streams=true&consumers=true", "acc=B"):
            with urllib.request.urlopen(f"{srv.http}/jsz?{query}", timeout=5) as resp:
                steps.append(json.loads(resp.read()))
    finally:
        await a.close()
        await b.close()
    return steps


async def _limits_script(srv: ServerProc) -> list[Any]:
    b = await _connect(srv, "b")
    steps: list[Any] = []
    try:
        steps.append(await _req(b, "$JS.API.INFO"))
        steps.append(await _req(b, "$JS.API.STREAM.CREATE.M",
                                _stream("M", ["m.>"], storage="memory")))
        steps.append(await _req(b, "$JS.API.STREAM.CREATE.F", _stream("F", ["f.>"])))
        steps.append(await _req(b, "$JS.API.STREAM.CREATE.X", _stream("X", ["x.>"])))
        # max_consumers: one per stream
        for name in ("c1", "c2"):
            steps.append(await _req(b, f"$JS.API.CONSUMER.CREATE.M.{name}",
                                    {"stream_name": "M", "config": {"durable_name": name}}))
        steps.append(await _req(b, "$JS.API.CONSUMER.CREATE.F.c1",
                                {"stream_name": "F", "config": {"durable_name": "c1"}}))
        # max_mem 1000: a 619-byte record fits, a second one does not
        steps.append(await _req(b, "m.x", b"x" * 600))
        steps.append(await _req(b, "m.x", b"x" * 600))
        steps.append(await _req(b, "$JS.API.STREAM.DELETE.F"))
        # reservations: max_bytes against max_mem / max_file
        steps.append(await _req(b, "$JS.API.STREAM.CREATE.R",
                                _stream("R", ["r.>"], storage="memory", max_bytes=2000)))
        steps.append(await _req(b, "$JS.API.STREAM.CREATE.R",
                                _stream("R", ["r.>"], max_bytes=2_000_000)))
        steps.append(await _req(b, "$JS.API.STREAM.CREATE.R",
                                _stream("R", ["r.>"], max_bytes=600_000)))
        steps.append(await _req(b, "$JS.API.STREAM.UPDATE.R",
                                _stream("R", ["r.>"], max_bytes=1_500_000)))
        steps.append(await _req(b, "$JS.API.STREAM.DELETE.M"))
        steps.append(await _req(b, "$JS.API.STREAM.CREATE.U",
                                _stream("U", ["u.>"], max_bytes=500_000)))
        steps.append(await _req(b, "$JS.API.STREAM.CREATE.V", _stream("V", ["v.>"])))
        # max_file 1M: file records count their 30-byte overhead
        for _ in range(4):
            steps.append(await _req(b, "r.x", b"y" * 300_000))
        for _ in range(3):  # V has no max_bytes: the account's max_file stops it
            steps.append(await _req(b, "v.x", b"z" * 300_000))
        steps.append(await _req(b, "$JS.API.STREAM.INFO.R"))
        steps.append(await _req(b, "$JS.API.INFO"))
    finally:
        await b.close()
    return steps


async def _disabled_script(srv: ServerProc) -> list[Any]:
    steps: list[Any] = []
    for user in ("c", "g"):  # an account without jetstream; $G once accounts exist
        nc = await _connect(srv, user)
        try:
            steps.append(await _req(nc, "$JS.API.INFO"))
            steps.append(await _req(nc, "$JS.API.STREAM.CREATE.S", _stream("S", ["s.>"])))
            steps.append(await _req(nc, "$JS.API.STREAM.NAMES"))
            steps.append(await _req(nc, "$JS.API.CONSUMER.INFO.S.d"))
            for op in ("STREAM.INFO.S", "STREAM.LIST", "STREAM.PURGE.S", "CONSUMER.NAMES.S",
                       "CONSUMER.LIST.S", "STREAM.DELETE.S", "STREAM.LEADER.STEPDOWN.S"):
                steps.append(await _req(nc, "$JS.API." + op))
            steps.append(await _req(nc, "$JS.API.CONSUMER.CREATE.S.d",
                                    {"stream_name": "S", "config": {"durable_name": "d"}}))
            steps.append(await _req(nc, "$JS.API.CONSUMER.CREATE.S.d", {"bogus": 1}))
            steps.append(await _req(nc, "$JS.API.DIRECT.GET.S", {"seq": 1}))
            steps.append(await _req(nc, "$JS.API.CONSUMER.MSG.NEXT.S.d", {"batch": 1}))
            steps.append(await _req(nc, "orders.a", b"x"))  # A's stream subject: not here
        finally:
            await nc.close()
    nc = await _connect(srv, "s")  # the system account: `system_response`, INFO's own type
    try:
        for op in ("INFO", "STREAM.CREATE.S", "STREAM.LIST", "CONSUMER.MSG.NEXT.S.d", "NOPE"):
            steps.append(await _req(nc, "$JS.API." + op))
        for acc in ("A", "C"):  # an account's own JetStream page, or why there is none
            got = await _req(nc, f"$SYS.REQ.ACCOUNT.{acc}.JSZ")
            steps.append({k: got.get(k) for k in ("data", "error")})
    finally:
        await nc.close()
    return steps


def _pair(servers: Servers, tmp_path: Path) -> dict[str, ServerProc]:
    return {"nats-server": servers.nats_server(CONF % (tmp_path / "theirs")),
            "jetraft": servers.jetraft(CONF % (tmp_path / "ours"))}


async def _both(servers: Servers, tmp_path: Path, script: Any) -> list[Any]:
    pair = _pair(servers, tmp_path)
    theirs = await script(pair["nats-server"])
    ours = await script(pair["jetraft"])
    assert_same_steps(ours, theirs, ALLOWED)
    return ours


async def test_two_accounts_same_stream_name(servers: Servers, tmp_path: Path) -> None:
    ours = await _both(servers, tmp_path, _isolation_script)
    assert ours[6]["state"]["messages"] == 3 and ours[9]["state"]["messages"] == 1
    assert ours[14] == ["from-a-0", "from-a-1", "from-a-2"]


async def test_account_limits_errors(servers: Servers, tmp_path: Path) -> None:
    ours = await _both(servers, tmp_path, _limits_script)
    codes = [s["error"]["err_code"] for s in ours if isinstance(s, dict) and "error" in s]
    assert codes == [10027, 10026, 10002, 10028, 10047, 10047, 10047, 10002], codes


async def test_account_without_jetstream(servers: Servers, tmp_path: Path) -> None:
    ours = await _both(servers, tmp_path, _disabled_script)
    assert ours[0]["error"]["err_code"] == 10039


async def test_restart_keeps_accounts_apart(servers: Servers, tmp_path: Path) -> None:
    conf = CONF % (tmp_path / "store")
    srv = servers.jetraft(conf)
    a, b = await _connect(srv, "a"), await _connect(srv, "b")
    await _req(a, "$JS.API.STREAM.CREATE.S", _stream("S", ["orders.>"]))
    await _req(b, "$JS.API.STREAM.CREATE.S", _stream("S", ["orders.>"], max_bytes=10_000))
    for i in range(3):
        assert (await _req(a, "orders.a", f"a{i}".encode()))["seq"] == i + 1
    assert (await _req(b, "orders.b", b"b0"))["seq"] == 1
    await a.close()
    await b.close()
    srv.stop()
    srv = servers.jetraft(conf, port=srv.port)
    a, b = await _connect(srv, "a"), await _connect(srv, "b")
    try:
        info_a = await _req(a, "$JS.API.STREAM.INFO.S")
        info_b = await _req(b, "$JS.API.STREAM.INFO.S")
        assert info_a["state"]["messages"] == 3 and info_a["config"]["max_bytes"] == -1
        assert info_b["state"]["messages"] == 1 and info_b["config"]["max_bytes"] == 10_000
        got = await _req(b, "$JS.API.STREAM.MSG.GET.S", {"seq": 1})
        assert got["message"]["subject"] == "orders.b"
        # still two streams: a publish in A lands in A's only
        assert (await _req(a, "orders.a", b"a3"))["seq"] == 4
        assert (await _req(b, "$JS.API.STREAM.INFO.S"))["state"]["messages"] == 1
        assert (await _req(b, "$JS.API.INFO"))["reserved_storage"] == 10_000
    finally:
        await a.close()
        await b.close()


CONF_STREAM_LIMITS = """
jetstream { store_dir: "%s" }
accounts {
  B { users: [{user: b, password: p}], jetstream: { max_consumers: 2, max_bytes_required: true,
      store_max_stream_bytes: 1000, memory_max_stream_bytes: 500 } }
}
"""


async def _stream_limits_script(srv: ServerProc) -> list[Any]:
    b = await _connect(srv, "b")
    try:
        steps = [await _req(b, f"$JS.API.STREAM.CREATE.{body['name']}", body) for body in (
            _stream("A", ["a"], max_consumers=3, max_bytes=100),  # over the account's 2
            _stream("B", ["b"]),  # max_bytes required
            _stream("C", ["c"], max_bytes=1001),  # over store_max_stream_bytes
            _stream("D", ["d"], max_bytes=600, storage="memory"),
            _stream("E", ["e"], max_bytes=1000))]
        steps.append(await _req(b, "$JS.API.INFO"))
        return steps
    finally:
        await b.close()


async def test_account_stream_limit_checks(servers: Servers, tmp_path: Path) -> None:
    theirs = await _stream_limits_script(
        servers.nats_server(CONF_STREAM_LIMITS % (tmp_path / "theirs")))
    ours = await _stream_limits_script(
        servers.jetraft(CONF_STREAM_LIMITS % (tmp_path / "ours")))
    assert_same_steps(ours, theirs, ALLOWED)
    assert [s["error"]["err_code"] for s in ours[:4]] == [10026, 10113, 10122, 10122]


async def _watch_all(kv: Any) -> list[tuple[str, str]]:
    """The entries a watch delivers (read until the count the server's consumer info gives:
    nats-py's 'caught up' marker can come before the first entry)."""
    watcher = await kv.watchall()
    seen = [(entry.key, entry.value.decode()) for entry in await watch_initial(watcher)]
    await watcher.stop()
    return seen


async def _kv_script(srv: ServerProc) -> list[Any]:
    """Key/Value and Object Store in two accounts under the same bucket names: direct gets,
    a watch (a push consumer with flow control and heartbeats in the account), history."""
    steps: list[Any] = []
    conns = {u: await _connect(srv, u) for u in ("a", "b")}
    try:
        for user, nc in conns.items():
            kv = await nc.jetstream().create_key_value(bucket="cfg", history=3)
            await kv.put("k", f"{user}-1".encode())
            await kv.put("k", f"{user}-2".encode())
            obj = await nc.jetstream().create_object_store(bucket="files")
            await obj.put("f", (user * 50_000).encode())
        for user, nc in conns.items():
            kv = await nc.jetstream().key_value("cfg")
            steps.append((user, (await kv.get("k")).value.decode()))
            steps.append((user, [e.value.decode() for e in await kv_history(kv, "k")]))
            steps.append((user, await _watch_all(kv)))
            obj = await nc.jetstream().object_store("files")
            data = (await obj.get("f")).data
            steps.append((user, len(data), data[:1].decode()))
            steps.append(await _req(nc, "$JS.API.STREAM.NAMES"))
    finally:
        for nc in conns.values():
            await nc.close()
    return steps


CONF_KV = """
jetstream { store_dir: "%s" }
accounts {
  A { users: [{user: a, password: p}], jetstream: enabled }
  B { users: [{user: b, password: p}], jetstream: enabled }
}
"""


async def test_kv_and_object_store_per_account(servers: Servers, tmp_path: Path) -> None:
    theirs = await _kv_script(servers.nats_server(CONF_KV % (tmp_path / "theirs")))
    ours = await _kv_script(servers.jetraft(CONF_KV % (tmp_path / "ours")))
    assert_same_steps(ours, theirs, ALLOWED)
    assert ("a", "a-2") in ours and ("b", "b-2") in ours
    assert ("b", [("k", "b-2")]) in ours
