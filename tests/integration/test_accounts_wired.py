"""Named accounts as the node enforces them, against nats-server 2.15 with the
same config and real nats-py clients: isolation, stream and service imports
with replies across accounts, no_auth_user and nkey users inside an account,
per-user permissions, subject mappings and account limits.

Every test takes both servers' observations and asserts they are equal, plus
the outcome nats-server gives (so a test fails even if both were wrong alike).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any

import bcrypt
import nats
import nkeys
import pytest

USER_SEED = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
USER_PUB = nkeys.from_seed(USER_SEED).public_key.decode()
STRANGER_SEED = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
HASH = bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()

CONFIG = f"""
accounts {{
  A: {{
    users: [{{user: a, password: a}}, {{user: abc, password: "{HASH}"}}]
    exports: [
      {{stream: "news.>"}}, {{stream: "priv.>", accounts: [B]}}
      {{service: "help.*"}}, {{service: "many", response_type: stream}}, {{service: "one"}}
      {{service: "chunks", response_type: chunked}}
    ]
    mappings: {{ "amap.*": "amapped.$1" }}
  }}
  B: {{
    users: [
      {{user: b, password: b}}, {{nkey: {USER_PUB}}}
      {{user: rb, password: rb, permissions: {{publish: "ok.>", subscribe: ">"}}}}
      {{user: resp, password: resp,
        permissions: {{subscribe: "req.>", publish: {{deny: ">"}}, allow_responses: true}}}}
    ]
    imports: [
      {{stream: {{account: A, subject: "news.>"}}, prefix: "from_a"}}
      {{stream: {{account: A, subject: "priv.>"}}}}
      {{service: {{account: A, subject: "help.*"}}, to: "ask.*"}}
      {{service: {{account: A, subject: "many"}}}}
      {{service: {{account: A, subject: "one"}}}}
      {{service: {{account: A, subject: "chunks"}}}}
    ]
  }}
  C: {{
    users: [{{user: c, password: c}}]
    limits: {{max_connections: 2, max_subscriptions: 3, max_payload: 64}}
  }}
  D: {{ users: [{{user: d, password: d}}] }}
}}
authorization {{ users: [{{user: g, password: g}}] }}
mappings: {{
  "gmap": "gmapped"
  "w": [{{destination: "w.a", weight: 60%}}, {{destination: "w.b", weight: 40%}}]
}}
no_auth_user: b
"""

IMPLS = ["nats-server", "jetraft"]


@pytest.fixture(scope="module")
def both(module_servers) -> dict[str, Any]:
    return module_servers.both(CONFIG)


def _url(server: Any, user: str | None = None) -> str:
    creds = f"{user}:{user}@" if user else ""
    return f"nats://{creds}127.0.0.1:{server.port}"


async def _connect(server: Any, user: str | None = None, **kw: Any) -> Any:
    return await nats.connect(_url(server, user), allow_reconnect=False,
                              max_reconnect_attempts=0, **kw)


async def _settle(*ncs: Any) -> None:
    for nc in ncs:
        await nc.flush()
    await asyncio.sleep(0.05)  # deliveries to other connections


def _into(out: list[str], data: bool = False) -> Any:
    """A nats-py callback appending each message's subject (or data) to `out`."""
    async def cb(msg: Any) -> None:
        out.append(msg.data.decode() if data else msg.subject)
    return cb


def _each(both: dict[str, Any], scenario: Any) -> dict[str, Any]:
    return {name: asyncio.run(scenario(both[name])) for name in IMPLS}


# ---------------------------------------------------------------------- isolation

async def _isolation(server: Any) -> dict[str, list[str]]:
    users = ["a", "b", "c", "g"]
    conns = {u: await _connect(server, u) for u in users}
    got: dict[str, list[str]] = {u: [] for u in users}
    for u, nc in conns.items():
        await nc.subscribe("same", cb=_into(got[u], data=True))
    await _settle(*conns.values())
    for u, nc in conns.items():
        await nc.publish("same", u.encode())
    await _settle(*conns.values())
    for nc in conns.values():
        await nc.close()
    return {u: sorted(v) for u, v in got.items()}


def test_accounts_isolate_the_same_subject(both) -> None:
    seen = _each(both, _isolation)
    assert seen["jetraft"] == seen["nats-server"]
    assert seen["nats-server"] == {"a": ["a"], "b": ["b"], "c": ["c"], "g": ["g"]}


# ---------------------------------------------------------------------- stream imports

async def _streams(server: Any) -> dict[str, list[str]]:
    pub = await _connect(server, "a")
    subs = {u: await _connect(server, u) for u in ("b", "c", "d")}
    got: dict[str, list[str]] = {u: [] for u in subs}
    for u, nc in subs.items():
        await nc.subscribe(">", cb=_into(got[u]))
    await _settle(*subs.values())
    for subject in ("news.x", "news.y.z", "priv.p", "other", "from_a.news.x"):
        await pub.publish(subject, b"x")
    await _settle(pub, *subs.values())
    for nc in (pub, *subs.values()):
        await nc.close()
    return {u: sorted(v) for u, v in got.items()}


def test_stream_imports_prefix_and_private_exports(both) -> None:
    seen = _each(both, _streams)
    assert seen["jetraft"] == seen["nats-server"]
    assert seen["nats-server"]["b"] == ["from_a.news.x", "from_a.news.y.z", "priv.p"]
    assert seen["nats-server"]["c"] == seen["nats-server"]["d"] == []


# ---------------------------------------------------------------------- service imports

async def _oracle_tolerant_request(server: Any, nc: Any, subject: str) -> str:
    """A request's reply. On a loaded machine nats-server 2.15 answered the first request
    to a responder subscribed (and flushed) a moment before with no responders, 4 times
    in 60 at load 22, the next request to it was served: nats-server gets three tries.
    Jetraft gets one (never seen there: 0 in 40 at the same load)."""
    tries = 3 if server.name == "nats-server" else 1
    for attempt in range(tries):
        try:
            return (await nc.request(subject, b"", timeout=5)).data.decode()
        except nats.errors.NoRespondersError:
            if attempt + 1 == tries:
                raise
            await asyncio.sleep(0.2)
    raise AssertionError("unreachable")


async def _services(server: Any) -> dict[str, Any]:
    srv = await _connect(server, "a")
    served: list[str] = []

    async def serve(msg: Any) -> None:
        served.append(msg.subject)
        await srv.publish(msg.reply, b"re:" + msg.subject.encode())

    await srv.subscribe("help.*", cb=serve)
    await srv.flush()
    out: dict[str, Any] = {}
    for user, subject in (("b", "ask.q"), ("b", "help.q"), ("d", "ask.q"), ("d", "help.q"),
                          (None, "ask.z")):
        nc = await _connect(server, user)
        try:
            out[f"{user}:{subject}"] = await _oracle_tolerant_request(server, nc, subject)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError) as err:
            out[f"{user}:{subject}"] = type(err).__name__
        await nc.close()
    out["served"] = sorted(served)
    await srv.close()
    return out


def test_service_imports_route_requests_and_replies_across_accounts(both) -> None:
    seen = _each(both, _services)
    assert seen["jetraft"] == seen["nats-server"]
    assert seen["nats-server"]["b:ask.q"] == "re:help.q"  # remapped, reply came back
    assert seen["nats-server"]["None:ask.z"] == "re:help.z"  # no_auth_user lands in B
    assert seen["nats-server"]["d:ask.q"] == "NoRespondersError"  # D imports nothing


async def _response_types(server: Any) -> dict[str, int]:
    srv = await _connect(server, "a")
    served: list[str] = []

    async def triple(msg: Any) -> None:
        for i in range(3):
            await srv.publish(msg.reply, str(i).encode())
        await srv.flush()  # the server has taken all three
        served.append(msg.subject)

    await srv.subscribe("many", cb=triple)
    await srv.subscribe("one", cb=triple)
    await srv.subscribe("chunks", cb=triple)
    await srv.flush()
    req = await _connect(server, "b")
    out = {}
    for subject in ("many", "one", "chunks"):
        inbox = req.new_inbox()
        sub = await req.subscribe(inbox)
        await req.publish(subject, b"", reply=inbox)
        # until the service sent its replies (a fixed wait fell short on a loaded machine),
        # then a round trip on req: whatever the server let through is in req's buffer
        async with asyncio.timeout(10):
            while subject not in served:
                await asyncio.sleep(0.02)
        await req.flush()
        out[subject] = sub.pending_msgs
        await sub.unsubscribe()
    await req.close()
    await srv.close()
    return out


def test_service_response_types_bound_the_replies(both) -> None:
    seen = _each(both, _response_types)
    assert seen["jetraft"] == seen["nats-server"] == {"many": 3, "one": 1, "chunks": 3}


# ---------------------------------------------------------------------- login into accounts

async def _logins(server: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    probe = await _connect(server, "b")
    got: list[str] = []
    await probe.subscribe("who", cb=_into(got, data=True))
    await probe.flush()
    cases = {
        "nkey": {"nkeys_seed_str": USER_SEED.decode()},
        "stranger": {"nkeys_seed_str": STRANGER_SEED.decode()},
        "bcrypt": {"user": "abc", "password": "secret"},
        "bad-pass": {"user": "a", "password": "nope"},
        "anonymous": {},
    }
    for name, kw in cases.items():
        try:
            nc = await nats.connect(_url(server), allow_reconnect=False,
                                    max_reconnect_attempts=0, **kw)
        except Exception as err:  # noqa: BLE001 - the error is the observation
            out[name] = "Authorization Violation" in str(err) and "refused" or repr(err)
            continue
        await nc.publish("who", name.encode())
        await nc.flush()
        out[name] = "in"
        await nc.close()
    await _settle(probe)
    out["seen_in_B"] = sorted(got)
    await probe.close()
    return out


def test_nkey_bcrypt_and_no_auth_users_log_into_their_account(both) -> None:
    seen = _each(both, _logins)
    assert seen["jetraft"] == seen["nats-server"]
    assert seen["nats-server"] == {
        "nkey": "in", "stranger": "refused", "bcrypt": "in", "bad-pass": "refused",
        "anonymous": "in", "seen_in_B": ["anonymous", "nkey"]}


async def _permissions(server: Any) -> dict[str, Any]:
    errors: list[str] = []

    async def on_error(err: Exception) -> None:
        errors.append(str(err))

    nc = await _connect(server, "rb", error_cb=on_error)
    await nc.publish("nope", b"")
    await nc.publish("ok.fine", b"")
    await _settle(nc)
    await nc.close()
    resp = await _connect(server, "resp", error_cb=on_error)
    asker = await _connect(server, "b")

    async def answer(msg: Any) -> None:
        await resp.publish(msg.reply, b"yes")
        await resp.publish("req.other", b"")  # not a reply: denied

    await resp.subscribe("req.>", cb=answer)
    await resp.flush()
    reply = await _oracle_tolerant_request(server, asker, "req.x")
    await _settle(resp)
    await resp.close()
    await asker.close()
    return {"reply": reply, "errors": sorted(e.lower() for e in errors)}


def test_user_permissions_and_allow_responses_inside_an_account(both) -> None:
    seen = _each(both, _permissions)
    assert seen["jetraft"] == seen["nats-server"]
    assert seen["nats-server"]["reply"] == "yes"
    assert len(seen["nats-server"]["errors"]) == 2


# ---------------------------------------------------------------------- mappings

async def _mappings(server: Any) -> dict[str, Any]:
    a, g = await _connect(server, "a"), await _connect(server, "g")
    got: dict[str, list[str]] = {"a": [], "g": []}
    await a.subscribe(">", cb=_into(got["a"]))
    await g.subscribe(">", cb=_into(got["g"]))
    await _settle(a, g)
    await a.publish("amap.x", b"")
    await a.publish("gmap", b"")
    await g.publish("gmap", b"")
    await g.publish("amap.x", b"")
    await _settle(a, g)
    fixed = {k: sorted(v) for k, v in got.items()}
    got["g"].clear()
    n = 2000
    for _ in range(n):
        await g.publish("w", b"")
    await g.flush()
    deadline = time.monotonic() + 10
    while len(got["g"]) < n and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await a.close()
    await g.close()
    return {"fixed": fixed, "w.a": got["g"].count("w.a"), "w.b": got["g"].count("w.b")}


def test_mappings_top_level_per_account_and_weighted(both) -> None:
    seen = _each(both, _mappings)
    assert seen["jetraft"]["fixed"] == seen["nats-server"]["fixed"] == {
        "a": ["amapped.x", "gmap"], "g": ["amap.x", "gmapped"]}
    sigma = (2000 * 0.6 * 0.4) ** 0.5
    for name in IMPLS:
        assert seen[name]["w.a"] + seen[name]["w.b"] == 2000
        assert abs(seen[name]["w.a"] - 1200) < 5 * sigma, (name, seen[name])


# ---------------------------------------------------------------------- limits

def _raw(port: int, lines: bytes, wait: float = 0.4) -> tuple[socket.socket, bytes]:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.recv(65536)  # INFO
    s.sendall(lines)
    time.sleep(wait)
    s.settimeout(0.5)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except TimeoutError:
        pass
    return s, out


def _limits(server: Any) -> list[bytes]:
    login = b'CONNECT {"user":"c","pass":"c","verbose":true}\r\n'
    s1, out1 = _raw(server.port, login + b"SUB a 1\r\nSUB b 2\r\nSUB c 3\r\nSUB d 4\r\n"
                    b"PUB x 64\r\n" + b"y" * 64 + b"\r\nPING\r\n")
    s2, out2 = _raw(server.port, login + b"PING\r\n")
    s3, out3 = _raw(server.port, login + b"PING\r\n")
    s1.sendall(b"PUB x 65\r\n" + b"y" * 65 + b"\r\n")
    time.sleep(0.3)
    out5 = s1.recv(65536)
    for s in (s1, s2, s3):
        s.close()
    # A server's own keep-alive PING may land in the window; it is not what we compare.
    return [o.replace(b"PING\r\n", b"") for o in (out1, out2, out3, out5)]


def test_account_limits_give_nats_servers_errors(both) -> None:
    seen = {name: _limits(both[name]) for name in IMPLS}
    assert seen["jetraft"] == seen["nats-server"]
    out1, out2, out3, out5 = seen["nats-server"]
    assert out1.count(b"+OK") == 5 and b"-ERR 'maximum subscriptions exceeded'" in out1
    assert out3 == b"-ERR 'maximum account active connections exceeded'\r\n"
    assert out5 == b"-ERR 'Maximum Payload Violation'\r\n"
