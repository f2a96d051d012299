"""The routing core: the account processes every publish, clients have a kind,
internal clients run from their own queue, and the module graph has no cycle.

In-process, with real `Server`/`Client` objects over a do-nothing transport
(the node's own code end to end, only the socket is absent)."""

from __future__ import annotations

import ast
import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

from node.account import GLOBAL_ACCOUNT, Account
from node.client import Client, Kind
from node.message import Message, Subscription
from node.options import Options, Permissions, User
from node.server import Server

ROOT = Path(__file__).resolve().parents[2]


class NullTransport:
    def __init__(self) -> None:
        self.sent = bytearray()

    def write(self, data: Any) -> None:
        self.sent += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        pass


def connect(server: Server, connect: bytes = b'{"verbose":false,"pedantic":false}') -> Client:
    c = server.make_client_protocol()
    c.connection_made(NullTransport())
    c.data_received(b"CONNECT " + connect + b"\r\n")
    c.flush()
    c.transport.sent.clear()
    return c


def received(c: Client) -> bytes:
    c.flush()
    out = bytes(c.transport.sent)
    c.transport.sent.clear()
    return out


class Recorder:
    """A stand-in subscriber that may refuse deliveries."""

    echo = True
    no_responders = False

    def __init__(self, accept: bool = True) -> None:
        self.accept = accept
        self.got: list[str] = []

    def deliver(self, sub: Subscription, msg: Message) -> bool:
        if self.accept:
            self.got.append(msg.subject)
        return self.accept


# ------------------------------------------------------------------------------- account


def test_a_queue_member_that_refuses_passes_the_message_on():
    account = Account(GLOBAL_ACCOUNT)
    refuses, takes = Recorder(accept=False), Recorder()
    account.subscribe(Subscription("jobs", "q", "1", refuses))
    account.subscribe(Subscription("jobs", "q", "2", takes))
    for _ in range(50):
        assert account.publish(None, "jobs", None, None, b"") == 1
    assert takes.got == ["jobs"] * 50


def test_refused_deliveries_are_not_counted_and_no_responders_answers():
    account = Account(GLOBAL_ACCOUNT)
    account.subscribe(Subscription("svc", None, "1", Recorder(accept=False)))

    class Requester(Recorder):
        no_responders = True
        answered: list[tuple[str, str]] = []

        def send_no_responders(self, subject: str, reply: str) -> None:
            self.answered.append((subject, reply))

    requester = Requester()
    assert account.publish(requester, "svc", "_INBOX.1", None, b"") == 0
    assert requester.answered == [("svc", "_INBOX.1")]


def test_interest_changes_are_announced():
    account = Account(GLOBAL_ACCOUNT)
    seen: list[tuple[str, int]] = []
    account.interest_listeners.append(lambda sub, delta: seen.append((sub.subject, delta)))
    a, b = Subscription("a", None, "1", Recorder()), Subscription("b", None, "2", Recorder())
    account.subscribe(a)
    account.subscribe(b)
    account.unsubscribe(a)
    account.unsubscribe(a)  # already gone: no second announcement
    account.unsubscribe_all([b])
    assert seen == [("a", 1), ("b", 1), ("a", -1), ("b", -1)]


async def test_fast_and_slow_paths_apply_the_same_delivery_rule():
    # A subscriber whose permissions deny the subject: on the single-subscriber fast
    # path and on the framed path alike, the publisher gets no-responders.
    perms = Permissions(subscribe_allow=[">"], subscribe_deny=["svc.secret"])
    server = Server(Options(users=[User("picky", "p", permissions=perms), User("req", "p")]))
    picky = connect(server, b'{"verbose":false,"pedantic":false,"user":"picky","pass":"p"}')
    picky.data_received(b"SUB svc.* 1\r\n")
    req = connect(server, b'{"verbose":false,"pedantic":false,"headers":true,'
                          b'"no_responders":true,"user":"req","pass":"p"}')
    req.data_received(b"SUB _INBOX.> 9\r\n")
    assert req.fast_account is req.account  # the fast path is what this PUB takes
    req.data_received(b"PUB svc.secret _INBOX.1 0\r\n\r\n")
    assert received(req).startswith(b"HMSG _INBOX.1 9 ") and received(picky) == b""
    req.data_received(b"HPUB svc.secret _INBOX.2 12 12\r\nNATS/1.0\r\n\r\n\r\n")
    assert received(req).startswith(b"HMSG _INBOX.2 9 ") and received(picky) == b""
    req.data_received(b"PUB svc.open _INBOX.3 0\r\n\r\n")
    assert received(picky) == b"MSG svc.open 1 _INBOX.3 0\r\n\r\n" and received(req) == b""


async def test_the_fast_path_sees_every_subscription_change():
    """The fast path reads the sublist's match cache itself (SubList.cached): after a
    subscriber leaves (one sub, or a client's batch) and another arrives, each PUB on
    that path reaches exactly who is subscribed then."""
    server = Server(Options())
    pub = connect(server)
    assert pub.fast_account is pub.account
    first = connect(server)
    first.data_received(b"SUB ev.1 1\r\n")
    pub.data_received(b"PUB ev.1 1\r\na\r\n" * 2)  # the second PUB is a cache hit
    assert received(first) == b"MSG ev.1 1 1\r\na\r\n" * 2
    first.close("bye")  # its subscriptions leave in one batch
    pub.data_received(b"PUB ev.1 1\r\nb\r\n")
    second = connect(server)
    second.data_received(b"SUB ev.* 7\r\n")
    pub.data_received(b"PUB ev.1 1\r\nc\r\n")
    assert received(second) == b"MSG ev.1 7 1\r\nc\r\n"
    second.data_received(b"UNSUB 7\r\n")
    pub.data_received(b"PUB ev.1 1\r\nd\r\n")
    assert received(second) == b""
    assert server.global_account.sublist.stats()["num_matches"] == 5


async def test_clients_live_in_their_identitys_account():
    server = Server(Options(users=[User("u", "p")]))
    c = connect(server, b'{"verbose":false,"user":"u","pass":"p"}')
    assert c.kind is Kind.CLIENT and c.identity.account == GLOBAL_ACCOUNT
    assert c.account is server.global_account
    c.data_received(b"SUB x 1\r\n")
    assert server.global_account.subscription_count() == 1
    c.close("bye")
    assert server.global_account.subscription_count() == 0


# ------------------------------------------------------------------------ internal clients


async def test_internal_clients_run_from_their_own_queue():
    server = Server(Options())
    calls: list[tuple[str, bytes]] = []
    server.subscribe_internal("svc", lambda sub, subj, reply, hdr, data: calls.append((subj, data)))
    pub = connect(server)
    pub.data_received(b"PUB svc 2\r\nhi\r\n")
    assert calls == []  # not on the publisher's stack
    await asyncio.sleep(0)
    assert calls == [("svc", b"hi")]
    system = server.system_client
    assert system.kind is Kind.SYSTEM and system.cid not in server.clients  # not in /connz


async def test_an_internal_handler_that_publishes_does_not_recurse():
    server = Server(Options())
    depth = [0, 0]  # current, deepest

    def handler(sub, subject, reply, headers, payload) -> None:
        depth[0] += 1
        depth[1] = max(depth[1], depth[0])
        n = int(payload)
        if n < 50:
            server.publish_internal("loop", None, b"%d" % (n + 1))
        depth[0] -= 1

    server.subscribe_internal("loop", handler)
    server.publish_internal("loop", None, b"0")
    for _ in range(60):
        await asyncio.sleep(0)
    assert depth[1] == 1  # each handler ran on its own, from the loop


async def test_internal_inbox_is_bounded(monkeypatch):
    from node import client as client_module

    monkeypatch.setattr(client_module, "INTERNAL_QUEUE_MAX", 3)
    server = Server(Options())
    got: list[bytes] = []
    server.subscribe_internal("b", lambda *a: got.append(a[4]))
    results = [server.publish_internal("b", None, b"%d" % i) for i in range(5)]
    assert results == [1, 1, 1, 0, 0] and server.system_client.dropped == 2
    await asyncio.sleep(0)
    assert got == [b"0", b"1", b"2"]


async def test_internal_client_kinds():
    server = Server(Options())
    js = server.internal_client(Kind.JETSTREAM, "jetstream")
    assert js.kind is Kind.JETSTREAM and js.account is server.global_account
    assert js.publish("nobody", None, b"") == 0


# ---------------------------------------------------------------------------- module graph


def _node_imports(module: str) -> set[str]:
    """node.* modules `module` imports, at run time or for type checking."""
    tree = ast.parse((ROOT / "node" / f"{module}.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("node"):
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("node"))
    return names


def test_client_and_monitor_do_not_import_the_server():
    for module in ("client", "monitor", "account", "message", "auth"):
        imports = _node_imports(module)
        assert "node.server" not in imports, (module, imports)
    assert "node.client" not in _node_imports("monitor")
    assert "node.client" not in _node_imports("account")


def test_importing_the_client_loads_no_server():
    code = "import sys, node.client, node.monitor; print('node.server' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"})
    assert out.stdout.strip() == "False", out.stderr
