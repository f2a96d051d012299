"""tls { verify_and_map }: which user a client certificate names, checked
against nats-server with the same config and the same certificates (issue 7
review). Each user may publish only to its own `who.<tag>`, so the subjects a
client may publish to say which user it became."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl

import pytest

from tests.integration.test_security import HOST

pytestmark = pytest.mark.timeout(180)

TAGS = ["dns", "uri", "es", "esdn", "wsonly", "fallback", "comma", "bob", "anon", "someone",
        "multi", "pw", "acct"]

USERS = [
    {"user": "dnsuser", "tag": "dns"},
    {"user": "spiffe://acme/uri", "tag": "uri"},
    {"user": "es@example.com", "tag": "es"},
    {"user": "CN=es, emailAddress=es@example.com", "tag": "esdn"},
    {"user": "wsonly@example.com", "tag": "wsonly", "allowed_connection_types": ["WEBSOCKET"]},
    {"user": "CN=fallback", "tag": "fallback"},
    {"user": "CN=a\\,b", "tag": "comma"},
    {"user": "O=Acme, CN=bob", "tag": "bob"},
    {"user": "CN=multi, OU=x+OU=y", "tag": "multi"},
    {"user": "anon", "password": "pw", "tag": "anon"},
    {"user": "someone", "password": "pw", "tag": "someone"},
    {"user": "CN=pwuser", "password": "secret", "tag": "pw"},
]

# name -> (openssl -subj, extensions)
CERTS = {
    "dns": ("/CN=dns", "subjectAltName=DNS:dnsuser\n"),
    "uri": ("/CN=uri", "subjectAltName=URI:spiffe://acme/uri\n"),
    "esubj": ("/CN=es/emailAddress=es@example.com", ""),
    "multi_san": ("/CN=fallback", "subjectAltName=email:wsonly@example.com\n"),
    "comma": ("/CN=a\\,b", ""),
    "bob": ("/O=Acme/CN=bob", ""),
    "plusrdn": ("/OU=y+OU=x/CN=multi", ""),
    "nobody": ("/CN=nobody", ""),
    "pwcert": ("/CN=pwuser", ""),
    "acct": ("/CN=acct", ""),
}


def user_block(no_auth: bool) -> str:
    users = []
    for u in USERS:
        entry = {k: v for k, v in u.items() if k != "tag"}
        entry["permissions"] = {"publish": [f"who.{u['tag']}"], "subscribe": ["_INBOX.>"]}
        users.append(entry)
    extra = "no_auth_user: anon\n" if no_auth else ""
    # a user of a named account is mapped like the others
    acct = {"user": "CN=acct", "permissions": {"publish": ["who.acct"],
                                               "subscribe": ["_INBOX.>"]}}
    return (f"authorization {{ users: {json.dumps(users)} }}\n{extra}"
            f"accounts {{ X {{ users: [{json.dumps(acct)}] }} }}\n")


@pytest.fixture(scope="module")
def map_pki(tmp_path_factory):
    from tests import certs

    if not certs.available():
        pytest.skip("openssl CLI not installed")
    d = tmp_path_factory.mktemp("mappki")
    pki = certs.make_pki(d)
    for name, (subj, ext) in CERTS.items():
        (d / f"{name}.ext").write_text("extendedKeyUsage=clientAuth\n" + ext)
        certs._run("req", *certs._EC_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                   "-subj", subj, cwd=d)
        certs._run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                   "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
                   "-extfile", f"{name}.ext", cwd=d)
    return pki


def outcome(port: int, ctx: ssl.SSLContext, creds: dict) -> str:
    """'refused', or the tags this client may publish to."""
    with socket.create_connection((HOST, port), timeout=10) as raw:
        buf = b""
        while b"\r\n" not in buf:
            buf += raw.recv(4096)
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            connect = {"verbose": False, "pedantic": False, **creds}
            out = b"CONNECT " + json.dumps(connect).encode() + b"\r\n"
            out += b"".join(f"PUB who.{t} 0\r\n\r\n".encode() for t in TAGS) + b"PING\r\n"
            s.sendall(out)
            got = b""
            try:
                while not got.endswith(b"PONG\r\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    got += chunk
            except (OSError, ssl.SSLError):
                pass
    text = got.decode(errors="replace")
    if "Authorization Violation" in text or "PONG" not in text:
        return "refused"
    allowed = [t for t in TAGS if f'Publish to "who.{t}"' not in text]
    return ",".join(allowed)


CASES = [  # (certificate, CONNECT credentials)
    ("dns", {}), ("uri", {}), ("esubj", {}), ("multi_san", {}), ("comma", {}), ("bob", {}),
    ("plusrdn", {}), ("nobody", {}), ("nobody", {"user": "someone", "pass": "pw"}),
    ("bob", {"user": "someone", "pass": "pw"}), ("bob", {"user": "O=Acme, CN=bob"}),
    ("bob", {"user": "someone"}),  # the certificate names the user; the CONNECT's is ignored
    ("pwcert", {}), ("pwcert", {"pass": "secret"}), ("pwcert", {"pass": "nope"}),
    ("pwcert", {"user": "someone", "pass": "secret"}), ("acct", {}),
]


@pytest.mark.parametrize("no_auth", [False, True], ids=["users", "no_auth_user"])
def test_verify_and_map_picks_the_user_nats_server_picks(servers, map_pki, no_auth):
    from node import tls

    pki = map_pki
    d = pki.ca.parent
    config = (f"tls {{ cert_file: {json.dumps(str(pki.server_cert))}, "
              f"key_file: {json.dumps(str(pki.server_key))}, ca_file: {json.dumps(str(pki.ca))}, "
              f"verify_and_map: true, timeout: 5 }}\n" + user_block(no_auth))
    results: dict[str, list[str]] = {}
    for impl, srv in servers.both(config).items():
        results[impl] = []
        for cert, creds in CASES:
            ctx = tls.client_context(str(pki.ca), str(d / f"{cert}.pem"), str(d / f"{cert}.key"))
            results[impl].append(f"{cert} {creds}: {outcome(srv.port, ctx, creds)}")
    assert results["jetraft"] == results["nats-server"]


async def test_websocket_clients_do_not_use_the_client_port_certificate_map(servers, map_pki):
    """nats-server maps WebSocket clients by websocket { tls { verify_and_map } }
    only: the client port's setting leaves their user/password login alone."""
    import websockets

    from tests.ports import free_port

    pki = map_pki
    results = {}
    for impl in ("nats-server", "jetraft"):
        wport = free_port()
        config = (f"tls {{ cert_file: {json.dumps(str(pki.server_cert))}, "
                  f"key_file: {json.dumps(str(pki.server_key))}, "
                  f"ca_file: {json.dumps(str(pki.ca))}, verify_and_map: true, timeout: 5 }}\n"
                  f'websocket {{ listen: "{HOST}:{wport}", no_tls: true }}\n' + user_block(False))
        srv = servers.nats_server(config) if impl == "nats-server" else servers.jetraft(config)
        assert srv.port
        got = []
        for creds in ({"user": "someone", "pass": "pw"}, {"user": "someone", "pass": "no"}, {}):
            async with websockets.connect(f"ws://{HOST}:{wport}") as ws:
                await ws.recv()  # INFO
                connect = {"verbose": False, "pedantic": False, **creds}
                await ws.send(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
                text = b""
                try:
                    while b"PONG" not in text and b"-ERR" not in text:
                        text += await asyncio.wait_for(ws.recv(), 10)
                except (websockets.ConnectionClosed, TimeoutError):
                    pass
                got.append("PONG" if b"PONG" in text else text.decode(errors="replace").strip())
        results[impl] = got
    assert results["jetraft"] == results["nats-server"]
    assert results["jetraft"][0] == "PONG"


# --------------------------------------------------------------------------- pinned_certs reload


@pytest.mark.parametrize("impl", ["nats-server", "jetraft"])
async def test_a_reload_that_unpins_a_key_closes_its_clients(servers, map_pki, impl):
    """nats-server's recheckPinnedCerts: after a reload, a connected client
    whose certificate key the new pinned_certs leaves out is closed."""
    import signal

    import nats

    from node import tls
    from tests.integration.test_security_defects import openssl_spki_pin

    pki = map_pki
    d = pki.ca.parent

    def config(pinned: list[str]) -> str:
        pins = json.dumps([openssl_spki_pin(d / f"{n}.pem") for n in pinned])
        return (f"tls {{ cert_file: {json.dumps(str(pki.server_cert))}, "
                f"key_file: {json.dumps(str(pki.server_key))}, "
                f"ca_file: {json.dumps(str(pki.ca))}, verify: true, timeout: 5, "
                f"pinned_certs: {pins} }}\n")

    start = servers.nats_server if impl == "nats-server" else servers.jetraft
    srv = start(config(["bob", "dns"]))
    clients = {}
    for name in ("bob", "dns"):
        ctx = tls.client_context(str(pki.ca), str(d / f"{name}.pem"), str(d / f"{name}.key"))
        clients[name] = await nats.connect(srv.url, tls=ctx, allow_reconnect=False,
                                           connect_timeout=10, max_reconnect_attempts=0)
    (srv.workdir / f"{srv.name}-{srv.port}.conf").write_text(config(["dns"]))
    srv.send_signal(signal.SIGHUP)
    deadline = asyncio.get_running_loop().time() + 30
    while not clients["bob"].is_closed:
        assert asyncio.get_running_loop().time() < deadline, "the unpinned client stayed"
        await asyncio.sleep(0.05)
    await clients["dns"].flush(timeout=10)  # still pinned: still served
    await clients["dns"].close()
