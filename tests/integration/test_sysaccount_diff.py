"""The system account against nats-server 2.15: `$SYS.REQ.*` requests, `$SYS`
events, /accountz and /accstatz, with the same config and real nats-py clients.

Replies are compared by their JSON shape: the envelope's keys, the `server`
block's keys and the `data` block's keys (ours must be nats-server's, less the
fields listed in MAY_LACK), plus the values both servers must agree on (the
account a reply is scoped to, connection counts, user names, reasons).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.error
import urllib.request
from typing import Any

import nats
import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

CONFIG = """
server_name: sysdiff
accounts {
  SYS: { users: [{user: sys, password: sys}] }
  A: {
    users: [{user: a, password: a}, {user: a2, password: a2}]
    exports: [{service: "help.>"}]
  }
  B: {
    users: [{user: b, password: b}
            {user: p, password: p, permissions: {
              publish: {allow: ["x.>", "$SYS.REQ.USER.INFO"], deny: ["x.y"]}
              subscribe: "_INBOX.>", allow_responses: true}}]
    imports: [{service: {account: A, subject: "help.>"}}]
  }
}
system_account: SYS
"""

IMPLS = ["nats-server", "jetraft"]
# Keys nats-server has that Jetraft leaves out (Go runtime, features Jetraft
# does not have: gateways, leafnodes, MQTT, profiling).
MAY_LACK = {
    "server": {"feature_flags", "tags"},
    "VARZ": {"cluster", "gateway", "leaf", "mqtt", "websocket", "jetstream", "git_commit",
             "config_digest", "feature_flags", "slow_consumer_stats",
             "stale_connection_stats", "disk_io_wait_stats"},
}
SERVER_KINDS = ["STATSZ", "VARZ", "CONNZ", "SUBSZ", "ROUTEZ", "HEALTHZ", "JSZ", "ACCOUNTZ",
                "IDZ", "GATEWAYZ", "LEAFZ"]
ACCOUNT_KINDS = ["CONNZ", "SUBSZ", "INFO", "CONNS", "STATZ", "LEAFZ", "JSZ"]


@pytest.fixture(scope="module")
def both(module_servers: Any) -> dict[str, Any]:
    return module_servers.both(CONFIG)


def _url(server: Any, user: str) -> str:
    return f"nats://{user}:{user}@127.0.0.1:{server.port}"


async def _connect(server: Any, user: str, **kw: Any) -> Any:
    return await nats.connect(_url(server, user), allow_reconnect=False, **kw)


async def _request(nc: Any, subject: str, body: bytes = b"", timeout: float = 10.0) -> Any:
    """The decoded reply, "timeout" or "no responders". (An answer expected to time out
    passes its own short `timeout`; the others may take seconds on a loaded machine.)"""
    try:
        msg = await nc.request(subject, body, timeout=timeout)
    except NoRespondersError:
        return "no responders"
    except NatsTimeout:
        return "timeout"
    return json.loads(msg.data)


def _check_keys(where: str, ours: Any, theirs: Any, may_lack: set[str] = frozenset()) -> None:
    assert isinstance(ours, dict) and isinstance(theirs, dict), (where, ours, theirs)
    extra = set(ours) - set(theirs)
    missing = set(theirs) - set(ours) - set(may_lack)
    assert not extra and not missing, f"{where}: extra {extra}, missing {missing}"


def _check_reply(where: str, kind: str, ours: Any, theirs: Any) -> None:
    assert type(ours) is type(theirs), (where, ours, theirs)
    if not isinstance(theirs, dict):
        assert ours == theirs, where
        return
    _check_keys(where, ours, theirs)
    if "server" in theirs:
        _check_keys(where + ".server", ours["server"], theirs["server"], MAY_LACK["server"])
    for block in ("data", "statsz"):
        if isinstance(theirs.get(block), dict):
            _check_keys(f"{where}.{block}", ours[block], theirs[block], MAY_LACK.get(kind, set()))


async def _requests(server: Any) -> dict[str, Any]:
    sys_nc = await _connect(server, "sys")
    a = await _connect(server, "a", name="aclient")
    await a.subscribe("foo")
    await a.flush()
    out: dict[str, Any] = {}
    ping = await _request(sys_nc, "$SYS.REQ.SERVER.PING")
    out["PING"] = ping
    server_id = ping["server"]["id"]
    for kind in SERVER_KINDS:
        out[f"PING.{kind}"] = await _request(sys_nc, f"$SYS.REQ.SERVER.PING.{kind}")
        out[f"ID.{kind}"] = await _request(sys_nc, f"$SYS.REQ.SERVER.{server_id}.{kind}")
    for kind in ACCOUNT_KINDS:
        out[f"ACC.{kind}"] = await _request(sys_nc, f"$SYS.REQ.ACCOUNT.A.{kind}")
    out["ID.BOGUS"] = await _request(sys_nc, f"$SYS.REQ.SERVER.{server_id}.BOGUS", timeout=0.5)
    out["ACC.BOGUS"] = await _request(sys_nc, "$SYS.REQ.ACCOUNT.A.BOGUS", timeout=0.5)
    out["USER.INFO"] = await _request(sys_nc, "$SYS.REQ.USER.INFO")
    out["ACC.PING.CONNZ"] = await _request(sys_nc, "$SYS.REQ.ACCOUNT.PING.CONNZ")
    out["ACC.PING.STATZ"] = await _request(sys_nc, "$SYS.REQ.ACCOUNT.PING.STATZ")
    out["ACC.NOPE.CONNZ"] = await _request(sys_nc, "$SYS.REQ.ACCOUNT.NOPE.CONNZ")
    out["bad json"] = await _request(sys_nc, "$SYS.REQ.SERVER.PING.CONNZ", b"{bad")
    out["subs option"] = await _request(sys_nc, "$SYS.REQ.SERVER.PING.CONNZ",
                                        b'{"subscriptions": true}')
    out["other cluster"] = await _request(sys_nc, "$SYS.REQ.SERVER.PING", b'{"cluster": "x"}',
                                          timeout=0.5)
    # What a user of another account gets on the same subjects.
    out["A PING"] = await _request(a, "$SYS.REQ.SERVER.PING")
    out["A ID.VARZ"] = await _request(a, f"$SYS.REQ.SERVER.{server_id}.VARZ")
    out["A ACC.CONNZ"] = await _request(a, "$SYS.REQ.ACCOUNT.A.CONNZ")
    out["A CONNZ"] = await _request(a, "$SYS.REQ.SERVER.PING.CONNZ")
    out["A ACC.PING.STATZ"] = await _request(a, "$SYS.REQ.ACCOUNT.PING.STATZ")
    out["A USER.INFO"] = await _request(a, "$SYS.REQ.USER.INFO")
    p = await _connect(server, "p")
    out["P USER.INFO"] = await _request(p, "$SYS.REQ.USER.INFO")
    await p.close()
    for nc in (a, sys_nc):
        await nc.close()
    return out


def test_requests_answer_like_nats_server(both: dict[str, Any]) -> None:
    got = {name: asyncio.run(_requests(s)) for name, s in both.items()}
    ours, theirs = got["jetraft"], got["nats-server"]
    assert set(ours) == set(theirs)
    for key in theirs:
        kind = key.split(".")[-1]
        _check_reply(key, kind, ours[key], theirs[key])
    for impl in IMPLS:
        g = got[impl]
        assert g["PING"]["server"]["name"] == "sysdiff", impl
        assert g["PING.IDZ"] == {"name": "sysdiff", "host": "127.0.0.1",
                                 "id": g["PING"]["server"]["id"]}, impl
        assert g["ID.HEALTHZ"]["data"] == {"status": "ok", "status_code": 200}, impl
        assert g["PING.ACCOUNTZ"]["data"]["system_account"] == "SYS", impl
        assert sorted(g["PING.ACCOUNTZ"]["data"]["accounts"]) == ["$G", "A", "B", "SYS"], impl
        assert g["PING.VARZ"]["data"]["system_account"] == "SYS", impl
        assert g["PING.STATSZ"]["statsz"]["connections"] == 2, impl
        assert g["ID.BOGUS"] == g["ACC.BOGUS"] == "no responders", impl
        assert g["ACC.CONNZ"]["data"]["num_connections"] == 1, impl
        assert g["ACC.CONNZ"]["data"]["connections"][0]["name"] == "aclient", impl
        assert g["ACC.INFO"]["data"]["account_name"] == "A", impl
        assert g["ACC.INFO"]["data"]["client_connections"] == 1, impl
        assert g["ACC.CONNS"]["acc"] == "A" and g["ACC.CONNS"]["conns"] == 1, impl
        assert [s["acc"] for s in g["ACC.STATZ"]["data"]["account_statz"]] == ["A"], impl
        assert g["ACC.JSZ"]["error"] == {"code": 500, "description": "jetstream not enabled"}
        assert g["USER.INFO"]["data"] == {"user": "sys", "account": "SYS",
                                          "account_name": "SYS"}, impl
        assert g["bad json"]["error"]["code"] == 400, impl
        assert g["ACC.PING.CONNZ"]["data"]["connections"] is None, impl  # "PING": no account
        assert g["ACC.NOPE.CONNZ"]["data"]["connections"] is None, impl
        statz = {s["acc"] for s in g["ACC.PING.STATZ"]["data"]["account_statz"]}
        assert statz == {"A", "SYS"}, impl
        lists = [c.get("subscriptions_list") for c in g["subs option"]["data"]["connections"]]
        assert ["foo"] in lists, impl
        assert g["other cluster"] == "timeout", impl
        # Another account's user: the system account's subjects are not there...
        assert g["A PING"] == "no responders", impl
        assert g["A ID.VARZ"] == "no responders", impl
        assert g["A ACC.CONNZ"] == "no responders", impl
        # ...except what nats-server imports into every account, scoped to it.
        assert g["A CONNZ"]["data"]["num_connections"] == 1, impl
        assert [s["acc"] for s in g["A ACC.PING.STATZ"]["data"]["account_statz"]] == ["A"]
        assert g["A USER.INFO"]["data"] == {"user": "a", "account": "A", "account_name": "A"}
    def perms_sorted(data: dict[str, Any]) -> dict[str, Any]:
        # nats-server lists each allow/deny set in no fixed order.
        perms = {side: {k: sorted(v) for k, v in rules.items()} if side != "responses" else rules
                 for side, rules in data["permissions"].items()}
        return {**data, "permissions": perms}

    assert perms_sorted(ours["P USER.INFO"]["data"]) == perms_sorted(theirs["P USER.INFO"]["data"])
    assert theirs["P USER.INFO"]["data"]["permissions"]["publish"]["deny"] == ["x.y"]


async def _events(server: Any) -> dict[str, Any]:
    sys_nc = await _connect(server, "sys")
    events: list[tuple[str, Any]] = []

    async def on_event(msg: Any) -> None:
        if not msg.subject.startswith("$SYS.REQ."):
            events.append((msg.subject, json.loads(msg.data)))

    await sys_nc.subscribe("$SYS.>", cb=on_event)
    # A user of another account subscribing to $SYS.> in its own account sees nothing.
    snoop = await _connect(server, "a2")
    snooped: list[str] = []

    async def on_snoop(msg: Any) -> None:
        snooped.append(msg.subject)

    await snoop.subscribe("$SYS.>", cb=on_snoop)
    await snoop.flush()
    await sys_nc.flush()
    a = await _connect(server, "a", name="evclient")
    await a.publish("x", b"12345")
    await a.publish("y", b"")
    await a.flush()
    await asyncio.sleep(0.3)
    await a.close()
    try:
        await nats.connect(f"nats://a:wrong@127.0.0.1:{server.port}", allow_reconnect=False,
                           max_reconnect_attempts=0)
    except Exception:  # noqa: BLE001 - refused, as intended
        pass
    # Every event the test looks at, at most 20 s: a loaded server sends the disconnect
    # and auth events well after the client saw its connection end.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not _all_events_in(events):
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)
    await snoop.close()
    await sys_nc.close()
    return {"events": events, "snooped": snooped}


def _all_events_in(events: list[tuple[str, Any]]) -> bool:
    """What test_events_match_nats_server looks for has arrived."""
    def has(suffix: str, **match: Any) -> bool:
        try:
            _first(events, suffix, **match)
        except AssertionError:
            return False
        return True

    subjects = {s for s, _ in events}
    return (has(".CONNECT", name="evclient") and has(".DISCONNECT", name="evclient")
            and has(".CLIENT.AUTH.ERR", user="a", acc="$G")
            and {"$SYS.ACCOUNT.$G.DISCONNECT", "$SYS.ACCOUNT.A.SERVER.CONNS",
                 "$SYS.SERVER.ACCOUNT.A.CONNS"} <= subjects
            and any(s.endswith(".STATSZ") for s in subjects))


def _first(events: list[tuple[str, Any]], suffix: str, **match: Any) -> Any:
    for subject, body in events:
        if subject.endswith(suffix) and all(
                body.get("client", {}).get(k) == v for k, v in match.items()):
            return subject, body
    raise AssertionError(f"no {suffix} {match} in {[s for s, _ in events]}")


def test_events_match_nats_server(both: dict[str, Any]) -> None:
    got = {name: asyncio.run(_events(s)) for name, s in both.items()}
    shapes: dict[str, dict[str, Any]] = {}
    for impl in IMPLS:
        ev = got[impl]["events"]
        assert got[impl]["snooped"] == [], impl
        server_id = None
        subj, connect = _first(ev, ".CONNECT", name="evclient")
        assert subj == "$SYS.ACCOUNT.A.CONNECT", impl
        server_id = connect["server"]["id"]
        assert connect["type"] == "io.nats.server.advisory.v1.client_connect"
        assert {k: connect["client"][k] for k in ("acc", "user", "name", "kind", "client_type")} \
            == {"acc": "A", "user": "a", "name": "evclient", "kind": "Client",
                "client_type": "nats"}, impl
        subj, disc = _first(ev, ".DISCONNECT", name="evclient")
        assert subj == "$SYS.ACCOUNT.A.DISCONNECT", impl
        assert disc["reason"] == "Client Closed", impl
        assert disc["sent"] == {"msgs": 2, "bytes": 5}, impl
        subj, auth = _first(ev, ".CLIENT.AUTH.ERR", user="a", acc="$G")
        assert subj == f"$SYS.SERVER.{server_id}.CLIENT.AUTH.ERR", impl
        assert auth["reason"] == "Authentication Failure", impl
        assert any(s == "$SYS.ACCOUNT.$G.DISCONNECT" for s, _ in ev), impl
        subj, conns = next((s, b) for s, b in ev if s == "$SYS.ACCOUNT.A.SERVER.CONNS")
        assert conns["type"] == "io.nats.server.advisory.v1.account_connections", impl
        assert any(s == "$SYS.SERVER.ACCOUNT.A.CONNS" for s, _ in ev), impl
        subj, statsz = next((s, b) for s, b in ev if s.endswith(".STATSZ"))
        assert subj == f"$SYS.SERVER.{server_id}.STATSZ", impl
        shapes[impl] = {"connect": connect, "disconnect": disc, "auth": auth, "conns": conns,
                        "statsz": statsz}
    ours, theirs = shapes["jetraft"], shapes["nats-server"]
    for key in theirs:
        _check_keys(key, ours[key], theirs[key])
        _check_keys(key + ".server", ours[key]["server"], theirs[key]["server"],
                    MAY_LACK["server"])
        if "client" in theirs[key]:
            _check_keys(key + ".client", ours[key]["client"], theirs[key]["client"])
    _check_keys("statsz", ours["statsz"]["statsz"], theirs["statsz"]["statsz"])


def _http(server: Any, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(server.http + path, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode().strip()


async def _monitor(server: Any) -> dict[str, Any]:
    a = await _connect(server, "a")
    await a.subscribe("foo")
    await a.flush()
    out = {path: _http(server, path) for path in (
        "/accountz", "/accountz?acc=A", "/accountz?acc=B", "/accountz?acc=SYS",
        "/accountz?acc=NOPE", "/accstatz", "/accstatz?unused=1", "/accstatz?accounts=B")}
    await a.close()
    return out


def test_accountz_and_accstatz_match_nats_server(both: dict[str, Any]) -> None:
    got = {name: asyncio.run(_monitor(s)) for name, s in both.items()}
    ours, theirs = got["jetraft"], got["nats-server"]
    for path, (status, body) in theirs.items():
        assert ours[path][0] == status, path
        if not isinstance(body, dict):
            assert ours[path][1] == body, path
            continue
        _check_keys(path, ours[path][1], body)
        if "account_detail" in body:
            mine, real = ours[path][1]["account_detail"], body["account_detail"]
            _check_keys(path + ".detail", mine, real)
            for key in ("account_name", "client_connections", "is_system"):
                assert mine.get(key) == real.get(key), (path, key)
            for key in ("exports", "imports"):  # nats-server's order is a Go map's
                assert sorted(map(json.dumps, mine.get(key, []))) == \
                    sorted(map(json.dumps, real.get(key, []))), (path, key)
            if path.endswith("acc=A"):
                assert mine["subscriptions"] == real["subscriptions"] == 5
        if "account_statz" in body:
            assert [s["acc"] for s in ours[path][1]["account_statz"]] == \
                [s["acc"] for s in body["account_statz"]] or path == "/accstatz?unused=1", path
            assert sorted(s["acc"] for s in ours[path][1]["account_statz"]) == \
                sorted(s["acc"] for s in body["account_statz"]), path
            for mine, real in zip(ours[path][1]["account_statz"], body["account_statz"],
                                  strict=True):
                _check_keys(path + ".statz", mine, real)
    assert theirs["/accountz"][1]["accounts"] and \
        sorted(ours["/accountz"][1]["accounts"]) == sorted(theirs["/accountz"][1]["accounts"])
    assert theirs["/accountz?acc=NOPE"] == (400, "Account NOPE does not exist")


async def _global_user_view(server: Any) -> dict[str, Any]:
    """No accounts configured: everyone is in $G; $SYS exists with no users."""
    snoop = await nats.connect(f"nats://127.0.0.1:{server.port}", allow_reconnect=False)
    seen: list[str] = []

    async def on_msg(msg: Any) -> None:
        seen.append(msg.subject)

    await snoop.subscribe("$SYS.>", cb=on_msg)
    await snoop.flush()
    other = await nats.connect(f"nats://127.0.0.1:{server.port}", allow_reconnect=False)
    await other.close()
    out = {"PING": await _request(snoop, "$SYS.REQ.SERVER.PING", timeout=0.5),
           "USER.INFO": await _request(snoop, "$SYS.REQ.USER.INFO")}
    await asyncio.sleep(0.3)
    out["seen"] = [s for s in seen if not s.startswith("_INBOX")]
    await snoop.close()
    return out


def test_global_account_users_see_no_system_traffic(module_servers: Any) -> None:
    got = {}
    for impl in IMPLS:
        proc = module_servers.nats_server() if impl == "nats-server" else module_servers.jetraft()
        got[impl] = asyncio.run(_global_user_view(proc))
        proc.stop()
    ours, theirs = got["jetraft"], got["nats-server"]
    # Our own subscription to $SYS.> takes the requests we publish; nothing else.
    assert theirs["seen"] == ours["seen"] == ["$SYS.REQ.SERVER.PING", "$SYS.REQ.USER.INFO"]
    assert theirs["PING"] == ours["PING"] == "timeout"
    _check_reply("USER.INFO", "USER.INFO", ours["USER.INFO"], theirs["USER.INFO"])
    assert ours["USER.INFO"]["data"] == theirs["USER.INFO"]["data"]


async def _shutdown_event(proc: Any) -> Any:
    nc = await _connect(proc, "sys")
    got: list[tuple[str, Any]] = []

    async def on_msg(msg: Any) -> None:
        got.append((msg.subject, json.loads(msg.data)))

    await nc.subscribe("$SYS.SERVER.*.SHUTDOWN", cb=on_msg)
    await nc.flush()
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    try:
        await nc.close()
    except Exception:  # noqa: BLE001 - the server is gone
        pass
    return got


def test_shutdown_event_like_nats_server(servers: Any) -> None:
    got = {}
    for impl in IMPLS:
        proc = servers.nats_server(CONFIG) if impl == "nats-server" else servers.jetraft(CONFIG)
        got[impl] = asyncio.run(_shutdown_event(proc))
        proc.wait(15)
    for impl in IMPLS:
        assert len(got[impl]) == 1, impl
        subject, body = got[impl][0]
        assert subject == f"$SYS.SERVER.{body['id']}.SHUTDOWN", impl
        assert body["name"] == "sysdiff", impl
    _check_keys("shutdown", got["jetraft"][0][1], got["nats-server"][0][1], MAY_LACK["server"])


async def _kick_and_ldm(server: Any, raw: Any) -> dict[str, Any]:
    sys_nc = await _connect(server, "sys")
    server_id = (await _request(sys_nc, "$SYS.REQ.SERVER.PING.IDZ"))["id"]
    conns = []
    for _ in range(2):
        conn = raw(server.port)
        out = conn.exchange(b'CONNECT {"user":"a","pass":"a","verbose":false,"protocol":1}\r\n')
        assert out == b""
        conns.append(conn)
    listing = await _request(sys_nc, "$SYS.REQ.ACCOUNT.A.CONNZ")
    kicked, ducked = sorted(c["cid"] for c in listing["data"]["connections"])
    out: dict[str, Any] = {}
    for name, kind, body in (("kick", "KICK", {"cid": kicked}), ("ldm", "LDM", {"cid": ducked}),
                             ("kick unknown", "KICK", {"cid": 999999}),
                             ("ldm unknown", "LDM", {"cid": 999999})):
        reply = await _request(sys_nc, f"$SYS.REQ.SERVER.{server_id}.{kind}",
                               json.dumps(body).encode())
        reply.pop("server")
        out[name] = reply
    out["bad json"] = await _request(sys_nc, f"$SYS.REQ.SERVER.{server_id}.KICK", b"{", 0.5)
    # nats-server 2.15 also sends protocol-1 clients an INFO after CONNECT
    # ("connect_info"); that is not what this test is about.
    rest = b"".join(ln for ln in conns[0].read_close_or_wait(10.0).splitlines(keepends=True)
                    if not ln.startswith(b"INFO "))
    out["kicked closed"] = (rest, conns[0].eof)
    ducked_out = conns[1].read_close_or_wait(0.5)
    out["ldm info"] = b'"ldm":true' in ducked_out and not conns[1].eof
    await sys_nc.close()
    return out


def test_kick_and_lame_duck_one_client_like_nats_server(both: dict[str, Any], raw: Any) -> None:
    got = {impl: asyncio.run(_kick_and_ldm(s, raw)) for impl, s in both.items()}
    assert got["jetraft"] == got["nats-server"]
    assert got["nats-server"]["kick"] == {} and got["nats-server"]["ldm info"] is True
    assert got["nats-server"]["kicked closed"] == (b"", True)
    assert got["nats-server"]["bad json"] == "timeout"


async def _account_traffic(server: Any) -> Any:
    sys_nc = await _connect(server, "sys")
    a = await _connect(server, "a")
    await a.subscribe("in")
    for _ in range(3):
        await a.publish("out", b"xx")
    await a.publish("in", b"yyyy")
    await a.flush()
    await asyncio.sleep(0.2)
    a2 = await _connect(server, "a2")  # gone before the request: still counted
    await a2.publish("in", b"zzzzz")
    await a2.flush()
    await a2.close()
    # until the server has closed a2 too (a loaded one takes a while to see it gone)
    deadline = time.monotonic() + 20
    while True:
        reply = await _request(sys_nc, "$SYS.REQ.ACCOUNT.A.STATZ")
        stat = reply["data"]["account_statz"][0]
        if stat["conns"] == 1 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    await a.close()
    await sys_nc.close()
    return {k: stat[k] for k in ("conns", "total_conns", "sent", "received")}


def test_account_traffic_counts_like_nats_server(module_servers: Any) -> None:
    got = {}
    for impl in IMPLS:
        proc = module_servers.nats_server(CONFIG) if impl == "nats-server" \
            else module_servers.jetraft(CONFIG)
        got[impl] = asyncio.run(_account_traffic(proc))
        proc.stop()
    assert got["jetraft"] == got["nats-server"]
    assert got["nats-server"]["received"]["msgs"] == 5  # 3 + 1 by a, 1 by a2 (closed)
    assert got["nats-server"]["sent"]["msgs"] == 2
