"""Security, end to end: the same auth/TLS configs run against the Go
nats-server (the oracle) and against `jetraft serve`, driven by nats-py and
raw sockets. Outcomes and error texts must agree."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import nats
import nkeys
import pytest
from nacl.signing import SigningKey

from node import tls
from node.auth import CompiledPermissions, PermissionSet
from node.options import Permissions, TLSOptions
from tests import certs
from tests.ports import free_port
from tests.unit.test_auth import SUB_CASES

HOST = "127.0.0.1"
NATS_SERVER = shutil.which("nats-server")
pytestmark = pytest.mark.timeout(120)


def jetraft_cmd(conf: Path) -> list[str]:
    exe = shutil.which("jetraft")
    if exe:
        return [exe, "serve", "-c", str(conf)]
    return [sys.executable, "-m", "node.cli", "serve", "-c", str(conf)]


@functools.cache
def jetraft_available() -> bool:
    """The serve command and the client module land in parallel: skip the
    jetraft side of the differential until the server imports cleanly."""
    probe = subprocess.run([sys.executable, "-c", "import node.server, node.cli"],
                           capture_output=True, timeout=60)
    return probe.returncode == 0


IMPLS = [
    pytest.param("nats-server", marks=pytest.mark.skipif(not NATS_SERVER, reason="no nats-server")),
    pytest.param(
        "jetraft", marks=pytest.mark.skipif(not jetraft_available(), reason="jetraft serve missing")
    ),
]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1):
            return
        time.sleep(0.05)
    raise TimeoutError(f"port {port} never opened")


@contextlib.contextmanager
def server(impl: str, tmp: Path, body: str, also: tuple[int, ...] = ()) -> Iterator[int]:
    """Run `impl` with a config file made of `body` plus a listen line; wait for its client port
    and the `also` ports (listeners the server may open after the client one)."""
    port = free_port()
    conf = tmp / f"{impl}-{port}.conf"
    store = tmp / f"store-{port}"
    head = f"listen: {HOST}:{port}\njetstream {{ store_dir: {json.dumps(str(store))} }}\n"
    conf.write_text(head + body)
    cmd = [NATS_SERVER, "-c", str(conf)] if impl == "nats-server" else jetraft_cmd(conf)
    log = open(tmp / f"{impl}-{port}.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        for p in (port, *also):
            wait_port(p, proc)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


class Raw:
    """A line-oriented raw client, to see exactly what the server sends."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.buf = b""

    def line(self) -> str:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(self.buf)
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line.decode()

    def info(self) -> dict:
        line = self.line()
        assert line.startswith("INFO ")
        return json.loads(line[5:])

    def send(self, data: str) -> None:
        self.sock.sendall(data.encode())

    def until_pong(self) -> list[str]:
        """Lines received before the next PONG."""
        out = []
        while (line := self.line()) != "PONG":
            out.append(line)
        return out

    def close(self) -> None:
        self.sock.close()


def conf_list(items: list[str] | None) -> str:
    return json.dumps(items) if items is not None else "null"


# ----------------------------------------------------------------------- oracle checks


@pytest.mark.skipif(not NATS_SERVER, reason="no nats-server")
def test_subscribe_permission_table_matches_nats_server(tmp_path):
    """Every SUB_CASES row, asked of the live nats-server and of PermissionSet."""
    configs: list[tuple[list[str] | None, list[str] | None]] = []
    for allow, deny, *_ in SUB_CASES:
        if (allow, deny) not in configs:
            configs.append((allow, deny))
    users = []
    for i, (allow, deny) in enumerate(configs):
        sub = {k: v for k, v in (("allow", allow), ("deny", deny)) if v is not None}
        users.append({"user": f"u{i}", "password": "p", "permissions": {"subscribe": sub}})
    body = "authorization { users: " + json.dumps(users) + " }\n"
    with server("nats-server", tmp_path, body) as port:
        mismatches = []
        for n, (allow, deny, subject, queue, _) in enumerate(SUB_CASES):
            raw = Raw(port)
            raw.info()
            user = f"u{configs.index((allow, deny))}"
            raw.send(f"CONNECT {json.dumps({'user': user, 'pass': 'p', 'verbose': False})}\r\n")
            raw.send(f"SUB {subject} {queue or ''} {n}\r\nPING\r\n".replace("  ", " "))
            oracle = not any("Permissions Violation" in ln for ln in raw.until_pong())
            raw.close()
            ours = PermissionSet(
                CompiledPermissions.build(Permissions(subscribe_allow=allow, subscribe_deny=deny))
            ).can_subscribe(subject, queue)
            if ours is not oracle:
                mismatches.append((allow, deny, subject, queue, oracle))
        assert not mismatches


# ----------------------------------------------------------------------- TLS (node/tls.py)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if not certs.available():
        pytest.skip("openssl CLI not installed")
    return certs.make_pki(tmp_path_factory.mktemp("pki"))


def tls_opts(pki, **kw) -> TLSOptions:
    return TLSOptions(cert_file=str(pki.server_cert), key_file=str(pki.server_key),
                      ca_file=str(pki.ca), **kw)


class MiniNats(asyncio.Protocol):
    """Just enough of a NATS server (INFO, PONG) to drive node/tls.py with a
    real nats-py client, the way client.py uses it."""

    def __init__(self, opts: TLSOptions, seen: list) -> None:
        self.opts, self.seen, self.buf = opts, seen, b""
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        info = {"server_id": "mini", "version": "2.15.1", "proto": 1, "headers": True,
                "max_payload": 1048576, **tls.info_fields(self.opts)}
        transport.write(b"INFO " + json.dumps(info).encode() + b"\r\n")
        if self.opts.handshake_first:
            self.seen.append(("peer", tls.peer_cert(transport)))
        else:
            tls.start_upgrade(transport, self, tls.server_context(self.opts), 5.0, self.upgraded)

    def upgraded(self, new) -> None:
        self.seen.append(("upgraded", new is not None))
        if new is not None:
            self.transport = new
            self.seen.append(("peer", tls.peer_cert(new)))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n" in self.buf:
            line, self.buf = self.buf.split(b"\r\n", 1)
            self.seen.append(("line", line[:7]))
            if line == b"PING":
                self.transport.write(b"PONG\r\n")


@contextlib.asynccontextmanager
async def mini_server(opts: TLSOptions):
    seen: list = []
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: MiniNats(opts, seen), HOST, 0,
                                   ssl=tls.listener_ssl(opts))
    try:
        yield srv.sockets[0].getsockname()[1], seen
    finally:
        srv.close()


async def nats_tls_connect(port: int, ctx: ssl.SSLContext, **kw):
    return await nats.connect(f"tls://{HOST}:{port}", tls=ctx, allow_reconnect=False,
                              connect_timeout=5, **kw)


@pytest.mark.parametrize("first", [False, True], ids=["upgrade-after-info", "handshake-first"])
async def test_tls_nats_py_connects(pki, first):
    opts = tls_opts(pki, handshake_first=first)
    async with mini_server(opts) as (port, seen):
        ctx = tls.client_context(str(pki.ca))
        nc = await nats_tls_connect(port, ctx, tls_handshake_first=first)
        assert nc.is_connected
        await nc.flush(timeout=5)
        await nc.close()
    assert ("line", b"CONNECT") in seen and ("line", b"PING") in seen
    assert ("upgraded", True) in seen or first


async def test_tls_verify_requires_client_cert(pki):
    opts = tls_opts(pki, verify=True)
    async with mini_server(opts) as (port, seen):
        good = tls.client_context(str(pki.ca), str(pki.client_cert), str(pki.client_key))
        nc = await nats_tls_connect(port, good)
        await nc.flush(timeout=5)
        await nc.close()
        peers = [p for k, p in seen if k == "peer"]
        assert peers and dict(x[0] for x in peers[0]["subject"])["commonName"] == "client"
        with pytest.raises(Exception):  # noqa: B017 - nats-py surfaces several error types
            await nats_tls_connect(port, tls.client_context(str(pki.ca)))
    assert ("upgraded", False) in seen


async def test_tls_client_rejects_untrusted_server(pki):
    async with mini_server(tls_opts(pki)) as (port, _):
        with pytest.raises(Exception):  # noqa: B017
            await nats_tls_connect(port, tls.client_context(str(pki.other_ca)))


async def test_tls_plain_text_after_info_is_dropped(pki):
    """Like nats-server: a client that ignores tls_required gets disconnected."""
    async with mini_server(tls_opts(pki)) as (port, seen):
        reader, writer = await asyncio.open_connection(HOST, port)
        info = json.loads((await reader.readline())[5:])
        assert info["tls_required"] is True and "tls_verify" not in info
        writer.write(b"CONNECT {}\r\nPING\r\n")
        rest = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert b"PONG" not in rest
    assert ("line", b"CONNECT") not in seen


def test_tls_context_rules(pki):
    ctx = tls.server_context(tls_opts(pki, verify=True))
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert tls.server_context(tls_opts(pki)).verify_mode == ssl.CERT_NONE
    assert tls.listener_ssl(tls_opts(pki)) is None
    assert tls.listener_ssl(None) is None
    assert tls.info_fields(tls_opts(pki, verify=True)) == {"tls_required": True, "tls_verify": True}
    with pytest.raises(ValueError):
        tls.server_context(TLSOptions())


# ----------------------------------------------------------------------- differential


def make_nkey() -> tuple[str, str]:
    seed = nkeys.encode_seed(bytes(SigningKey.generate()), nkeys.PREFIX_BYTE_USER)
    return nkeys.from_seed(bytearray(seed)).public_key.decode(), seed.decode()


async def connect(port: int, **kw):
    errors: list[Exception] = []

    async def on_error(e: Exception) -> None:
        errors.append(e)

    nc = await nats.connect(f"nats://{HOST}:{port}", allow_reconnect=False, connect_timeout=10,
                            max_reconnect_attempts=0, error_cb=on_error, **kw)
    return nc, errors


async def refused(port: int, **kw) -> bool:
    try:
        nc, _ = await connect(port, **kw)
    except Exception:  # noqa: BLE001 - nats-py raises several types for a refused CONNECT
        return True
    await nc.close()
    return False


def raw_connect(port: int, connect: dict) -> list[str]:
    raw = Raw(port)
    try:
        raw.info()
        raw.send(f"CONNECT {json.dumps({'verbose': False, **connect})}\r\nPING\r\n")
        lines = []
        with contextlib.suppress(EOFError, OSError):
            while (line := raw.line()) != "PONG":
                lines.append(line)
            lines.append("PONG")
        return lines
    finally:
        raw.close()


@pytest.mark.parametrize("impl", IMPLS)
async def test_users_plain_and_bcrypt(impl, tmp_path):
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=6)).decode()
    users = [{"user": "alice", "password": "pw"}, {"user": "bob", "password": hashed}]
    with server(impl, tmp_path, f"authorization {{ users: {json.dumps(users)} }}\n") as port:
        assert Raw(port).info()["auth_required"] is True
        nc, _ = await connect(port, user="alice", password="pw")
        await nc.flush(timeout=5)
        await nc.close()
        nc, _ = await connect(port, user="bob", password="s3cret")
        await nc.close()
        assert await refused(port, user="alice", password="nope")
        assert await refused(port, user="bob", password=hashed)
        assert await refused(port)
        assert raw_connect(port, {"user": "x", "pass": "y"}) == ["-ERR 'Authorization Violation'"]
        assert raw_connect(port, {"user": "alice", "pass": "pw"}) == ["PONG"]


@pytest.mark.parametrize("impl", IMPLS)
async def test_token(impl, tmp_path):
    with server(impl, tmp_path, "authorization { token: t0ken }\n") as port:
        nc, _ = await connect(port, token="t0ken")
        await nc.close()
        assert await refused(port, token="wrong")
        assert raw_connect(port, {"auth_token": "t0ken"}) == ["PONG"]
        assert raw_connect(port, {"auth_token": "x"}) == ["-ERR 'Authorization Violation'"]


@pytest.mark.parametrize("impl", IMPLS)
async def test_nkey_users(impl, tmp_path):
    public, seed = make_nkey()
    _, other_seed = make_nkey()
    with server(impl, tmp_path, f"authorization {{ users: [{{nkey: {public}}}] }}\n") as port:
        info = Raw(port).info()
        assert info["auth_required"] is True and len(info["nonce"]) >= 11
        nc, _ = await connect(port, nkeys_seed_str=seed)
        await nc.flush(timeout=5)
        await nc.close()
        assert await refused(port, nkeys_seed_str=other_seed)


@pytest.mark.parametrize("impl", IMPLS)
async def test_nkey_user_beside_no_auth_user(impl, tmp_path):
    # Auth is optional here (no_auth_user), yet the nkey user still needs a nonce to sign.
    public, seed = make_nkey()
    body = (f"authorization {{ users: [{{user: anon, password: pw}}, {{nkey: {public}}}] }}\n"
            "no_auth_user: anon\n")
    with server(impl, tmp_path, body) as port:
        assert len(Raw(port).info()["nonce"]) >= 11
        nc, _ = await connect(port, nkeys_seed_str=seed)
        await nc.flush(timeout=5)
        await nc.close()


@pytest.mark.parametrize("impl", IMPLS)
async def test_auth_timeout(impl, tmp_path):
    with server(impl, tmp_path, "authorization { user: a, password: b, timeout: 0.5 }\n") as port:
        raw = Raw(port)
        raw.info()
        assert raw.line() == "-ERR 'Authentication Timeout'"
        with pytest.raises((EOFError, OSError)):
            raw.line()


@pytest.mark.parametrize("impl", IMPLS)
async def test_permissions_violations_reach_the_error_callback(impl, tmp_path):
    perms = {"publish": {"allow": ["ok.>", "_INBOX.>"], "deny": ["ok.secret"]},
             "subscribe": {"allow": ["_INBOX.>", "ok.>", "jobs q1"]}}
    users = [{"user": "u", "password": "p", "permissions": perms}]
    with server(impl, tmp_path, f"authorization {{ users: {json.dumps(users)} }}\n") as port:
        nc, errors = await connect(port, user="u", password="p")
        got = []

        async def on_msg(msg) -> None:
            got.append(msg.subject)

        sub = await nc.subscribe("ok.>", cb=on_msg)
        await nc.publish("ok.a", b"1")
        await nc.publish("ok.secret", b"2")
        await nc.publish("nope", b"3")
        await nc.subscribe("forbidden")
        await nc.subscribe("jobs", queue="q2")
        await nc.subscribe("jobs", queue="q1")
        await nc.flush(timeout=5)
        deadline = time.monotonic() + 10
        # unsubscribing drops a message whose callback has not run yet: wait for it too
        while (len(errors) < 4 or not got) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        texts = sorted(str(e).lower() for e in errors)
        await sub.unsubscribe()
        await nc.close()
    assert got == ["ok.a"]
    assert texts == sorted(t.lower() for t in [
        'nats: permissions violation for publish to "ok.secret"',
        'nats: permissions violation for publish to "nope"',
        'nats: permissions violation for subscription to "forbidden"',
        'nats: permissions violation for subscription to "jobs" using queue "q2"',
    ])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("first", [False, True], ids=["after-info", "handshake-first"])
async def test_tls_listener(impl, first, tmp_path, pki):
    body = (f"tls {{ cert_file: {json.dumps(str(pki.server_cert))}, "
            f"key_file: {json.dumps(str(pki.server_key))}, ca_file: {json.dumps(str(pki.ca))}, "
            f"verify: true, handshake_first: {str(first).lower()} }}\n")
    good = tls.client_context(str(pki.ca), str(pki.client_cert), str(pki.client_key))
    with server(impl, tmp_path, body) as port:
        nc = await nats_tls_connect(port, good, tls_handshake_first=first)
        await nc.flush(timeout=5)
        await nc.close()
        with pytest.raises(Exception):  # noqa: B017 - no client certificate
            nc = await nats_tls_connect(port, tls.client_context(str(pki.ca)),
                                        tls_handshake_first=first)
            await nc.flush(timeout=5)
