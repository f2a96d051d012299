"""The security defects of issue 7, each reproduced as an attacker would, and
each checked against nats-server (the oracle) wherever the outcome is
observable on the wire: the same config, the same bytes, the same answer."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from pathlib import Path

import bcrypt
import nats
import pytest
import websockets

from tests.integration.test_security import HOST, server
from tests.ports import free_port

pytestmark = pytest.mark.timeout(120)
BOTH = ["nats-server", "jetraft"]


def start(servers, impl: str, config: str, args: list[str] | None = None):
    if impl == "nats-server":
        return servers.nats_server(config, args=args)
    return servers.jetraft(config, args=args)


def talk(port: int, *chunks: bytes, wait: float = 2.0) -> tuple[dict, bytes]:
    """Send `chunks` (a short pause between them); return INFO and everything the
    server sent after it until it closed (ending in b"<EOF>") or `wait` passed
    since the last byte (a trailing PONG ends the wait early)."""
    sock = socket.create_connection((HOST, port), timeout=10)
    try:
        buf = b""
        while b"\r\n" not in buf:
            buf += sock.recv(65536)
        line, buf = buf.split(b"\r\n", 1)
        info = json.loads(line[5:])
        for chunk in chunks:
            sock.sendall(chunk)
            time.sleep(0.1)
        sock.settimeout(wait)
        while not buf.endswith(b"PONG\r\n"):
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionError:
                data = b""
            if not data:
                buf += b"<EOF>"
                break
            buf += data
        return info, buf
    finally:
        sock.close()


async def probe(port: int, subject: str, **creds):
    """A privileged subscriber that records what reaches `subject`."""
    nc = await nats.connect(f"nats://{HOST}:{port}", allow_reconnect=False, **creds)
    got: list[str] = []

    async def on_msg(msg) -> None:
        got.append(msg.subject)

    await nc.subscribe(subject, cb=on_msg)
    await nc.flush(timeout=5)
    return nc, got


# --------------------------------------------------------------------------- 1 no_auth_user

NO_AUTH = """
authorization {
  users: [
    {user: anon, password: pw, permissions: {publish: ["ok"], subscribe: ["ok"]}}
    {user: admin, password: pw}
  ]
  timeout: 1
}
no_auth_user: anon
"""


@pytest.mark.parametrize("impl", BOTH)
async def test_no_auth_user_permissions_apply_without_connect(servers, impl):
    srv = start(servers, impl, NO_AUTH)
    admin, got = await probe(srv.port, "secret", user="admin", password="pw")
    info, out = talk(srv.port, b"SUB secret 1\r\nPUB secret 2\r\nhi\r\nPING\r\n")
    assert "auth_required" not in info  # advertised as optional ...
    assert out == (b"-ERR 'Permissions Violation for Subscription to \"secret\"'\r\n"
                   b"-ERR 'Permissions Violation for Publish to \"secret\"'\r\n"
                   b"PONG\r\n")  # ... yet the no-auth user's permissions hold
    _, out = talk(srv.port, b"SUB ok 1\r\nPUB ok 2\r\nhi\r\nPING\r\n")
    assert out == b"+OK\r\n+OK\r\nMSG ok 1 2\r\nhi\r\nPONG\r\n"
    await admin.flush(timeout=5)
    await admin.close()
    assert got == []


@pytest.mark.parametrize("impl", BOTH)
def test_no_auth_user_still_expects_connect_in_time(servers, impl):
    srv = start(servers, impl, NO_AUTH)
    _, out = talk(srv.port, wait=5)
    assert out == b"-ERR 'Authentication Timeout'\r\n<EOF>"


# --------------------------------------------------------------------------- 2 fail closed

DEFAULT_PERMS = """
authorization {
  default_permissions: { publish: ["a"] }
  users: [
    {user: u, password: p}
    {user: v, password: p, permissions: {subscribe: ["a"]}}
  ]
}
"""


@pytest.mark.parametrize("impl", BOTH)
@pytest.mark.parametrize("who", ["u", "v"])
def test_default_permissions_are_enforced(servers, impl, who):
    srv = start(servers, impl, DEFAULT_PERMS)
    connect = json.dumps({"verbose": False, "user": who, "pass": "p"}).encode()
    _, out = talk(srv.port, b"CONNECT " + connect + b"\r\nPUB b 0\r\n\r\nPUB a 0\r\n\r\n"
                  b"SUB b 1\r\nPING\r\n")
    expected = {"u": b"-ERR 'Permissions Violation for Publish to \"b\"'\r\nPONG\r\n",
                "v": b"-ERR 'Permissions Violation for Subscription to \"b\"'\r\nPONG\r\n"}
    assert out == expected[who]


CONN_TYPES = """
authorization { users: [
  {user: ws, password: p, allowed_connection_types: ["WEBSOCKET"]}
  {user: tcp, password: p, allowed_connection_types: ["STANDARD"]}
] }
"""


@pytest.mark.parametrize("impl", BOTH)
def test_allowed_connection_types_are_enforced(servers, impl):
    srv = start(servers, impl, CONN_TYPES)
    for user, expected in (("ws", b"-ERR 'Authorization Violation'\r\n<EOF>"),
                           ("tcp", b"PONG\r\n")):
        connect = json.dumps({"verbose": False, "user": user, "pass": "p"}).encode()
        assert talk(srv.port, b"CONNECT " + connect + b"\r\nPING\r\n")[1] == expected


def check_config(impl: str, tmp_path: Path, config: str) -> subprocess.CompletedProcess:
    path = tmp_path / "check.conf"
    path.write_text(config)
    exe = "nats-server" if impl == "nats-server" else sys.executable
    prefix = [] if impl == "nats-server" else ["-m", "node.cli", "serve"]
    return subprocess.run([exe, *prefix, "-t", "-c", str(path)], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("impl", BOTH)
@pytest.mark.parametrize("config", [
    'authorization { users: [{user: u, password: p, allowed_connection_types: ["BOGUS"]}] }',
    "authorization { nkeys: [UAKYITFQ3ZQZN5U5JSJBTHTJWHBQGMTX5LQWKYMCQXQ5T3NABY3JU3MB] }",
], ids=["bad-connection-type", "authorization-nkeys"])
def test_invalid_security_config_is_refused(impl, tmp_path, config):
    assert check_config(impl, tmp_path, config + "\n").returncode != 0


UNENFORCED = {
    # accounts {} and operator mode (MEMORY/full resolvers) are enforced; trusted_keys not.
    "trusted-keys": 'trusted_keys: ["ODSKR7MYFQZ5MMAJPIUHWXHWNKDXEPZZOXNFACVAVIAA5FQGMDXBNFQ4"]\n',
    "user-account": "authorization { users: [{user: a, password: a, account: A}] }\n",
    "auth-callout": "authorization { users: [{user: a, password: a}], "
                    "auth_callout { issuer: x, auth_users: [a] } }\n",
    "ws-verify-and-map": 'websocket { listen: "127.0.0.1:-1", tls { cert_file: {cert}, '
                         "key_file: {key}, verify_and_map: true } }\n",
    "cert-match": "tls { cert_file: {cert}, key_file: {key}, cert_match_by: subject }\n",
    "ws-pinned-certs": 'websocket { listen: "127.0.0.1:-1", tls { cert_file: {cert}, '
                       'key_file: {key}, pinned_certs: ["a"] } }\n',
    "ws-authorization": 'websocket { listen: "127.0.0.1:-1", no_tls: true, '
                        "authorization { user: a, password: b } }\n",
    "ws-jwt-cookie": 'websocket { listen: "127.0.0.1:-1", no_tls: true, jwt_cookie: c }\n',
    # a `limits {}` key outside the block (nats-server ignores it there: not what was meant)
    "js-limits-outside": "jetstream { store_dir: {store}, max_ha_assets: 10 }\n",
}


@pytest.mark.parametrize("name", list(UNENFORCED))
def test_unenforced_security_settings_stop_the_node(tmp_path, name, pki):
    config = UNENFORCED[name].replace("{cert}", json.dumps(str(pki.server_cert)))
    config = config.replace("{key}", json.dumps(str(pki.server_key)))
    config = config.replace("{store}", json.dumps(str(tmp_path / "js")))
    path = tmp_path / "fail.conf"
    path.write_text(f"listen: 127.0.0.1:{free_port()}\n" + config)
    proc = subprocess.run([sys.executable, "-m", "node.cli", "serve", "-c", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "[FTL]" in proc.stderr and "not enforced" in proc.stderr
    assert "Server is ready" not in proc.stderr


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from tests import certs

    if not certs.available():
        pytest.skip("openssl CLI not installed")
    return certs.make_pki(tmp_path_factory.mktemp("pki"))


# --------------------------------------------------------------------------- 3 bcrypt

def wrong_password_storm(port: int, attempts: int) -> list[threading.Thread]:
    def attempt() -> None:
        try:
            talk(port, b'CONNECT {"verbose":false,"user":"u","pass":"nope"}\r\nPING\r\n',
                 wait=10)
        except OSError:
            pass

    threads = [threading.Thread(target=attempt) for _ in range(attempts)]
    for t in threads:
        t.start()
    return threads


@pytest.mark.parametrize("impl", BOTH)
async def test_wrong_passwords_do_not_stall_other_clients(servers, impl):
    # Cost 12: ~0.2 s per check, so 20 checks on the event loop would hold a
    # bystander's PING for about 4 s. The bound below is generous on purpose.
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=12)).decode()
    # a cost-12 check on a busy CI core (load 30) can outlast the default 2 s auth timeout
    srv = start(servers, impl, f"authorization {{ timeout: 15, users: [{{user: u, password: "
                               f"{json.dumps(hashed)}}}] }}\n")
    # ... and nats-py's default 2 s connect timeout
    nc = await nats.connect(f"nats://{HOST}:{srv.port}", user="u", password="right",
                            allow_reconnect=False, connect_timeout=15)
    # One check's time on this machine right now (bcrypt releases the GIL): on a loaded CI
    # machine a check takes several times its quiet 0.2 s, and so does every scheduling
    # wait. A loop running the 20 checks itself would hold the PING behind many of them.
    began = time.monotonic()
    await asyncio.to_thread(bcrypt.checkpw, b"nope", hashed.encode())
    bound = max(1.5, 4 * (time.monotonic() - began))
    threads = wrong_password_storm(srv.port, 20)
    worst = 0.0
    while any(t.is_alive() for t in threads):
        began = time.monotonic()
        await nc.flush(timeout=10)
        worst = max(worst, time.monotonic() - began)
        await asyncio.sleep(0.02)
    await nc.close()
    assert worst < bound, f"a bystander's PING took {worst:.2f}s during the storm ({bound=:.2f})"


def test_repeated_failures_are_refused_without_hashing(servers):
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4)).decode()
    srv = servers.jetraft(f"authorization {{ users: [{{user: u, password: "
                          f"{json.dumps(hashed)}}}] }}\n")
    refused = b"-ERR 'Authorization Violation'\r\n<EOF>"
    for i in range(12):  # distinct guesses: none is answered from the cache
        connect = json.dumps({"verbose": False, "user": "u", "pass": f"guess{i}"}).encode()
        assert talk(srv.port, b"CONNECT " + connect + b"\r\nPING\r\n")[1] == refused
    assert srv.log_text().count("too many authentication attempts") == 2
    # The source is over its failure budget: even the right password is not checked now.
    connect = b'CONNECT {"verbose":false,"user":"u","pass":"right"}\r\nPING\r\n'
    assert talk(srv.port, connect)[1] == refused
    assert srv.log_text().count("too many authentication attempts") == 3


# --------------------------------------------------------------------------- 4 websocket


def masked_frame(payload: bytes, rsv1: bool) -> bytes:
    mask = os.urandom(4)
    head = bytes([0x82 | (0x40 if rsv1 else 0)])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + body


def peak_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("impl", BOTH)
async def test_websocket_inflation_is_bounded(servers, impl):
    wport = free_port()
    conf = f'websocket {{ listen: "{HOST}:{wport}", no_tls: true, compression: true }}\n'
    deflater = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = deflater.compress(b"PUB x 1\r\n" + b"A" * 200_000_000)
    bomb = (bomb + deflater.flush(zlib.Z_SYNC_FLUSH))[:-4]  # the extension strips the tail
    assert len(bomb) < 300_000
    srv = start(servers, impl, conf)
    reader, writer = await asyncio.open_connection(HOST, wport)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 b"Sec-WebSocket-Version: 13\r\n"
                 b"Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    assert b"101" in head.split(b"\r\n")[0]
    writer.write(masked_frame(bomb, rsv1=True))  # before CONNECT
    async with asyncio.timeout(60):
        try:
            while await reader.read(65536):
                pass  # until the server closes the connection
        except ConnectionResetError:
            pass  # closed with our frame still unread
    writer.close()
    # Inflating the whole frame would have needed 200 MB at least.
    assert peak_rss_bytes(srv.proc.pid) < 120_000_000
    nc = await nats.connect(srv.url, allow_reconnect=False)  # and the node still serves
    await nc.flush(timeout=5)
    await nc.close()


async def test_websocket_inflation_up_to_max_payload_passes(tmp_path):
    wport = free_port()
    conf = (f'websocket {{ listen: "{HOST}:{wport}", no_tls: true, compression: true }}\n'
            "max_payload: 200000\n")
    with server("jetraft", tmp_path, conf, also=(wport,)):
        async with websockets.connect(f"ws://{HOST}:{wport}", max_size=None) as ws:
            assert ws.protocol.extensions
            await ws.recv()
            body = b"y" * 200_000
            await ws.send(b'CONNECT {"verbose":false}\r\nSUB big 1\r\n')
            await ws.send(b"PUB big %d\r\n" % len(body) + body + b"\r\nPING\r\n")
            got = b""
            async with asyncio.timeout(10):
                while b"PONG\r\n" not in got:
                    frame = await ws.recv()
                    got += frame if isinstance(frame, bytes) else frame.encode()
            assert b"MSG big 1 200000\r\n" + body in got


# --------------------------------------------------------------------------- 5 queue groups

QUEUE_PERMS = """
authorization { users: [
  {user: picky, password: p, permissions: {subscribe: {allow: ["jobs.*"], deny: ["jobs.secret"]}}}
  {user: free, password: p}
] }
"""


@pytest.mark.parametrize("impl", BOTH)
async def test_queue_member_that_may_not_receive_passes_the_message_on(servers, impl):
    srv = start(servers, impl, QUEUE_PERMS)
    url = f"nats://{HOST}:{srv.port}"
    picky = await nats.connect(url, user="picky", password="p", allow_reconnect=False)
    free = await nats.connect(url, user="free", password="p", allow_reconnect=False)
    got: dict[str, list[str]] = {"picky": [], "free": []}

    def recorder(name: str):
        async def on_msg(msg) -> None:
            got[name].append(msg.subject)
        return on_msg

    await picky.subscribe("jobs.*", queue="q", cb=recorder("picky"))
    await free.subscribe("jobs.*", queue="q", cb=recorder("free"))
    await picky.flush(timeout=5)
    await free.flush(timeout=5)
    for _ in range(40):
        await free.publish("jobs.secret", b"x")
    await free.flush(timeout=5)
    deadline = time.monotonic() + 10
    while len(got["free"]) < 40 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await picky.close()
    await free.close()
    assert got == {"picky": [], "free": ["jobs.secret"] * 40}


@pytest.mark.parametrize("impl", BOTH)
async def test_no_responders_when_the_only_responder_may_not_receive(servers, impl):
    srv = start(servers, impl, QUEUE_PERMS)
    url = f"nats://{HOST}:{srv.port}"
    picky = await nats.connect(url, user="picky", password="p", allow_reconnect=False)
    free = await nats.connect(url, user="free", password="p", allow_reconnect=False)
    async def ignore(msg) -> None:
        pass

    await picky.subscribe("jobs.*", cb=ignore)
    await picky.subscribe("jobs.*", queue="q", cb=ignore)
    await picky.flush(timeout=5)
    for _ in range(5):
        with pytest.raises(nats.errors.NoRespondersError):
            await free.request("jobs.secret", b"?", timeout=5)
    await picky.close()
    await free.close()


# --------------------------------------------------------------------------- 6 monitor host


@pytest.mark.parametrize("impl", BOTH)
def test_monitor_listens_where_clients_do(servers, impl):
    srv = start(servers, impl, None)  # -a 127.0.0.1 -m <port>, no http host given
    with urllib.request.urlopen(f"{srv.http}/varz", timeout=10) as resp:
        assert json.load(resp)["http_host"] == "127.0.0.1"
    # Had the monitor bound 0.0.0.0, this address's port would be taken too.
    with socket.socket() as s:
        s.bind(("127.0.0.2", srv.http_port))


# --------------------------------------------------------------------------- 7 subsz limit


@pytest.mark.parametrize("impl", BOTH)
async def test_subsz_pages_its_subscription_list(servers, impl):
    srv = start(servers, impl, None)
    # The server's own subscriptions (system account services) count too.
    with urllib.request.urlopen(f"{srv.http}/subsz", timeout=10) as resp:
        base = json.load(resp)["num_subscriptions"]
    nc = await nats.connect(srv.url, allow_reconnect=False)
    for i in range(1500):
        await nc.subscribe(f"s.{i}")
    await nc.flush(timeout=10)
    pages = {}
    for query in ("subs=1", "subs=1&limit=10", f"subs=1&offset={base + 1495}&limit=10"):
        with urllib.request.urlopen(f"{srv.http}/subsz?{query}", timeout=10) as resp:
            pages[query] = json.load(resp)
    await nc.close()
    assert len(pages["subs=1"]["subscriptions_list"]) == 1024
    assert len(pages["subs=1&limit=10"]["subscriptions_list"]) == 10
    assert pages["subs=1&limit=10"]["limit"] == 10
    total = pages["subs=1"]["total"]
    if impl == "jetraft":
        assert total == base + 1500
        assert len(pages[f"subs=1&offset={base + 1495}&limit=10"]["subscriptions_list"]) == 5
    else:  # its own system subscriptions count too, and its total has been seen to lag
        assert total > 1024


# --------------------------------------------------------------------------- smaller ones

USER = "authorization { users: [{user: u, password: p}] }\n"


@pytest.mark.parametrize("impl", BOTH)
def test_hpub_before_connect_is_an_authorization_violation(servers, impl):
    srv = start(servers, impl, USER)
    _, out = talk(srv.port, b"HPUB foo 12 14\r\nNATS/1.0\r\n\r\nhi\r\n")
    assert out == b"-ERR 'Authorization Violation'\r\n<EOF>"


@pytest.mark.parametrize("impl", BOTH)
def test_second_connect_keeps_what_it_omits_and_is_authenticated(servers, impl):
    srv = start(servers, impl, USER)
    first = b'CONNECT {"user":"u","pass":"p","verbose":false,"headers":true}\r\n'
    again = b'CONNECT {"user":"u","pass":"p"}\r\n'
    _, out = talk(srv.port, first, again, b"HPUB foo 12 14\r\nNATS/1.0\r\n\r\nhi\r\nPING\r\n")
    assert out == b"PONG\r\n"  # still quiet, still with headers
    _, out = talk(srv.port, first, b'CONNECT {"user":"u","pass":"bad"}\r\nPING\r\n')
    assert out == b"-ERR 'Authorization Violation'\r\n<EOF>"


@pytest.mark.parametrize("impl", BOTH)
def test_auth_timer_starts_after_the_tls_handshake(servers, impl, pki, tmp_path):
    import ssl

    config = (f"tls {{ cert_file: {json.dumps(str(pki.server_cert))}, "
              f"key_file: {json.dumps(str(pki.server_key))}, timeout: 5 }}\n"
              "authorization { user: u, password: p, timeout: 1 }\n")
    srv = start(servers, impl, config)
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    with socket.create_connection((HOST, srv.port), timeout=10) as raw:
        info = raw.recv(65536)
        assert info.startswith(b"INFO ")
        time.sleep(1.5)  # slow handshake: longer than auth_timeout, within the TLS timeout
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls_sock:
            tls_sock.sendall(b'CONNECT {"user":"u","pass":"p","verbose":false}\r\nPING\r\n')
            got = b""
            while b"\r\n" not in got:
                got += tls_sock.recv(65536)
            assert got.startswith(b"PONG\r\n"), got


@pytest.mark.parametrize("impl", BOTH)
def test_trace_flag_logs_the_protocol(servers, impl):
    srv = start(servers, impl, None, args=["-V"])
    talk(srv.port, b'CONNECT {"verbose":false}\r\nSUB t 1\r\nPUB t 2\r\nhi\r\nPING\r\n')
    srv.wait_for_log("->> [PONG]", 10)
    log = srv.log_text()
    for line in ("<<- [SUB t 1]", "<<- [PUB t 2]", "<<- [PING]", "->> [MSG t 1 2]"):
        assert line in log, line


def test_version_agrees_with_info(servers):
    srv = servers.jetraft()
    info, _ = talk(srv.port, b"PING\r\n")
    out = subprocess.run([sys.executable, "-m", "node.cli", "--version"], capture_output=True,
                         text=True, timeout=60).stdout
    assert out.strip() == f"jetraft: v{info['version']}"


def test_invoked_as_nats_server_it_serves(tmp_path):
    entry = Path(sys.executable).parent / "jetraft"  # the installed console script
    if not entry.exists():
        pytest.skip("jetraft is not installed next to this python")
    link = tmp_path / "nats-server"
    link.symlink_to(entry)
    version = subprocess.run([str(link), "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    assert version.strip() == "nats-server: v2.15.1-jetraft"  # what scripts parse
    port = free_port()
    proc = subprocess.Popen([str(link), "-a", HOST, "-p", str(port)], stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                info, _ = talk(port, b"PING\r\n")
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        assert info["version"].endswith("-jetraft")
    finally:
        proc.terminate()
        proc.wait(10)


# --------------------------------------------------------------------------- held while hashing


def bcrypt_users(extra: str = "") -> str:
    hashed = json.dumps(bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=8)).decode())
    return (f"authorization {{ users: [{{user: u, password: {hashed}}}"
            f"{extra}] }}\n")


@pytest.mark.parametrize("impl", BOTH)
def test_what_follows_a_bcrypt_connect_runs_after_it_in_order(servers, impl):
    srv = start(servers, impl, bcrypt_users())
    _, out = talk(srv.port, b'CONNECT {"verbose":true,"user":"u","pass":"pw"}\r\n'
                  b"SUB a 1\r\nPUB a 2\r\nhi\r\nPING\r\n")
    assert out == b"+OK\r\n+OK\r\n+OK\r\nMSG a 1 2\r\nhi\r\nPONG\r\n"
    _, out = talk(srv.port, b'CONNECT {"verbose":false,"user":"u","pass":"no"}\r\n'
                  b"SUB a 1\r\nPING\r\n")
    assert out == b"-ERR 'Authorization Violation'\r\n<EOF>"


@pytest.mark.parametrize("impl", BOTH)
@pytest.mark.parametrize("user", ["u", "ws", "tcp"])
async def test_websocket_logins_check_connection_types(servers, impl, user):
    wport = free_port()
    extra = (', {user: ws, password: pw, allowed_connection_types: ["WEBSOCKET"]}'
             ', {user: tcp, password: pw, allowed_connection_types: ["STANDARD"]}')
    conf = bcrypt_users(extra) + f'websocket {{ listen: "{HOST}:{wport}", no_tls: true }}\n'
    start(servers, impl, conf)
    async with websockets.connect(f"ws://{HOST}:{wport}", max_size=None) as ws:
        await ws.recv()  # INFO
        connect = json.dumps({"verbose": False, "user": user, "pass": "pw"}).encode()
        await ws.send(b"CONNECT " + connect + b"\r\nSUB a 1\r\nPUB a 1\r\nx\r\nPING\r\n")
        got = b""
        try:
            async with asyncio.timeout(10):
                while b"PONG\r\n" not in got:
                    frame = await ws.recv()
                    got += frame if isinstance(frame, bytes) else frame.encode()
        except websockets.ConnectionClosed:
            pass
    if user == "tcp":
        assert got == b"-ERR 'Authorization Violation'\r\n"
    else:
        assert got == b"MSG a 1 1\r\nx\r\nPONG\r\n"


def one_session(port: int, first: bytes, then: bytes, wait: float = 5.0) -> bytes:
    """Log in with `first` (if any) and wait for its PONG; then send `then` in ONE
    write and return what came back (up to PONG or the close)."""
    sock = socket.create_connection((HOST, port), timeout=10)
    sock.settimeout(wait)
    buf = b""

    def until_pong() -> bytes:
        nonlocal buf
        while not buf.endswith(b"PONG\r\n"):
            try:
                data = sock.recv(65536)
            except (TimeoutError, ConnectionError):
                data = b""
            if not data:
                buf += b"<EOF>"
                break
            buf += data
        out, buf = buf, b""
        return out

    try:
        while b"\r\n" not in buf:
            buf += sock.recv(65536)
        buf = buf.split(b"\r\n", 1)[1]  # INFO
        if first:
            sock.sendall(first + b"PING\r\n")
            assert until_pong() == b"PONG\r\n"
        sock.sendall(then + b"PING\r\n")
        return until_pong()
    finally:
        sock.close()


def _login(user: str, password: str) -> bytes:
    body = {"verbose": False, "pedantic": False, "user": user, "pass": password}
    return b"CONNECT " + json.dumps(body).encode() + b"\r\n"


# Each case: (CONNECT already done, the CONNECT that shares its write with a PUB).
# u may publish anything (no per-message checks: the fast path), r may not publish x.
HELD_CASES = {
    "first-bad-password": (b"", _login("u", "wrong")),
    "first-denied-user": (b"", _login("r", "pw")),
    "second-bad-password": (_login("u", "pw"), _login("u", "wrong")),
    "second-denied-user": (_login("u", "pw"), _login("r", "pw")),
}
HELD_OUT = {
    "first-bad-password": b"-ERR 'Authorization Violation'\r\n<EOF>",
    "first-denied-user": b"-ERR 'Permissions Violation for Publish to \"x\"'\r\nPONG\r\n",
    "second-bad-password": b"-ERR 'Authorization Violation'\r\n<EOF>",
    "second-denied-user": b"-ERR 'Permissions Violation for Publish to \"x\"'\r\nPONG\r\n",
}


@pytest.mark.parametrize("impl", BOTH)
@pytest.mark.parametrize("case", list(HELD_CASES))
async def test_pub_in_the_same_read_waits_for_the_connect_check(servers, impl, case):
    """A PUB read together with a CONNECT whose bcrypt check runs off the loop
    is judged by that CONNECT's outcome: never published under the login before
    it (nor before any login). nats-server checks inline, so it is the oracle."""
    extra = (', {user: r, password: %s, permissions: {publish: {deny: ["x"]}}}'
             ', {user: admin, password: plain}')
    hashed = json.dumps(bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=10)).decode())
    srv = start(servers, impl, bcrypt_users(extra % hashed))
    admin = await nats.connect(f"nats://{HOST}:{srv.port}", allow_reconnect=False,
                               user="admin", password="plain")
    sub = await admin.subscribe("x")
    await admin.flush(timeout=5)
    first, then = HELD_CASES[case]
    out = await asyncio.to_thread(one_session, srv.port, first, then + b"PUB x 1\r\na\r\n")
    assert out == HELD_OUT[case]
    await admin.publish("x", b"end")  # ordered after anything the raw client published
    seen = (await sub.next_msg(timeout=5)).data
    await admin.close()
    assert seen == b"end", f"{case}: the probe got a PUB nats-server would not deliver"


# --------------------------------------------------------------------------- pinned_certs


def openssl_spki_pin(cert: Path) -> str:
    """The oracle's way: DER public key of the certificate, then SHA-256."""
    pub = subprocess.run(["openssl", "x509", "-in", str(cert), "-pubkey", "-noout"],
                         capture_output=True, check=True).stdout
    der = subprocess.run(["openssl", "pkey", "-pubin", "-outform", "DER"], input=pub,
                         capture_output=True, check=True).stdout
    import hashlib

    return hashlib.sha256(der).hexdigest()


def test_spki_pin_matches_openssl(pki):
    import ssl

    from node.tls import spki_sha256

    for cert in (pki.client_cert, pki.server_cert, pki.ca):
        der = ssl.PEM_cert_to_DER_cert(cert.read_text())
        assert spki_sha256(der) == openssl_spki_pin(cert)


@pytest.mark.parametrize("impl", BOTH)
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "not-pinned"])
async def test_pinned_certs_are_enforced(servers, impl, pki, pinned):
    from node import tls

    pin = openssl_spki_pin(pki.client_cert if pinned else pki.server_cert)
    config = (f"tls {{ cert_file: {json.dumps(str(pki.server_cert))}, "
              f"key_file: {json.dumps(str(pki.server_key))}, ca_file: {json.dumps(str(pki.ca))}, "
              f"verify: true, timeout: 5, pinned_certs: [{json.dumps(pin.upper())}] }}\n")
    srv = start(servers, impl, config)
    ctx = tls.client_context(str(pki.ca), str(pki.client_cert), str(pki.client_key))

    async def attempt() -> None:
        nc = await nats.connect(srv.url, tls=ctx, allow_reconnect=False, connect_timeout=5,
                                max_reconnect_attempts=0)
        await nc.flush(timeout=5)
        await nc.close()

    if pinned:
        await attempt()
    else:
        with pytest.raises(Exception):  # noqa: B017 - nats-py raises several types here
            await attempt()


# --------------------------------------------------------------------------- verify_and_map


@pytest.fixture(scope="module")
def mapped_certs(pki):
    """Client certificates named by an e-mail SAN, a one-RDN and a two-RDN subject."""
    from tests import certs

    d = pki.ca.parent
    certs.make_leaf(d, "mail", "extendedKeyUsage=clientAuth\n"
                    "subjectAltName=email:alice@example.com\n")
    certs.make_leaf(d, "nobody", "extendedKeyUsage=clientAuth\n")
    (d / "bob.ext").write_text("extendedKeyUsage=clientAuth\n")
    certs._run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
               "-keyout", "bob.key", "-out", "bob.csr", "-subj", "/O=Acme/CN=bob", cwd=d)
    certs._run("x509", "-req", "-in", "bob.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
               "-CAcreateserial", "-days", "2", "-out", "bob.pem", "-extfile", "bob.ext", cwd=d)
    return d


@pytest.mark.parametrize("impl", BOTH)
@pytest.mark.parametrize("who,admitted,creds", [
    ("mail", True, {}), ("client", True, {}), ("bob", True, {}), ("nobody", False, {}),
    ("mail", False, {"user": "someone", "password": "pw"}),  # the certificate decides alone
    ("mail", True, {"user": "alice@example.com"}),
])
async def test_verify_and_map_names_the_user_by_certificate(servers, impl, pki, mapped_certs,
                                                           who, admitted, creds):
    from node import tls

    users = [{"user": "alice@example.com"}, {"user": "CN=client"},
             {"user": "CN=bob, O=Acme"}, {"user": "someone", "password": "pw"}]
    config = (f"tls {{ cert_file: {json.dumps(str(pki.server_cert))}, "
              f"key_file: {json.dumps(str(pki.server_key))}, ca_file: {json.dumps(str(pki.ca))}, "
              f"verify_and_map: true, timeout: 5 }}\n"
              f"authorization {{ users: {json.dumps(users)} }}\n")
    srv = start(servers, impl, config)
    d = mapped_certs
    ctx = tls.client_context(str(pki.ca), str(d / f"{who}.pem"), str(d / f"{who}.key"))

    async def attempt() -> None:
        nc = await nats.connect(srv.url, tls=ctx, allow_reconnect=False, connect_timeout=5,
                                max_reconnect_attempts=0, **creds)
        await nc.flush(timeout=5)
        await nc.close()

    if admitted:
        await attempt()
    else:
        with pytest.raises(Exception):  # noqa: B017 - nats-py raises several types here
            await attempt()


# --------------------------------------------------------------------------- websocket origins

ORIGIN_CASES = [None, "http://127.0.0.1:{port}", "http://127.0.0.1", "http://evil.example",
                "https://127.0.0.1:{port}", "http://good.example:8080", "http://good.example",
                "HTTP://GOOD.example:8080", "null"]


def upgrade_status(port: int, origin: str | None) -> str:
    request = (f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
               "Sec-WebSocket-Version: 13\r\n")
    if origin is not None:
        request += f"Origin: {origin.format(port=port)}\r\n"
    with socket.create_connection((HOST, port), timeout=10) as sock:
        sock.sendall((request + "\r\n").encode())
        head = b""
        while b"\r\n" not in head:
            head += sock.recv(4096)
    return head.split(b"\r\n")[0].decode()


@pytest.mark.parametrize("setting", [
    "same_origin: true", 'allowed_origins: ["http://good.example:8080"]',
    'same_origin: true, allowed_origins: ["http://good.example:8080"]'],
    ids=["same", "allowed", "both"])
def test_websocket_origin_checks_match_nats_server(servers, setting):
    statuses = {}
    for impl in BOTH:
        wport = free_port()
        start(servers, impl, f'websocket {{ listen: "{HOST}:{wport}", no_tls: true, {setting} }}\n')
        statuses[impl] = [upgrade_status(wport, origin) for origin in ORIGIN_CASES]
    assert statuses["jetraft"] == statuses["nats-server"]
    assert any("403" in s for s in statuses["jetraft"]) and "101" in statuses["jetraft"][0]


WS_NO_AUTH = """
authorization { users: [
  {user: anon, password: pw, permissions: {subscribe: ["ok"]}}
  {user: admin, password: pw}
] }
"""


@pytest.mark.parametrize("impl", BOTH)
async def test_websocket_no_auth_user_applies_to_websocket_clients_only(servers, impl):
    wport = free_port()
    srv = start(servers, impl, WS_NO_AUTH + f'websocket {{ listen: "{HOST}:{wport}", '
                                             "no_tls: true, no_auth_user: anon }\n")
    async with websockets.connect(f"ws://{HOST}:{wport}") as ws:
        first = await ws.recv()
        first = first if isinstance(first, bytes) else first.encode()
        assert json.loads(first[5:first.index(b"\r\n")])["auth_required"] is True
        await ws.send(b"SUB secret 1\r\nSUB ok 2\r\nPING\r\n")
        got = b""
        async with asyncio.timeout(10):
            while b"PONG\r\n" not in got:
                frame = await ws.recv()
                got += frame if isinstance(frame, bytes) else frame.encode()
    assert got == (b"-ERR 'Permissions Violation for Subscription to \"secret\"'\r\n"
                   b"+OK\r\nPONG\r\n")
    # Over TCP, the same client is refused: the setting is the WebSocket listener's.
    assert talk(srv.port, b"SUB ok 1\r\nPING\r\n")[1] == b"-ERR 'Authorization Violation'\r\n<EOF>"


@pytest.mark.parametrize("impl", BOTH)
def test_a_reconnect_storm_with_one_password_is_admitted(servers, impl):
    # Thirty clients of one host log in at once with the same (right) password:
    # one bcrypt check serves them all, so the throttle refuses none of them.
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=10)).decode()
    srv = start(servers, impl, f"authorization {{ users: [{{user: u, password: "
                               f"{json.dumps(hashed)}}}] }}\n")
    results: list[bytes] = []

    def login() -> None:
        connect = b'CONNECT {"verbose":false,"user":"u","pass":"right"}\r\nPING\r\n'
        results.append(talk(srv.port, connect, wait=20)[1])

    threads = [threading.Thread(target=login) for _ in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # A slow login may see the server's first keep-alive PING first.
    assert [r.replace(b"PING\r\n", b"") for r in results] == [b"PONG\r\n"] * 30


# --------------------------------------------------------------------------- cipher_suites


@pytest.mark.parametrize("impl", BOTH)
@pytest.mark.parametrize("client_cipher,admitted", [
    ("ECDHE-ECDSA-AES256-GCM-SHA384", True), ("ECDHE-ECDSA-AES128-GCM-SHA256", False)])
def test_cipher_suites_limit_tls12(servers, impl, pki, client_cipher, admitted):
    import ssl

    config = (f"tls {{ cert_file: {json.dumps(str(pki.server_cert))}, "
              f"key_file: {json.dumps(str(pki.server_key))}, "
              'cipher_suites: ["TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"] }\n')
    srv = start(servers, impl, config)
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2  # the list governs TLS 1.2
    ctx.set_ciphers(client_cipher)
    why = ""
    with socket.create_connection((HOST, srv.port), timeout=10) as raw:
        info = b""
        while not info.endswith(b"\r\n"):  # all of INFO, and not a byte of TLS
            info += raw.recv(1)
        try:
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls_sock:
                tls_sock.sendall(b'CONNECT {"verbose":false}\r\nPING\r\n')
                got = b""
                while b"PONG\r\n" not in got:
                    chunk = tls_sock.recv(65536)
                    assert chunk, got
                    got += chunk
                assert tls_sock.cipher()[0] == client_cipher
                handshake_ok = True
        except ssl.SSLError as err:
            handshake_ok = False
            why = repr(err)
    assert handshake_ok == admitted, (why, srv.log_text()[-2000:])


def test_unknown_cipher_suite_is_a_config_error(tmp_path):
    for impl in BOTH:
        bad = 'tls { cert_file: a, key_file: b, cipher_suites: ["TLS_NOPE"] }\n'
        assert check_config(impl, tmp_path, bad).returncode != 0



@pytest.mark.parametrize("impl", BOTH)
async def test_plain_text_sent_before_the_tls_handshake_is_never_parsed(servers, impl, pki):
    from node import tls

    config = (f"tls {{ cert_file: {json.dumps(str(pki.server_cert))}, "
              f"key_file: {json.dumps(str(pki.server_key))} }}\n")
    srv = start(servers, impl, config)
    ctx = tls.client_context(str(pki.ca))
    nc = await nats.connect(srv.url, tls=ctx, allow_reconnect=False)
    got: list[str] = []

    async def on_msg(msg) -> None:
        got.append(msg.subject)

    await nc.subscribe("secret", cb=on_msg)
    await nc.flush(timeout=5)
    for _ in range(20):  # sent with the connection, before INFO is even read
        with socket.create_connection((HOST, srv.port), timeout=10) as sock:
            data = b""
            try:
                sock.sendall(b'CONNECT {"verbose":false}\r\nPUB secret 2\r\nhi\r\nPING\r\n')
                sock.settimeout(5)
                while chunk := sock.recv(65536):
                    data += chunk
            except (TimeoutError, ConnectionError):
                pass
            assert b"PONG" not in data
    await nc.flush(timeout=5)
    await asyncio.sleep(0.2)
    await nc.close()
    assert got == []


# --------------------------------------------------------------------------- ?acc= on the monitor


def monitor_json(srv, path: str) -> dict:
    with urllib.request.urlopen(f"{srv.http}/{path.replace('$', '%24')}", timeout=10) as resp:
        return json.load(resp)


@pytest.mark.parametrize("impl", BOTH)
def test_monitor_filters_by_account(servers, impl):
    srv = start(servers, impl, None)
    sock = socket.create_connection((HOST, srv.port), timeout=10)
    try:
        sock.sendall(b'CONNECT {"verbose":false}\r\nSUB acc.probe 1\r\nPING\r\n')
        got = b""
        while b"PONG\r\n" not in got:  # INFO, maybe a PING, then our PONG
            chunk = sock.recv(65536)
            assert chunk, got
            got += chunk
        assert monitor_json(srv, "connz?acc=$G")["num_connections"] == 1
        assert monitor_json(srv, "connz?acc=NOPE")["num_connections"] == 0
        subs = monitor_json(srv, "subsz?acc=$G&subs=1")["subscriptions_list"]
        mine = [s for s in subs if s["subject"] == "acc.probe"]
        assert len(mine) == 1 and mine[0]["account"] == "$G"
        empty = monitor_json(srv, "subsz?acc=NOPE&subs=1")
        assert empty["num_subscriptions"] == 0 and empty["total"] == 0
    finally:
        sock.close()
