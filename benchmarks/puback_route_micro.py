"""Instructions (or time) per PubAck on the core routing path, in process, for A/B of trees.

    MODE=leader|routed python benchmarks/puback_route_micro.py TREE N

`leader`: the JetStream internal client publishes N PubAcks (`_AB.<id>.<n>`, a new last token
each) into an account whose one match is a network client's `_AB.<id>.*` (real Server, Client,
Account, SubList; the socket is a do-nothing transport), with the account's routes holding 20
peers' `_INBOX.<x>.*` interest (a real RemoteInterest; only the cluster's send is a stub, it is
never reached). `routed`: the same PubAcks as a peer's frames arriving: `_framable` then
`Account.deliver_routed`. TREE goes first on sys.path, so the same script measures old and new
code. Instructions per PubAck, deterministic to well under 1 %:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python ... TREE 5000   (I1)
    valgrind ... TREE 25000                                                        (I2)
    (I2 - I1) / 20000

(docs/notes/ackroute.md: leader 50.3k -> 28.6k, routed 44.7k -> 21.2k.)"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

sys.path.insert(0, sys.argv[1])
N = int(sys.argv[2])
MODE = os.environ.get("MODE", "leader")

from node.client import Client, Kind  # noqa: E402
from node.cluster import service as svc  # noqa: E402
from node.cluster.interest import Change, RemoteInterest  # noqa: E402
from node.options import Options  # noqa: E402
from node.server import Server  # noqa: E402


class NullTransport:
    def __init__(self) -> None:
        self.n = 0

    def write(self, data: Any) -> None:
        self.n += len(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        pass


class StubCluster:
    """What AccountRoutes reads: the remote interest, and a send that counts."""

    def __init__(self) -> None:
        self.remote = RemoteInterest()
        self.links: dict[int, Any] = {}
        self.sent = 0

    def send_msg(self, targets: dict[int, list[str]], *_: Any) -> int:
        self.sent += 1
        return len(targets)


async def main() -> None:
    server = Server(Options())
    c = server.make_client_protocol()
    c.connection_made(NullTransport())
    c.data_received(b'CONNECT {"verbose":false,"pedantic":false}\r\n'
                    b"SUB _AB.0123456789.* 1\r\nSUB p.other 2\r\n")
    c.flush()
    acc = c.account
    cluster = StubCluster()
    for i in range(20):
        cluster.remote.apply(7, Change(acc.name, f"_INBOX.remote{i}.*", "", 1))
    acc.routes = svc.AccountRoutes(cluster, acc.name)  # type: ignore[arg-type]
    js = Client.internal(server, Kind.JETSTREAM, "js", account=acc)
    payload = b'{"stream":"P","seq":123456}'
    pub = svc.RoutePublisher(7)
    subjects = [f"_AB.0123456789.{i}" for i in range(N)]
    if MODE == "leader":
        publish = js.publish
        for i, s in enumerate(subjects):
            publish(s, None, payload)
            if i % 200 == 199:
                c.flush()
    else:
        framable = svc._framable
        deliver = acc.deliver_routed
        for i, s in enumerate(subjects):
            if framable(s, None, None, None):
                deliver(pub, s, None, None, payload, [], None)
            if i % 200 == 199:
                c.flush()
    c.flush()
    assert c.out_msgs >= N, c.out_msgs


asyncio.run(main())
