"""Message tracing across routes, against a 2-node nats-server 2.15 cluster.

A traced message (`Nats-Trace-Dest`, or a sampled `traceparent` with the account's
`msg_trace`) that a route carries to a peer gives, as nats-server does:
- on the publisher's node, an `eg` event of kind 1 (route) per peer, naming the
  peer and its `hop` ("1", "2", ...), and `hops` (the copies sent) in the document;
- on the peer, its own document: an `in` event of kind 1 naming the sender, its
  local egress, and the request headers with the `Nats-Trace-Hop` it came with
  (which the peer's subscribers see as well).

The same accounts config and the same nats-py script run against a nats-server
cluster and a jetraft cluster, each of two nodes named n1 and n2 in cluster `core`;
the documents (sorted by the node that sent them), the deliveries and the request
outcomes must be equal once the fields listed below are removed.

The same two clusters (started once for the module) also serve the accounts tests
that need routes: stream imports crossing a route, permissions on the traced path
across it, and `$SYS.REQ.SERVER.PING.<endpoint>` answered by every node.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from node.cluster.local import LocalCluster
from tests.msgtrace_support import EVENT_FIELDS, unordered_runs
from tests.ports import free_port

ACCOUNTS = """
system_account: SYS
accounts {
  SYS: { users: [{user: sys, password: sys}] }
  A: {
    users: [
      {user: a, password: a}
      {user: ad, password: ad, permissions: {subscribe: {allow: [">"], deny: ["deny.x"]}}}
      {user: pm, password: pm, permissions: {publish: {allow: ["old.>", "x.old", "trace.>"]}}}
    ]
    mappings: {"old.x": "x.old", "old.y": "x.mapped"}
    exports: [{service: "svc.>"}, {service: "tsvc.>", allow_trace: true}, {stream: "news.>"}
              {stream: "plain.>"}, {service: "news.svc.>"}]
    msg_trace: {dest: "trace.acc"}
  }
  B: {
    users: [
      {user: b, password: b}
      {user: bs, password: bs, permissions: {subscribe: {allow: [">"], deny: ["fa.news.deny"]}}}
    ]
    imports: [
      {service: {account: A, subject: "svc.>"}}, {service: {account: A, subject: "tsvc.>"}}
      {stream: {account: A, subject: "news.>"}, prefix: "fa", allow_trace: true}
      {stream: {account: A, subject: "plain.>"}}
      {service: {account: A, subject: "news.svc.>"}}
    ]
    mappings: {"m.in": "loc.mapped"}
  }
}
"""

# Removed before comparing, and why:
SERVER_FIELDS = ("host", "id", "ver", "seq", "time",  # per process / per release
                 "feature_flags")  # nats-server's, Jetraft's $SYS envelope has none
# nats-server adds Nats-Request-Info to a service-import request (not a tracing matter):
# removed from delivered headers and from the documents' request headers (and its
# line's size from their msgsize).
DELIVERED_HEADERS_IGNORED = ("Nats-Request-Info",)
# A `_R_.` subject (the trace destination an allow_trace service import gives the
# exporter's copy) is random: the value becomes RANDOM_R, its size comes off msgsize.
RANDOM_R = "_R_.<token>"

T = "Nats-Trace-Dest"
ONLY = "Nats-Trace-Only"
HOP = "Nats-Trace-Hop"
ORIGIN = "Nats-Trace-Origin-Account"
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # sampled
# (publisher, subject, headers, request?): publishers a1/b1 on n1, a2 on n2.
CASES: list[tuple[str, str, dict[str, str], bool]] = [
    ("a1", "x.1", {T: "trace.a", "Zed": "z"}, False),  # a subscriber on n2 only
    ("a1", "x.2", {T: "trace.a", ONLY: "true"}, False),  # trace-only: n2 traces, delivers none
    ("a1", "q.1", {T: "trace.a"}, False),  # queue group with its only member on n2
    ("a1", "both.1", {T: "trace.a"}, False),  # local egress and a route egress
    ("a2", "both.2", {T: "trace.a"}, False),  # published on n2: its document crosses back
    ("a1", "deny.x", {T: "trace.a"}, False),  # n2's subscriber may not receive it
    ("a1", "nobody.1", {T: "trace.a"}, False),  # no interest anywhere: no route egress
    ("a1", "x.3", {"traceparent": PARENT}, False),  # account msg_trace, sampled
    ("a1", "x.r", {T: "trace.a"}, True),  # request answered on n2
    ("a1", "x.r", {T: "trace.a", ONLY: "1"}, True),  # trace-only request: no answer
    ("b1", "m.in", {T: "trace.b"}, False),  # mapped on n1, delivered on n2
    ("b1", "svc.1", {T: "trace.b"}, True),  # service import: the trace stops at `si`
    ("b1", "tsvc.1", {T: "trace.b"}, True),  # allow_trace: n2's document comes back to B
    # A hop the publisher sets is not the origin's (hop "1"); the copy's replaces it in place.
    ("a1", "x.5", {T: "trace.a", HOP: "7"}, False),
    ("a1", "x.6", {HOP: "7", T: "trace.*"}, False),  # untraced: forwarded as it is
    # Naming the trace's account is a route's business: untraced, destination disabled.
    ("a1", "x.7", {T: "trace.a", ORIGIN: "B"}, False),
    ("a1", "both.3", {T: "trace.a", ORIGIN: "B", ONLY: "true"}, False),  # delivered to nobody
    ("a1", "x.8", {"traceparent": PARENT, ORIGIN: "A"}, False),
    # Publish permissions apply to the mapped subject, on the publisher's node.
    ("pm1", "old.x", {T: "trace.a"}, False),  # mapped to x.old (allowed): crosses to n2
    ("pm1", "old.y", {T: "trace.a"}, False),  # mapped to x.mapped (not allowed): refused
]


def _nats_server_cluster(tmp: Path) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    ports = [(free_port(), free_port(), free_port()) for _ in range(2)]
    routes = ", ".join(f'"nats-route://127.0.0.1:{c}"' for _, _, c in ports)
    procs = []
    for i, (p, h, c) in enumerate(ports):
        conf = tmp / f"ns{i + 1}.conf"
        conf.write_text(f"server_name: n{i + 1}\nlisten: 127.0.0.1:{p}\nhttp: 127.0.0.1:{h}\n"
                        f"cluster {{ name: core, listen: 127.0.0.1:{c}, routes: [{routes}] }}\n"
                        + ACCOUNTS)
        log = open(tmp / f"ns{i + 1}.log", "wb")  # noqa: SIM115 - the child owns it
        procs.append(subprocess.Popen(["nats-server", "-c", str(conf)], stdout=log,
                                      stderr=subprocess.STDOUT))
        log.close()
    deadline = time.monotonic() + 15
    while True:
        try:
            if all(_get(h, "/routez")["num_routes"] >= 1 for _, h, _ in ports):
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("nats-server cluster did not form")
        time.sleep(0.05)
    return procs, [f"nats://127.0.0.1:{p}" for p, _, _ in ports]


def _get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:  # noqa: S310
        return json.loads(r.read())


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[str]]]:
    if shutil.which("nats-server") is None:
        pytest.skip("nats-server not on PATH")
    tmp = tmp_path_factory.mktemp("rtrace")
    ours = LocalCluster(tmp / "jetraft", 2, name="core", jetstream=False,
                        extra_config=ACCOUNTS)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ours.start(wait=False)
        procs, oracle = _nats_server_cluster(tmp)
        for node in ours.nodes:
            ours.wait_ready(node)
        ours.wait_routes()
        yield {"nats-server": oracle, "jetraft": [n.url for n in ours.nodes]}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
        ours.stop()


def _strip(doc: dict[str, Any]) -> dict[str, Any]:
    out = dict(doc)
    out["request"] = _request(doc["request"])
    out["server"] = {k: v for k, v in doc["server"].items() if k not in SERVER_FIELDS}
    out["events"] = unordered_runs(
        [{k: v for k, v in ev.items() if k not in EVENT_FIELDS} for ev in doc["events"]])
    return out


def _request(request: dict[str, Any]) -> dict[str, Any]:
    size = request["msgsize"]
    header: dict[str, list[str]] = {}
    for key, values in request["header"].items():
        if key in DELIVERED_HEADERS_IGNORED:
            size -= sum(len(f"{key}: {v}\r\n") for v in values)
            continue
        header[key] = []
        for v in values:
            if v.startswith("_R_."):
                size -= len(v)
                v = RANDOM_R
            header[key].append(v)
    return {"header": header, "msgsize": size}


async def _script(urls: list[str]) -> list[dict[str, Any]]:
    conns: dict[str, nats.NATS] = {}
    for who, user, url in (("a1", "a", urls[0]), ("a2", "a", urls[1]), ("b1", "b", urls[0]),
                           ("b2", "b", urls[1]), ("ad2", "ad", urls[1]), ("pm1", "pm", urls[0])):
        conns[who] = await nats.connect(url, user=user, password=user, name=who,
                                        max_reconnect_attempts=0)
    traces: list[tuple[str, dict[str, Any]]] = []
    got: list[tuple[str, str, dict[str, str]]] = []

    async def on_trace(msg: Any) -> None:
        assert not msg.headers
        traces.append((msg.subject, json.loads(msg.data)))

    def deliver(who: str, answer: bool = False) -> Any:
        async def cb(msg: Any) -> None:
            headers = {k: RANDOM_R if v.startswith("_R_.") else v
                       for k, v in (msg.headers or {}).items()
                       if k not in DELIVERED_HEADERS_IGNORED}
            got.append((who, msg.subject, headers))
            if answer and msg.reply:
                await conns[who[:2]].publish(msg.reply, b"ok")
        return cb

    async def fence(msg: Any) -> None:
        await conns["a2" if msg.subject == "fence.a" else "b2"].publish(msg.reply, b"")

    a1, a2, b1, b2, ad2 = (conns[k] for k in ("a1", "a2", "b1", "b2", "ad2"))
    await a1.subscribe("trace.>", cb=on_trace)
    await b1.subscribe("trace.>", cb=on_trace)
    await a2.subscribe("x.>", cb=deliver("a2", answer=True))
    await a2.subscribe("q.>", queue="g", cb=deliver("a2q"))
    await a1.subscribe("both.>", cb=deliver("a1"))
    await a2.subscribe("both.>", cb=deliver("a2"))
    await ad2.subscribe("deny.>", cb=deliver("ad2"))
    await b2.subscribe("loc.>", cb=deliver("b2"))
    await a2.subscribe("svc.>", cb=deliver("a2s", answer=True))
    await a2.subscribe("tsvc.>", cb=deliver("a2t", answer=True))
    await a2.subscribe("fence.a", cb=fence)
    await b2.subscribe("fence.b", cb=fence)
    for nc in conns.values():
        await nc.flush()
    await _until_routed(a1, b1)

    results = []
    for who, subject, headers, request in CASES:
        traces.clear()
        got.clear()
        nc = conns[who]
        outcome = None
        if request:
            try:
                await nc.request(subject, b"hello", headers=headers, timeout=0.5)
                outcome = "reply"
            except nats.errors.NoRespondersError:
                outcome = "no responders"
            except nats.errors.TimeoutError:
                outcome = "timeout"
        else:
            await nc.publish(subject, b"hello", headers=headers)
        await nc.flush()
        # Everything n2 sends back comes before the answers to these requests (each
        # route keeps its order within an account), and n1's own document before that.
        await a1.request("fence.a", b"", timeout=5)
        await b1.request("fence.b", b"", timeout=5)
        await asyncio.sleep(0.05)
        docs = sorted(((s, _strip(d)) for s, d in traces),
                      key=lambda t: (t[1]["server"]["name"], json.dumps(t, sort_keys=True)))
        results.append({"case": [who, subject, headers, request], "outcome": outcome,
                        "delivered": sorted(got), "traces": docs})
    for nc in conns.values():
        await nc.close()
    return results


async def _until_answered(nc: nats.NATS, subject: str, deadline: float, timeout: float) -> None:
    """Requests until one is answered: interest crosses a route some time after SUB."""
    while True:
        try:
            await nc.request(subject, b"", timeout=timeout)
            return
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def _until_routed(a1: nats.NATS | None, b1: nats.NATS) -> None:
    """Until n2's subscriptions are known on n1 (both accounts, or B's only)."""
    deadline = time.monotonic() + 10
    for nc, subject in ((a1, "fence.a"), (b1, "fence.b")):
        if nc is None:
            continue
        await _until_answered(nc, subject, deadline, 0.5)
    await asyncio.sleep(0.2)  # the other subscriptions were announced with these


async def test_tracing_across_a_route_as_nats_server(clusters: dict[str, list[str]]) -> None:
    theirs = await _script(clusters["nats-server"])
    ours = await _script(clusters["jetraft"])
    for t, o in zip(theirs, ours, strict=True):
        assert o == t, f"case {t['case']}:\nnats-server {json.dumps(t, indent=1)}\n" \
                       f"jetraft {json.dumps(o, indent=1)}"
    # The oracle did cross the route: the comparison is not of empty documents.
    first = theirs[0]
    assert [d["server"]["name"] for _, d in first["traces"]] == ["n1", "n2"]
    assert first["traces"][0][1]["hops"] == 1
    assert first["delivered"] == [("a2", "x.1", {T: "trace.a", "Zed": "z",
                                                 "Nats-Trace-Hop": "1"})]
    refused = theirs[-1]  # pm1's old.y: refused on n1 for the mapped subject, nothing sent
    assert [[e["type"] for e in d["events"]] for _, d in refused["traces"]] == [["in", "sm"]]
    assert refused["traces"][0][1]["events"][0]["error"] == \
        'Permissions Violation for Publish to "x.mapped"' and refused["delivered"] == []


async def _queue_script(urls: list[str], n: int = 30) -> dict[str, Any]:
    """`n` traced messages to a queue group with one member on each node."""
    a1 = await nats.connect(urls[0], user="a", password="a", name="a1")
    a2 = await nats.connect(urls[1], user="a", password="a", name="a2")
    docs: dict[str, list[dict[str, Any]]] = {}
    got: dict[str, list[str]] = {"a1": [], "a2": []}

    async def on_trace(msg: Any) -> None:
        doc = json.loads(msg.data)
        docs.setdefault(doc["events"][0]["subj"], []).append(doc)

    def member(who: str) -> Any:
        async def cb(msg: Any) -> None:
            got[who].append(msg.subject)
        return cb

    await a1.subscribe("trace.q", cb=on_trace)
    await a1.subscribe("w.*", queue="w", cb=member("a1"))
    await a2.subscribe("w.*", queue="w", cb=member("a2"))
    async def fence(msg: Any) -> None:
        await a2.publish(msg.reply, b"")

    await a2.subscribe("fence.q", cb=fence)
    await a2.flush()
    await _until_routed_q(a1)
    for i in range(n):
        await a1.publish(f"w.{i}", b"x", headers={T: "trace.q"})
    await a1.flush()
    await a1.request("fence.q", b"", timeout=5)
    await asyncio.sleep(0.05)
    await a1.close()
    await a2.close()
    return {"docs": docs, "got": got}


async def _until_later_interest_routed(requester: nats.NATS, responder: nats.NATS) -> None:
    """Until a subscription `responder` (on n2) makes now, after the ones it made before, is
    known on `requester`'s node (n1) in the same account: a route announces an account's
    interest in order, so the earlier ones (and shadow ones for imports) are known too.
    Under load a fixed wait was not always enough."""
    subject = f"fence.{uuid.uuid4().hex}"

    async def answer(msg: Any) -> None:
        await responder.publish(msg.reply, b"")

    sub = await responder.subscribe(subject, cb=answer)
    await responder.flush()
    await _until_answered(requester, subject, time.monotonic() + 10, 1)
    await sub.unsubscribe()
    await responder.flush()


async def _until_routed_q(a1: nats.NATS) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            await a1.request("fence.q", b"", timeout=0.5)
            return
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def _served_by(docs: list[dict[str, Any]]) -> str:
    """Which node's member took the message, read from its documents alone."""
    by_node = {d["server"]["name"]: [(e["type"], e["kind"], e.get("queue"))
                                     for e in d["events"][1:]] for d in docs}
    if by_node == {"n1": [("eg", 0, "w")]}:
        return "a1"
    if by_node == {"n1": [("eg", 1, None)], "n2": [("eg", 0, "w")]}:
        return "a2"
    raise AssertionError(f"unexpected documents {docs}")


async def test_traced_queue_group_served_once_across_the_route(
        clusters: dict[str, list[str]]) -> None:
    """A traced message to a group with a member on each node reaches exactly one of
    them, both members get some, and the documents say which one (a local egress on
    n1, or a route egress on n1 and a queue egress on n2), as with nats-server."""
    for name, urls in clusters.items():
        out = await _queue_script(urls)
        got, docs = out["got"], out["docs"]
        assert sorted(got["a1"] + got["a2"]) == sorted(f"w.{i}" for i in range(30)), name
        assert got["a1"] and got["a2"], (name, got)
        assert len(docs) == 30, name
        for subject, ds in docs.items():
            who = _served_by(ds)
            assert subject in got[who], (name, subject, who, got)


# Stream imports across the route (publisher a1 on n1): nats-server forwards the
# message in the EXPORTER's account (A) and the peer applies B's imports, recording
# a `se` per B subscription it reaches (then its egress with allow_trace, naming the
# subscription in A's subjects; without allow_trace, `se` alone).
STREAM_CASES: list[tuple[str, dict[str, str]]] = [
    ("news.1", {T: "trace.a"}),  # B's only subscriber is on n2: n1 records no `se`
    ("news.two.x", {T: "trace.a"}),  # two B subscriptions on n2: two `se`
    ("plain.1", {T: "trace.a"}),  # import without allow_trace: n2 records `se` only
    ("news.1", {T: "trace.a", ONLY: "true"}),  # trace-only: n2 traces, delivers nothing
    ("plain.1", {T: "trace.a", ONLY: "true"}),
    ("news.both", {T: "trace.a"}),  # A and B subscribers on n2: ONE copy
    ("news.loc", {T: "trace.a"}),  # B subscribers on both nodes
    ("news.u", {}),  # untraced: each subscriber once
    ("news.p", {"traceparent": PARENT}),  # the account's msg_trace, sampled
    ("news.deny", {T: "trace.a"}),  # bs2 (B, on n2) may not receive it: egress error there
]


async def _stream_import_script(urls: list[str]) -> list[dict[str, Any]]:
    conns = {who: await nats.connect(url, user=who[:-1], password=who[:-1], name=who,
                                     max_reconnect_attempts=0)
             for who, url in (("a1", urls[0]), ("a2", urls[1]), ("b1", urls[0]),
                              ("b2", urls[1]), ("bs2", urls[1]))}
    a1, a2, b1, b2 = (conns[k] for k in ("a1", "a2", "b1", "b2"))
    docs: list[tuple[str, dict[str, Any]]] = []
    got: list[tuple[str, str, dict[str, str]]] = []

    def collect(acc: str) -> Any:
        async def cb(msg: Any) -> None:
            docs.append((acc, _strip(json.loads(msg.data))))
        return cb

    def deliver(who: str) -> Any:
        async def cb(msg: Any) -> None:
            got.append((who, msg.subject, dict(msg.headers or {})))
        return cb

    async def fence(msg: Any) -> None:
        await conns["a2" if msg.subject == "fence.a" else "b2"].publish(msg.reply, b"")

    await a1.subscribe("trace.>", cb=collect("A"))
    await b1.subscribe("trace.>", cb=collect("B"))  # nothing may arrive here
    await b2.subscribe("fa.news.>", cb=deliver("b2"))
    await b2.subscribe("fa.news.two.*", cb=deliver("b2two"))
    await b2.subscribe("plain.>", cb=deliver("b2p"))
    await conns["bs2"].subscribe("fa.news.>", cb=deliver("bs2"))
    await a2.subscribe("news.both", cb=deliver("a2"))
    await b1.subscribe("fa.news.loc", cb=deliver("b1"))
    await a2.subscribe("fence.a", cb=fence)
    await b2.subscribe("fence.b", cb=fence)
    for nc in conns.values():
        await nc.flush()
    await _until_routed(a1, b1)
    out = []
    for subject, headers in STREAM_CASES:
        docs.clear()
        got.clear()
        await a1.publish(subject, b"hello", headers=headers or None)
        await a1.flush()
        await a1.request("fence.a", b"", timeout=5)
        await b1.request("fence.b", b"", timeout=5)
        await asyncio.sleep(0.05)
        out.append({"case": [subject, headers], "delivered": sorted(got),
                    "traces": sorted(docs, key=lambda t: (t[1]["server"]["name"],
                                                          json.dumps(t, sort_keys=True)))})
    out.append(await _service_into_an_exporter(conns, got, docs))
    out.append(await _import_queue(conns))
    for nc in conns.values():
        await nc.close()
    return out


async def _service_into_an_exporter(conns: dict[str, nats.NATS], got: list[Any],
                                    docs: list[Any]) -> dict[str, Any]:
    """A request B's service import delivers into A on a subject A also exports as a
    stream to B, answered on n2: nats-server's n2 hands the copy to A's shadow
    subscriptions too, so B's stream subscribers there (b2, bs2) get it as well
    (on a single node nats-server does not: checked by hand; Jetraft neither)."""
    async def answer(msg: Any) -> None:
        got.append(("a2svc", msg.subject))
        await conns["a2"].publish(msg.reply, b"ok")

    sub = await conns["a2"].subscribe("news.svc.>", cb=answer)
    await conns["a2"].flush()
    await conns["b1"].request("fence.b", b"", timeout=5)
    await _until_later_interest_routed(conns["a1"], conns["a2"])
    await asyncio.sleep(0.3)  # a2's interest has crossed the route
    out = {}
    for subject, headers in (("news.svc.1", {}), ("news.svc.2", {T: "trace.a"})):
        got.clear()
        docs.clear()
        reply = await conns["b1"].request(subject, b"q", headers=headers or None, timeout=5)
        await conns["b1"].request("fence.b", b"", timeout=5)
        await asyncio.sleep(0.1)
        out[subject] = {"reply": reply.data.decode(), "delivered": sorted(
            (g[0], g[1]) for g in got)}
    await sub.unsubscribe()
    return out


async def _import_queue(conns: dict[str, nats.NATS], n: int = 30) -> dict[str, Any]:
    """`n` messages (every other one traced) to B's queue group with a member on each
    node, through the import: each reaches exactly one member, and B's plain
    subscriber on n2 gets every one."""
    got: dict[str, list[str]] = {"b1q": [], "b2q": [], "b2p": []}

    def member(who: str) -> Any:
        async def cb(msg: Any) -> None:
            got[who].append(msg.subject)
        return cb

    subs = [await conns["b1"].subscribe("plain.q.*", queue="g", cb=member("b1q")),
            await conns["b2"].subscribe("plain.q.*", queue="g", cb=member("b2q")),
            await conns["b2"].subscribe("plain.q.*", cb=member("b2p"))]
    for nc in conns.values():
        await nc.flush()
    await _until_later_interest_routed(conns["a1"], conns["a2"])  # B's shadow interest in A
    await asyncio.sleep(0.3)  # the new interest crosses the route
    for i in range(n):
        await conns["a1"].publish(f"plain.q.{i}", b"x", headers={T: "trace.q"} if i % 2 else None)
    await conns["a1"].flush()
    await conns["b1"].request("fence.b", b"", timeout=5)
    # Under load n2's deliveries to b2 come later than the B-account fence's answer (another
    # route connection and another client): until every message was taken once and b2's
    # plain subscriber has all (bounded; then what came is compared), then 0.1 s for extras.
    deadline = time.monotonic() + 10
    while (len(got["b1q"]) + len(got["b2q"]) < n or len(got["b2p"]) < n) and \
            time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)
    for sub in subs:
        await sub.unsubscribe()
    every = sorted(f"plain.q.{i}" for i in range(n))
    return {"once": sorted(got["b1q"] + got["b2q"]) == every,
            "both members": bool(got["b1q"] and got["b2q"]), "plain": sorted(got["b2p"]) == every}


async def test_stream_import_across_the_route_as_nats_server(
        clusters: dict[str, list[str]]) -> None:
    """A publish in A that reaches B's subscribers through a stream import crosses
    the route once, in A: the same documents (n2's with `in` in A, then `se` and B's
    egress), deliveries and headers as a nats-server cluster; queue groups in B are
    served once cluster-wide."""
    theirs = await _stream_import_script(clusters["nats-server"])
    ours = await _stream_import_script(clusters["jetraft"])
    for t, o in zip(theirs, ours, strict=True):
        assert o == t, f"case {t.get('case')}:\nnats-server {json.dumps(t, indent=1)}\n" \
                       f"jetraft {json.dumps(o, indent=1)}"
    assert theirs[-1] == {"once": True, "both members": True, "plain": True}
    assert theirs[-2]["news.svc.1"] == {"reply": "ok", "delivered": [
        ("a2svc", "news.svc.1"), ("b2", "fa.news.svc.1"), ("bs2", "fa.news.svc.1")]}
    # The oracle did what the cases claim: n2's document has the `se` and B's egress.
    n2 = [d for acc, d in theirs[0]["traces"] if d["server"]["name"] == "n2"]
    assert [e["type"] for e in n2[0]["events"]] == ["in", "se", "eg", "se", "eg"]  # b2, bs2
    assert n2[0]["events"][0]["acc"] == "A" and n2[0]["events"][2]["acc"] == "B"
    assert all(acc == "A" for r in theirs[:-2] for acc, _ in r["traces"])
    deny = [d for _, d in theirs[-3]["traces"] if d["server"]["name"] == "n2"][0]["events"]
    assert {"type": "eg", "kind": 0, "name": "bs2", "acc": "B", "sub": "news.>",
            "error": "Not delivered because subscription denies this subject"} in deny


async def _sys_script(urls: list[str]) -> dict[str, Any]:
    """`$SYS.REQ.SERVER.PING.<endpoint>` from n1: every node answers; then the
    id-addressed request for n2's VARZ, sent on n1, is answered by n2."""
    nc = await nats.connect(urls[0], user="sys", password="sys", max_reconnect_attempts=0)
    out: dict[str, Any] = {}
    ids: dict[str, str] = {}
    for endpoint in ("", ".VARZ", ".IDZ", ".STATSZ", ".SUBSZ"):
        inbox = nc.new_inbox()
        replies: list[dict[str, Any]] = []

        async def cb(msg: Any, replies: list[dict[str, Any]] = replies) -> None:
            replies.append(json.loads(msg.data))

        sub = await nc.subscribe(inbox, cb=cb)
        await nc.publish("$SYS.REQ.SERVER.PING" + endpoint, b"", reply=inbox)
        deadline = time.monotonic() + 3
        while len(replies) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # no third answer
        await sub.unsubscribe()
        for r in replies:
            srv = r.get("server", r)  # IDZ answers with the server block alone
            ids[srv["name"]] = srv["id"]
        # The answer's body: `data` (endpoints) or the rest of it (the bare PING's statsz).
        out[endpoint] = sorted((r.get("server", r)["name"],
                                sorted(r["data"] if "data" in r else set(r) - {"server"}))
                               for r in replies)
    r = json.loads((await nc.request(f"$SYS.REQ.SERVER.{ids['n2']}.VARZ", b"", timeout=3)).data)
    out["n2 by id"] = r["server"]["name"]
    await nc.close()
    return out


async def test_sys_ping_requests_are_answered_by_every_node_as_nats_server(
        clusters: dict[str, list[str]]) -> None:
    """`$SYS.REQ.SERVER.PING[.<endpoint>]` published on one node: one answer per
    node, each naming its server, as a nats-server cluster gives (the answers'
    `data` keys compared too); a request addressed to n2's id, sent on n1,
    is answered by n2."""
    theirs = await _sys_script(clusters["nats-server"])
    ours = await _sys_script(clusters["jetraft"])
    for key, answers in theirs.items():
        if not isinstance(answers, list):
            continue
        assert [name for name, _ in ours[key]] == [name for name, _ in answers] \
            == ["n1", "n2"], key
        for (_, our_keys), (_, their_keys) in zip(ours[key], answers, strict=True):
            assert set(our_keys) <= set(their_keys), (key, set(our_keys) - set(their_keys))
    assert ours.get("n2 by id") == theirs.get("n2 by id") == "n2"
