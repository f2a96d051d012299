"""Message tracing (`Nats-Trace-Dest`, `Nats-Trace-Only`) against nats-server 2.15.

The same accounts config (a mapping, a service import, a stream import) and the
same nats-py script run against nats-server and `jetraft serve`. For each traced
publish the test records what the subscribers received, the -ERRs the publisher
got, and the trace document(s) on the trace destination; both servers must give
the same after the fields that cannot agree are removed (listed below).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats
import pytest

from node import msgtrace
from node.accountconf import parse_accounts_config
from node.config import ConfigError, parse_config
from tests.msgtrace_support import EVENT_FIELDS, run_cases, strip_document

CONFIG = """
accounts {
  A: {
    users: [
      {user: a, password: a}
      {user: ar, password: ar, permissions: {publish: {deny: ["trace.denied", "denied.>"]}}}
      {user: as, password: as, permissions: {subscribe: {allow: [">"], deny: ["deny.x"]}}}
    ]
    exports: [{stream: "news.>"}, {service: "svc.>"}]
  }
  B: {
    users: [{user: b, password: b}]
    imports: [
      {stream: {account: A, subject: "news.>"}, prefix: "fa"}
      {service: {account: A, subject: "svc.>"}}
    ]
    mappings: {"m.in": "svc.mapped", "loc.in": "local.mapped"}
  }
  # Imports news.> but nobody subscribes in C: nats-server records no `se` for it (a
  # `se` comes with each importer subscription the message reaches).
  C: { imports: [{stream: {account: A, subject: "news.>"}, prefix: "fc"}] }
}
"""

# Fields that legitimately differ between the two servers, removed before comparing.
SERVER_FIELDS = ("name", "host", "id", "ver", "seq", "time",
                 # nats-server 2.15 adds feature flags to every $SYS server block;
                 # Jetraft's $SYS envelope (node/sysaccount.py) has none.
                 "feature_flags")
# Jetraft does not add nats-server's Nats-Request-Info to service-import requests
# (a service-import gap, not a tracing one).
DELIVERED_HEADERS_IGNORED = ("Nats-Request-Info",)

T = "Nats-Trace-Dest"
ONLY = "Nats-Trace-Only"
# (user, subject, headers, request?)
CASES: list[tuple[str, str, dict[str, str], bool]] = [
    ("a", "news.1", {T: "trace.a"}, False),  # local egress + stream export
    ("a", "news.2", {T: "trace.a", ONLY: "true"}, False),  # trace only: nobody gets it
    ("a", "news.3", {T: "trace.a", ONLY: "1"}, False),
    ("a", "news.4", {T: "trace.a", ONLY: "ON"}, False),
    ("a", "news.5", {T: "trace.a", ONLY: "yes"}, False),  # not a trace-only value
    ("b", "m.in", {T: "trace.b"}, True),  # mapping + service import
    ("b", "svc.x", {T: "trace.b", ONLY: "true"}, True),  # trace-only request: no reply
    ("b", "loc.in", {T: "trace.b"}, False),  # mapping + local egress
    ("b", "local.r", {T: "trace.b", ONLY: "true"}, True),  # trace-only request, local responder
    ("b", "local.s", {T: "trace.b"}, True),  # traced request answered
    ("b", "nobody", {T: "trace.b"}, True),  # no interest: no-responders, ingress only
    ("a", "q.1", {T: "trace.a"}, False),  # queue group + no-echo subscriber
    ("as", "deny.x", {T: "trace.a"}, False),  # subscriber may not receive it
    ("ar", "denied.x", {T: "trace.a"}, False),  # publish denied: ingress error event
    ("ar", "news.6", {T: "trace.denied"}, False),  # destination denied: message refused
    ("ar", "news.7", {T: "trace.denied", ONLY: "true"}, False),
    ("a", "news.8", {"nats-trace-dest": "trace.a"}, False),  # header name is exact
    ("a", "news.9", {T: "trace.*"}, False),  # not a literal subject: untraced
    ("a", "news.10", {T: "bad subject"}, False),
]


def _strip(doc: dict[str, Any]) -> dict[str, Any]:
    return strip_document(doc, SERVER_FIELDS)


async def _run(url: str, cases: list[tuple[str, str, dict[str, str], bool]] = CASES,
               ignored: tuple[str, ...] = DELIVERED_HEADERS_IGNORED) -> list[dict[str, Any]]:
    errors: dict[str, list[str]] = {}
    conns: dict[str, nats.NATS] = {}
    for user in ("a", "b", "ar", "as"):
        errors[user] = []

        async def on_error(e: Exception, user: str = user) -> None:
            errors[user].append(str(e))

        conns[user] = await nats.connect(url, user=user, password=user, name=user,
                                         error_cb=on_error, no_echo=user == "a",
                                         max_reconnect_attempts=0)
    a, b, as_ = conns["a"], conns["b"], conns["as"]
    traces: list[tuple[str, dict[str, Any]]] = []
    got: list[tuple[str, str, dict[str, str]]] = []

    async def on_trace(msg: Any) -> None:
        assert not msg.headers  # the document travels without headers
        traces.append((msg.subject, json.loads(msg.data)))

    def deliver(who: str) -> Any:
        async def cb(msg: Any) -> None:
            # A `_R_.` subject (an allow_trace service import's trace destination) is random.
            headers = {k: "_R_.<token>" if v.startswith("_R_.") else v
                       for k, v in (msg.headers or {}).items() if k not in ignored}
            got.append((who, msg.subject, headers))
            if msg.reply:
                await conns[who].publish(msg.reply, b"ok")
        return cb

    await a.subscribe("trace.>", cb=on_trace)
    await b.subscribe("trace.>", cb=on_trace)
    await as_.subscribe("news.>", cb=deliver("as"))
    await b.subscribe("fa.news.>", cb=deliver("b"))
    await as_.subscribe("svc.>", cb=deliver("as"))
    await b.subscribe("local.>", cb=deliver("b"))
    await a.subscribe("q.>", cb=deliver("a"))  # a has echo off: "no echo" egress
    await as_.subscribe("q.>", queue="g", cb=deliver("as"))
    await as_.subscribe("deny.>", cb=deliver("as"))
    for nc in conns.values():
        await nc.flush()
    out = await run_cases(conns, errors, cases, traces, got, _strip)
    for nc in conns.values():
        await nc.close()
    return out


@pytest.fixture(scope="module")
def results(module_servers: Any) -> dict[str, list[dict[str, Any]]]:
    pair = module_servers.both(CONFIG)
    return {name: asyncio.run(_run(proc.url)) for name, proc in pair.items()}


@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_same_trace_as_nats_server(results: dict[str, list[dict[str, Any]]], i: int) -> None:
    names = sorted(results)
    assert len(names) == 2
    ours, theirs = (results[n][i] for n in ("jetraft", "nats-server"))
    assert ours == theirs


def test_oracle_saw_what_the_cases_claim(results: dict[str, list[dict[str, Any]]]) -> None:
    """Pins the oracle's behaviour the cases rely on, so that a silent change in
    either server (or an empty run) cannot make the comparison vacuous."""
    by_subject = {r["case"][1]: r for r in results["jetraft"]}
    kinds = [[e["type"] for e in t[1]["events"]] for t in by_subject["news.1"]["traces"]]
    assert [k[0] for k in kinds] == ["in"] and sorted(kinds[0][1:]) == ["eg", "se"]
    assert by_subject["news.1"]["delivered"]  # delivered when not trace-only
    assert by_subject["news.2"]["delivered"] == []  # trace only
    assert by_subject["news.2"]["traces"]
    m_in = [e["type"] for e in by_subject["m.in"]["traces"][0][1]["events"]]
    assert m_in == ["in", "sm", "si"]
    assert by_subject["news.6"]["traces"] == [] and by_subject["news.6"]["delivered"] == []
    assert by_subject["news.6"]["errors"]["ar"]


JS_CASES: list[tuple[str, dict[str, str]]] = [
    ("js.1", {T: "trace.x"}),
    ("js.2", {T: "trace.x", ONLY: "true"}),  # trace only: not stored, no PubAck
]


async def _run_js(url: str) -> dict[str, Any]:
    nc = await nats.connect(url, name="p")
    js = nc.jetstream()
    await js.add_stream(name="S", subjects=["js.>"])
    docs: list[dict[str, Any]] = []

    async def on_trace(msg: Any) -> None:
        docs.append(_strip(json.loads(msg.data)))

    await nc.subscribe("trace.x", cb=on_trace)
    await nc.flush()
    out: dict[str, Any] = {}
    for subject, headers in JS_CASES:
        docs.clear()
        try:
            # (a trace-only publish gets no reply: 1 s; a stored one may take a while under
            # load)
            reply = (await nc.request(subject, b"x", headers=headers,
                                      timeout=1 if ONLY in headers else 10)).data.decode()
        except nats.errors.TimeoutError:
            reply = "timeout"
        # until the trace came (a loaded server sends it after the reply), then 0.2 s more
        for _ in range(100):
            if docs:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.2)
        out[subject] = {"reply": json.loads(reply) if reply != "timeout" else reply,
                        "traces": list(docs)}
    out["stored"] = (await js.stream_info("S")).state.messages
    await nc.close()
    return out


def test_jetstream_capture_traced_as_nats_server(servers: Any) -> None:
    got = {}
    for name, proc in (("nats-server", servers.nats_server(None, ["-js", "-sd",
                                                                 str(servers.workdir / "ns")])),
                       ("jetraft", servers.jetraft(None, ["-js", "-sd",
                                                          str(servers.workdir / "jr")]))):
        got[name] = asyncio.run(_run_js(proc.url))
    assert got["jetraft"] == got["nats-server"]
    assert got["jetraft"]["stored"] == 1
    events = got["jetraft"]["js.1"]["traces"][0]["events"]
    assert [e["type"] for e in events] == ["in", "js"]


# The same accounts, the trace allowed across: A's service export and B's stream import.
CONFIG_ALLOW = CONFIG.replace('{service: "svc.>"}]', '{service: "svc.>", allow_trace: true}]') \
    .replace('prefix: "fa"}', 'prefix: "fa", allow_trace: true}')
ALLOW_CASES: list[tuple[str, str, dict[str, str], bool]] = [
    ("a", "news.1", {T: "trace.a"}, False),  # egress in B, its subscription without prefix
    ("a", "news.2", {T: "trace.a", ONLY: "true"}, False),
    ("b", "m.in", {T: "trace.b"}, True),  # egress in A (the responder)
    ("b", "svc.x", {T: "trace.b", ONLY: "true"}, True),
]


def test_allow_trace_follows_imports_as_nats_server(servers: Any) -> None:
    assert CONFIG_ALLOW.count("allow_trace") == 2
    # The exporter's copy names a `_R_.` subject as its trace destination, on both.
    got = {name: asyncio.run(_run(proc.url, ALLOW_CASES))
           for name, proc in servers.both(CONFIG_ALLOW).items()}
    assert got["jetraft"] == got["nats-server"]
    news = got["jetraft"][0]["traces"][0][1]["events"]
    assert {"type": "eg", "kind": 0, "name": "b", "acc": "B", "sub": "news.>"} in news
    m_in = got["jetraft"][2]["traces"][0][1]["events"]
    assert [e["type"] for e in m_in] == ["in", "sm", "si", "eg"] and m_in[-1]["acc"] == "A"


def test_allow_trace_refused_where_nats_server_refuses_it() -> None:
    for entry, text in [('exports: [{stream: "x.>", allow_trace: true}]',
                         "Detected allow_trace directive on non-service"),
                        ('imports: [{service: {account: B, subject: "y"}, allow_trace: true}]',
                         "Detected allow_trace directive on a non-stream")]:
        conf = (f"accounts {{ A: {{ {entry} }}\n"
                "B: { exports: [{stream: y}, {service: y}] } }\n")
        with pytest.raises(ConfigError, match=text):
            parse_accounts_config(parse_config(conf))


# Account-level tracing: sampled W3C traceparent headers are traced to the account's dest.
CONFIG_ACCOUNT_TRACE = CONFIG.replace(
    'exports: [{stream: "news.>"}',
    'msg_trace: {dest: "trace.acc", sampling: 100}\n    exports: [{stream: "news.>"}')
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-"
ACCOUNT_TRACE_CASES: list[tuple[str, str, dict[str, str], bool]] = [
    ("a", "news.1", {"traceparent": PARENT + "01"}, False),  # sampled: traced
    ("a", "news.2", {"traceparent": PARENT + "00"}, False),  # not sampled
    ("a", "news.3", {"Traceparent": PARENT + "01"}, False),  # any case
    ("a", "news.4", {"traceparent": PARENT + "03"}, False),  # other flag bits
    ("a", "news.5", {"traceparent": PARENT + "01", ONLY: "true"}, False),  # still delivered
    ("a", "news.6", {"traceparent": PARENT + "01", T: "trace.a"}, False),  # the header wins
    ("a", "news.7", {"traceparent": "junk"}, False),
    ("b", "local.1", {"traceparent": PARENT + "01"}, False),  # B has no msg_trace
]


def test_account_msg_trace_as_nats_server(servers: Any) -> None:
    assert "msg_trace" in CONFIG_ACCOUNT_TRACE
    got = {name: asyncio.run(_run(proc.url, ACCOUNT_TRACE_CASES))
           for name, proc in servers.both(CONFIG_ACCOUNT_TRACE).items()}
    assert got["jetraft"] == got["nats-server"]
    ours = got["jetraft"]
    assert [r["traces"][0][0] if r["traces"] else None for r in ours] == \
        ["trace.acc", None, "trace.acc", "trace.acc", "trace.acc", "trace.a", None, None]
    assert ours[4]["delivered"]


def test_msg_trace_config_refused_where_nats_server_refuses_it() -> None:
    for entry, text in [('msg_trace: { dest: "a.*" }', 'Trace destination "a.\\*" is not valid'),
                        ('msg_trace: { dest: "a", sampling: 0 }', "sampling value 0 is invalid"),
                        ('msg_trace: { dest: "a", sampling: 101 }', "needs to be \\[1..100\\]"),
                        ('msg_trace: { dest: "a", foo: 1 }', 'Unknown field "foo"')]:
        with pytest.raises(ConfigError, match=text):
            parse_accounts_config(parse_config(f"accounts {{ A: {{ {entry} }} }}\n"))
    for entry, dest in [('msg_trace: "a"', "a"), ('msg_trace: { dest: "a", sampling: "50%" }', "a"),
                        ("msg_trace: { sampling: 50 }", None)]:
        conf = parse_accounts_config(parse_config(f"accounts {{ A: {{ {entry} }} }}\n"))
        trace = conf.accounts["A"].msg_trace
        assert (trace.dest if trace else None) == dest


CHAIN = """
accounts {
  C: { users: [{user: c, password: c}], exports: [{service: "svc.>", allow_trace: ALLOW_C}] }
  B: { users: [{user: b, password: b}], exports: [{service: "svc.>", allow_trace: ALLOW_B}],
       imports: [{service: {account: C, subject: "svc.>"}}] }
  A: { users: [{user: a, password: a}], imports: [{service: {account: B, subject: "svc.>"}}] }
}
"""


async def _run_chain(url: str) -> dict[str, Any]:
    conns = {u: await nats.connect(url, user=u, password=u, name=u) for u in "abc"}
    docs: list[dict[str, Any]] = []
    got: list[tuple[str, str, dict[str, str]]] = []

    async def on_trace(msg: Any) -> None:
        docs.append(json.loads(msg.data))

    def serve(who: str, answer: bool) -> Any:
        async def cb(msg: Any) -> None:
            got.append((who, msg.subject, {
                k: "_R_.<token>" if v.startswith("_R_.") else v
                for k, v in (msg.headers or {}).items() if k not in DELIVERED_HEADERS_IGNORED}))
            if answer:
                await conns[who].publish(msg.reply, b"ok")
        return cb

    await conns["a"].subscribe("trace.>", cb=on_trace)
    await conns["b"].subscribe("svc.>", cb=serve("b", False))
    await conns["c"].subscribe("svc.>", cb=serve("c", True))
    for nc in conns.values():
        await nc.flush()
    await asyncio.sleep(0.2)  # nats-server's import interest settles asynchronously
    out: dict[str, Any] = {}
    for only in (False, True):
        docs.clear()
        got.clear()
        headers = {T: "trace.a", **({ONLY: "true"} if only else {})}
        try:
            reply = (await conns["a"].request("svc.1", b"", headers=headers, timeout=0.5)).data
        except nats.errors.NoRespondersError:
            reply = b"no responders"
        except nats.errors.TimeoutError:
            reply = b"timeout"
        for nc in conns.values():
            await nc.flush()
        await asyncio.sleep(0.15)
        events = [[{k: v for k, v in e.items() if k not in EVENT_FIELDS} for e in d["events"]]
                  for d in docs]
        for evs in events:  # an egress in an account comes after the `si` that led there
            for i, e in enumerate(evs):
                if e["type"] == "eg" and "acc" in e:
                    assert {"type": "si", "acc": e["acc"]}.items() <= \
                        next(x for x in evs[:i] if x.get("acc") == e["acc"]).items()
        out[f"only={only}"] = {
            "reply": reply.decode(), "delivered": sorted(got, key=repr),
            # nats-server walks a chain in Go map order: after `in`, compared as a set.
            "events": [[evs[0], *sorted(evs[1:], key=lambda e: json.dumps(e, sort_keys=True))]
                       for evs in events]}
    for nc in conns.values():
        await nc.close()
    return out


@pytest.mark.parametrize("allow_b,allow_c", [("true", "true"), ("true", "false"),
                                             ("false", "true")])
def test_chained_service_imports_traced_as_nats_server(servers: Any, allow_b: str,
                                                       allow_c: str) -> None:
    """A -> B -> C service imports: one `si` per hop the trace reaches, egress in each
    account it may follow, `trace disabled` past an export without allow_trace."""
    config = CHAIN.replace("ALLOW_B", allow_b).replace("ALLOW_C", allow_c)
    got = {name: asyncio.run(_run_chain(proc.url)) for name, proc in servers.both(config).items()}
    assert got["jetraft"] == got["nats-server"]
    traced = got["nats-server"]["only=False"]["events"][0]
    assert [e["type"] for e in traced].count("si") == (2 if allow_b == "true" else 1)


# Permission checks on the traced path, in nats-server's order: the trace destination
# first (the whole message refused), then the publish permission on the subject the
# account's mapping made (an `in` event with the error), then each subscriber's
# permission at delivery (an egress error), in the importer too.
CONFIG_PERMS = """
accounts {
  A: {
    users: [
      {user: a, password: a}
      {user: pm, password: pm, permissions: {publish: {allow: ["old.>", "trace.>"]}}}
      {user: pd, password: pd, permissions: {publish: {deny: ["ev.>"]}}}
      {user: as, password: as, permissions: {subscribe: {allow: [">"], deny: ["news.deny"]}}}
    ]
    mappings: {"old.y": "ev.mapped", "old.z": "ok.mapped", "ev.back": "old.back"}
    exports: [{stream: "news.>"}]
  }
  B: {
    users: [{user: bs, password: bs,
             permissions: {subscribe: {allow: [">"], deny: ["fa.news.deny"]}}}]
    imports: [{stream: {account: A, subject: "news.>"}, prefix: "fa", allow_trace: true}]
  }
}
"""
PERM_CASES: list[tuple[str, str, dict[str, str], bool]] = [
    ("pm", "old.y", {T: "trace.a"}, False),  # allowed old.>, mapped to ev.mapped: refused
    ("pm", "old.z", {T: "trace.a"}, False),  # mapped outside its allow list
    ("pm", "old.z", {T: "trace.a", ONLY: "true"}, False),
    ("pd", "old.y", {T: "trace.a"}, False),  # mapped INTO its deny list
    ("pd", "ev.back", {T: "trace.a"}, False),  # denied subject mapped out of it
    ("pd", "ev.x", {T: "trace.a"}, False),  # denied, unmapped
    ("pd", "ev.x", {T: "trace.a", ONLY: "true"}, False),
    ("pm", "news.1", {T: "trace.a"}, False),  # not in the allow list at all
    ("a", "news.deny", {T: "trace.a"}, False),  # both subscribers deny it
    ("a", "news.deny", {T: "trace.a", ONLY: "true"}, False),
    ("a", "news.ok", {T: "trace.a"}, False),
]


async def _run_perms(url: str) -> list[dict[str, Any]]:
    errors: dict[str, list[str]] = {}
    conns: dict[str, nats.NATS] = {}
    for user in ("a", "pm", "pd", "as", "bs"):
        errors[user] = []

        async def on_error(e: Exception, user: str = user) -> None:
            errors[user].append(str(e))

        conns[user] = await nats.connect(url, user=user, password=user, name=user,
                                         error_cb=on_error, max_reconnect_attempts=0)
    traces: list[tuple[str, dict[str, Any]]] = []
    got: list[tuple[str, str]] = []

    async def on_trace(msg: Any) -> None:
        traces.append((msg.subject, json.loads(msg.data)))

    def deliver(who: str) -> Any:
        async def cb(msg: Any) -> None:
            got.append((who, msg.subject))
        return cb

    await conns["a"].subscribe("trace.>", cb=on_trace)
    for subject in ("ev.>", "ok.>", "old.>", "news.>"):
        await conns["as"].subscribe(subject, cb=deliver("as"))
    await conns["bs"].subscribe("fa.news.>", cb=deliver("bs"))
    for nc in conns.values():
        await nc.flush()
    await asyncio.sleep(0.2)  # nats-server's import interest settles asynchronously
    out = await run_cases(conns, errors, PERM_CASES, traces, got, _strip)
    for nc in conns.values():
        await nc.close()
    return out


def test_permission_checks_on_the_traced_path_as_nats_server(servers: Any) -> None:
    got = {name: asyncio.run(_run_perms(proc.url))
           for name, proc in servers.both(CONFIG_PERMS).items()}
    for t, o in zip(got["nats-server"], got["jetraft"], strict=True):
        assert o == t, f"case {t['case']}:\nnats-server {json.dumps(t, indent=1)}\n" \
                       f"jetraft {json.dumps(o, indent=1)}"
    # What the comparison relies on (so that an empty run cannot pass):
    theirs = got["nats-server"]
    first = theirs[0]["traces"][0][1]["events"]  # refused on the mapped subject
    assert [e["type"] for e in first] == ["in", "sm"] and first[0]["subj"] == "old.y"
    assert first[0]["error"] == 'Permissions Violation for Publish to "ev.mapped"'
    assert theirs[0]["delivered"] == [] and theirs[0]["errors"]["pm"]
    assert theirs[4]["delivered"] == [("as", "old.back")]  # denied ev.back, mapped out
    deny = theirs[8]["traces"][0][1]["events"]  # both subscribers deny news.deny
    assert sum(e.get("error") == msgtrace.SUB_DENIED for e in deny) == 2
    assert {"type": "eg", "kind": 0, "name": "bs", "acc": "B", "sub": "news.>",
            "error": msgtrace.SUB_DENIED} in deny
