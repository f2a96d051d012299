"""Config reload (SIGHUP) against nats-server 2.15 with the same configs: what
connected clients see when users, permissions and accounts change, which
changes are refused (and the running config kept), and that a reload never
lets in what the new config does not allow.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import bcrypt
import nats
import pytest

IMPLS = ["nats-server", "jetraft"]

BEFORE = """
accounts {
  A: { users: [{user: a, password: a}, {user: b, password: b, permissions: {subscribe: ">"}},
               {user: m, password: m}] }
  B: { users: [{user: x, password: x}] }
}
"""
AFTER = """
accounts {
  A: { users: [{user: b, password: b, permissions: {subscribe: "ok.>", publish: "ok.>"}},
               {user: n, password: n}] }
  B: { users: [{user: x, password: x}, {user: m, password: m}] }
}
"""
DONE = re.compile(r"\[(INF|ERR)\] (Reloaded server configuration.*|Failed to reload server "
                  r"configuration: .*)")


def _conf_path(proc: Any) -> Path:
    return proc.workdir / f"{proc.name}-{proc.port}.conf"


def reload(proc: Any, config: str | None, timeout: float = 10.0) -> str:
    """Write `config` (None: keep the file), SIGHUP, and return the outcome line."""
    before = len(DONE.findall(proc.log_text()))
    if config is not None:
        _conf_path(proc).write_text(config)
    proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [m.group(0) for m in DONE.finditer(proc.log_text())]
        if len(found) > before:
            return found[-1]
        time.sleep(0.05)
    raise AssertionError(f"{proc.name}: no reload outcome in log:\n{proc.log_text()}")


def _login(raw: Any, port: int, user: str, password: str | None = None) -> Any:
    conn = raw(port)
    creds = {"user": user, "pass": password or user, "verbose": False, "pedantic": False}
    out = conn.exchange(b"CONNECT " + json.dumps(creds).encode() + b"\r\n")
    assert out == b"", (user, out)
    return conn


def _can_login(raw: Any, port: int, user: str, password: str | None = None) -> bool:
    conn = raw(port)
    creds = {"user": user, "pass": password or user, "verbose": False}
    conn.send(b"CONNECT " + json.dumps(creds).encode() + b"\r\nPING\r\n")
    out = conn.read_close_or_wait(1.0)
    conn.close()
    return out.startswith(b"PONG")


def _without_pings(data: bytes) -> bytes:
    return data.replace(b"PING\r\n", b"")


def test_users_and_permissions_change_like_nats_server(servers: Any, raw: Any) -> None:
    seen: dict[str, dict[str, bytes]] = {}
    for impl in IMPLS:
        proc = servers.nats_server(BEFORE) if impl == "nats-server" else servers.jetraft(BEFORE)
        conns = {}
        for user in "abmx":
            conns[user] = _login(raw, proc.port, user)
            assert conns[user].exchange(b"SUB foo 1\r\nSUB ok.x 2\r\n") == b""
        assert not _can_login(raw, proc.port, "n")
        assert "Reloaded server configuration (" in reload(proc, AFTER), impl
        seen[impl] = {}
        for user, conn in conns.items():
            try:
                conn.send(b"PUB foo 2\r\nhi\r\nPUB ok.x 2\r\nhi\r\nPING\r\n")
            except OSError:
                pass
            seen[impl][user] = _without_pings(conn.read_close_or_wait(1.0))
        seen[impl]["n can log in"] = str(_can_login(raw, proc.port, "n")).encode()
        seen[impl]["a can log in"] = str(_can_login(raw, proc.port, "a")).encode()
        log = proc.log_text()
        assert 'Removed sub "foo" (sid "1") for User "b" - not authorized' in log, impl
        proc.stop()
    assert seen["jetraft"] == seen["nats-server"]
    # Removed user (a) and moved user (m): closed without a word; b loses "foo".
    assert seen["nats-server"]["a"] == b"" and seen["nats-server"]["m"] == b""
    assert seen["nats-server"]["b"].startswith(
        b"-ERR 'Permissions Violation for Subscription to \"foo\" (sid \"1\")'\r\n"
        b"-ERR 'Permissions Violation for Publish to \"foo\"'\r\nMSG ok.x 2 2\r\nhi\r\n")
    assert seen["nats-server"]["n can log in"] == b"True"
    assert seen["nats-server"]["a can log in"] == b"False"


BASE = "authorization { users: [{user: a, password: a}] }\nmax_payload: 1000\n"
# What each refused config would allow if it were applied: user z, and not a.
WITH_Z = "authorization { users: [{user: z, password: z}] }\nmax_payload: 1000\n"


@pytest.mark.parametrize("new_config, message", [
    (WITH_Z + "server_name: foo\n",
     "config reload not supported for ServerName: old=, new=foo"),
    ("authorization { users: [{user: z, password: z}] \n", None),  # syntax error
    (WITH_Z + "max_pending: 100\n",
     "max_payload (1000) cannot be higher than max_pending (100)"),
    (WITH_Z + "no_auth_user: zz\n", None),
], ids=["server_name", "syntax", "max_pending", "no_auth_user"])
def test_refused_reload_keeps_the_running_config(servers: Any, raw: Any, new_config: str,
                                                 message: str | None) -> None:
    for impl in IMPLS:
        proc = servers.nats_server(BASE) if impl == "nats-server" else servers.jetraft(BASE)
        conn = _login(raw, proc.port, "a")
        outcome = reload(proc, new_config)
        assert outcome.startswith("[ERR] Failed to reload server configuration: "), \
            (impl, outcome)
        if message is not None:
            assert outcome.endswith(message), (impl, outcome)
        # The old config still rules: a stays and can log in again, z cannot.
        assert conn.exchange(b"SUB foo 1\r\n") == b"", impl
        assert _can_login(raw, proc.port, "a"), impl
        assert not _can_login(raw, proc.port, "z"), impl
        proc.stop()


def test_reload_that_is_not_enforceable_fails_closed(servers: Any, raw: Any) -> None:
    """A security setting Jetraft cannot enforce refuses the reload (as it refuses
    to start with it); the running users keep exactly their old rights."""
    proc = servers.jetraft(BASE)
    conn = _login(raw, proc.port, "a")
    outcome = reload(proc, BASE + 'trusted_keys: ["OABC"]\n')
    assert "security configuration not enforced by jetraft yet" in outcome
    assert conn.exchange(b"PUB foo 1\r\nx\r\n") == b""
    assert _can_login(raw, proc.port, "a")


def test_bcrypt_user_kept_while_its_hash_stays_and_closed_when_it_changes(
        servers: Any, raw: Any) -> None:
    old_hash = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
    new_hash = bcrypt.hashpw(b"other", bcrypt.gensalt(4)).decode()
    conf = 'authorization {{ users: [{{user: h, password: "{}"}}, {{user: k, password: k}}] }}\n'
    results = {}
    for impl in IMPLS:
        start = conf.format(old_hash)
        proc = servers.nats_server(start) if impl == "nats-server" else servers.jetraft(start)
        conn = _login(raw, proc.port, "h", "pw")
        reload(proc, start + "max_payload: 2000\n")
        kept = conn.exchange(b"SUB foo 1\r\n")
        reload(proc, conf.format(new_hash))
        closed = conn.read_close_or_wait(2.0)
        results[impl] = (kept, closed, conn.eof, _can_login(raw, proc.port, "h", "other"))
        proc.stop()
    # A user still configured whose credentials no longer pass gets the -ERR (a
    # removed user is closed silently: test_users_and_permissions_change_...).
    assert results["jetraft"] == results["nats-server"] == (
        b"", b"-ERR 'Authorization Violation'\r\n", True, True)


SLOW_HASH = bcrypt.hashpw(b"right", bcrypt.gensalt(15)).decode()  # ~2 s per check


@pytest.mark.parametrize("after", ["{user: k, password: k}",  # u removed
                                   "{user: u, password: new}, {user: k, password: k}"])
def test_a_login_whose_bcrypt_check_spans_a_reload_is_judged_by_the_new_users(
        servers: Any, raw: Any, after: str) -> None:
    """A CONNECT whose bcrypt check is queued or running when a reload removes its user or
    changes its password is refused: the check vouched for the old users, and the reload's
    re-check of connected clients did not see it yet (it was let in with the old identity).
    Mutation: `_check_done` keeping an outcome begun under the old users -> PONG: FAILS."""
    conf = "authorization {{ timeout: 30, users: [{}] }}\n"
    for _ in range(3):
        proc = servers.jetraft(conf.format(f'{{user: u, password: "{SLOW_HASH}"}}, '
                                           "{user: k, password: k}"))
        began = time.monotonic()
        bcrypt.checkpw(b"right", SLOW_HASH.encode())  # one check's time, on this load
        check_s = time.monotonic() - began
        conn = raw(proc.port, 30.0)
        began = time.monotonic()
        conn.send(b'CONNECT {"user":"u","pass":"right","verbose":false}\r\nPING\r\n')
        reload(proc, conf.format(after))
        conn._fill(0.05)  # noqa: SLF001 (what has come already: no answer yet)
        if time.monotonic() - began < check_s / 2 and not _without_pings(conn.buf):
            break  # the reload came while the check was queued or running
        proc.stop()
    else:
        pytest.fail("the reload never came within half a check's time of the CONNECT")
    out = _without_pings(conn.read_close_or_wait(30.0))  # (the server's first PING may come)
    assert out == b"-ERR 'Authorization Violation'\r\n" and conn.eof, out
    assert not _can_login(raw, proc.port, "u", "right")
    assert _can_login(raw, proc.port, "k")


def test_signal_command_and_sys_request_reload(servers: Any, raw: Any) -> None:
    """`jetraft signal reload=<pid>` and `$SYS.REQ.SERVER.<id>.RELOAD`."""
    conf = ("accounts { SYS: { users: [{user: sys, password: sys}] } }\n"
            "system_account: SYS\nauthorization { users: [{user: a, password: a}] }\n")
    proc = servers.jetraft(conf)
    assert not _can_login(raw, proc.port, "new")
    _conf_path(proc).write_text(conf.replace("{user: a, password: a}",
                                             "{user: a, password: a}, {user: new, password: new}"))
    before = len(DONE.findall(proc.log_text()))
    subprocess.run([sys.executable, "-m", "node.cli", "signal", f"reload={proc.proc.pid}"],
                   check=True, timeout=30)
    deadline = time.monotonic() + 10
    while len(DONE.findall(proc.log_text())) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert 'Trapped "hangup" signal' in proc.log_text()
    assert _can_login(raw, proc.port, "new")

    _conf_path(proc).write_text(conf)

    async def request_reload() -> Any:
        nc = await nats.connect(f"nats://sys:sys@127.0.0.1:{proc.port}")
        ping = json.loads((await nc.request("$SYS.REQ.SERVER.PING.IDZ", b"", timeout=2)).data)
        reply = await nc.request(f"$SYS.REQ.SERVER.{ping['id']}.RELOAD", b"", timeout=5)
        await nc.close()
        return json.loads(reply.data)

    body = asyncio.run(request_reload())
    assert set(body) == {"server"}
    assert not _can_login(raw, proc.port, "new")


IMPORTS_BEFORE = """
accounts {
  A: { users: [{user: a, password: a}, {user: p, password: p}],
       exports: [{stream: "ev.>"}, {service: "svc.>"}],
       mappings: {"old.x": "ev.mapped"} }
  B: { users: [{user: b, password: b}],
       imports: [{stream: {account: A, subject: "ev.>"}},
                 {service: {account: A, subject: "svc.>"}}] }
  C: { users: [{user: c, password: c}] }
}
"""
# B loses both imports, C gains the stream import with a prefix, A's mapping moves, and
# A's user p may no longer publish on ev.>.
IMPORTS_AFTER = """
accounts {
  A: { users: [{user: a, password: a},
               {user: p, password: p, permissions: {publish: {deny: "ev.>"}}}],
       exports: [{stream: "ev.>"}, {service: "svc.>"}],
       mappings: {"old.y": "ev.mapped"} }
  B: { users: [{user: b, password: b}] }
  C: { users: [{user: c, password: c}],
       imports: [{stream: {account: A, subject: "ev.>"}, prefix: "from"}] }
}
"""
_WARM = {"a": (b"PUB ev.1 1\r\n1\r\nPUB ev.quiet 1\r\nq\r\nPUB old.x 1\r\nx\r\n"
               b"PUB old.y 1\r\ny\r\n") * 3,
         "p": b"PUB ev.1 1\r\np\r\nPUB ev.quiet 1\r\nP\r\n" * 3}


def test_routes_across_accounts_follow_a_reload_as_nats_server(servers: Any, raw: Any) -> None:
    """Publishes before the reload fill every cache of the routing path (the router's
    plans and quiet subjects, the sublists' match caches, the parser's line cache, the
    publishers' fast path); after it, the same publishes must go where the new config
    sends them, on the same connections, as with nats-server."""
    seen: dict[str, dict[str, bytes]] = {}
    for impl in IMPLS:
        proc = (servers.nats_server(IMPORTS_BEFORE) if impl == "nats-server"
                else servers.jetraft(IMPORTS_BEFORE))
        conns = {user: _login(raw, proc.port, user) for user in "apbc"}
        assert conns["b"].exchange(b"SUB ev.> 1\r\nSUB svc.> 2\r\n") == b""
        assert conns["c"].exchange(b"SUB ev.> 1\r\nSUB from.ev.> 2\r\n") == b""
        assert conns["a"].exchange(b"SUB svc.> 3\r\nSUB ev.mapped 4\r\n") == b""
        for user in "pa":
            conns[user].send(_WARM[user] + b"PING\r\n")
            assert conns[user].read_until(b"PONG\r\n").endswith(b"PONG\r\n")
        before = {u: _without_pings(conns[u].read_close_or_wait(0.5)) for u in "apbc"}
        assert "Reloaded server configuration (" in reload(proc, IMPORTS_AFTER), impl
        for user in "pa":
            conns[user].send(_WARM[user] + b"PING\r\n")
        seen[impl] = {u: _without_pings(conns[u].read_close_or_wait(1.0)) for u in "apbc"}
        seen[impl]["before"] = b"|".join(before[u] for u in "apbc")
        proc.stop()
    assert seen["jetraft"] == seen["nats-server"]
    # Not only equal: B got ev.1 through its import before and nothing after; C gets a's
    # (prefixed) after only; p's ev.> publishes are refused after the reload.
    after = seen["nats-server"]
    assert b"MSG ev.1 1 1\r\np\r\n" in after["before"] and after["b"] == b""
    assert after["c"].count(b"MSG from.ev.1 2 1\r\n1\r\n") == 3 and b"p\r\n" not in after["c"]
    assert after["p"].count(b"Permissions Violation for Publish to \"ev.1\"") == 3


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests import certs

    if not certs.available():
        pytest.skip("openssl CLI not installed")
    return certs.make_pki(tmp_path_factory.mktemp("pki"))


def test_tls_log_and_limits_reload_like_nats_server(servers: Any, raw: Any, pki: Any) -> None:
    """A reload that turns TLS on, lowers max_payload and max_connections, and turns
    debug logging on: new connections see it (INFO, -ERRs), the log says what was
    reloaded, as nats-server does."""
    before = "max_payload: 1000\nmax_connections: 10\n"
    after = (f"max_payload: 100\nmax_connections: 2\ndebug: true\n"
             f"tls {{ cert_file: '{pki.server_cert}', key_file: '{pki.server_key}' }}\n")
    seen: dict[str, Any] = {}
    for impl in IMPLS:
        proc = servers.nats_server(before) if impl == "nats-server" else servers.jetraft(before)
        keep = [raw(proc.port), raw(proc.port)]
        for c in keep:
            assert c.exchange(b'CONNECT {"verbose":false}\r\n') == b""
        line = reload(proc, after)
        fresh = raw(proc.port)  # over the new max_connections (2 kept)
        out: dict[str, Any] = {"outcome": line.split("] ", 1)[1].split(" (")[0],
                               "info": {k: fresh.info.get(k) for k in
                                        ("tls_required", "max_payload")},
                               "third": fresh.read_close_or_wait(1.0).decode()}
        keep[0].send(b"PUB a 150\r\n" + b"x" * 150 + b"\r\nPING\r\n")
        out["kept, big PUB"] = keep[0].read_close_or_wait(1.0).decode()
        out["logged"] = sorted(set(re.findall(r"Reloaded: (debug|tls|max_payload|"
                                              r"max_connections) = ", proc.log_text())))
        seen[impl] = out
    assert seen["jetraft"] == seen["nats-server"], json.dumps(seen, indent=1)
    assert seen["nats-server"]["info"] == {"tls_required": True, "max_payload": 100}
