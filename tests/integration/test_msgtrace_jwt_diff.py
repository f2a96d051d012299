"""Message tracing in operator (JWT) mode, against nats-server 2.15.

The accounts come from account JWTs (MEMORY resolver, preloaded): A exports a
stream `news.>`, a stream `ev.>`, a service `svc.>` with `allow_trace` and a
service `plain.>` without, and has the account claim `trace {dest}` (no sampling:
every sampled `traceparent`); B imports `news.>` as `fa.news.>` with
`allow_trace`, `ev.>` without, and both services. Users log in with .creds
files; one of A's users may not publish to `trace.denied`. The same nats-py
script runs against nats-server and `jetraft serve`, and the trace documents,
deliveries, request outcomes and -ERRs must be equal once the fields listed in
test_msgtrace_diff.py (server ids/times, event ts/cid) are removed; also
removed: nats-server's Nats-Request-Info on service-import requests, and a
`_R_.` subject's random token.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
import pytest

from tests import jwt_issuer as ji
from tests.integration.test_msgtrace_diff import _strip
from tests.msgtrace_support import run_cases

T = "Nats-Trace-Dest"
ONLY = "Nats-Trace-Only"
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # sampled
UNSAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
IGNORED_HEADERS = ("Nats-Request-Info",)
# (user, subject, headers, request?)
CASES: list[tuple[str, str, dict[str, str], bool]] = [
    ("a", "news.1", {T: "trace.a"}, False),  # stream export, allow_trace import: egress in B
    ("a", "news.2", {T: "trace.a", ONLY: "true"}, False),
    ("a", "ev.1", {T: "trace.a"}, False),  # stream import without allow_trace: `se` ends it
    ("b", "svc.1", {T: "trace.b"}, True),  # service export with allow_trace: egress in A
    ("b", "plain.1", {T: "trace.b"}, True),  # without: exporter gets "trace disabled"
    ("a", "x.1", {"traceparent": PARENT}, False),  # the account JWT's trace claim
    ("a", "x.2", {"traceparent": UNSAMPLED}, False),  # not sampled: untraced
    ("a", "x.3", {T: "trace.a", "traceparent": PARENT}, False),  # the header wins
    ("ad", "news.3", {T: "trace.denied"}, False),  # destination denied: refused
    ("ad", "trace.denied", {T: "trace.a"}, False),  # subject denied: `in` with error
]


def _world(tmp: Path) -> tuple[str, dict[str, str]]:
    """The operator config and a .creds file per user."""
    op, sys_, a, b = ji.operator_key(), ji.account_key(), ji.account_key(), ji.account_key()
    a_jwt = ji.account_jwt(a, op, name="A", trace={"dest": "trace.acc"}, exports=[
        {"name": "news", "subject": "news.>", "type": "stream"},
        {"name": "ev", "subject": "ev.>", "type": "stream"},
        {"name": "svc", "subject": "svc.>", "type": "service", "allow_trace": True},
        {"name": "plain", "subject": "plain.>", "type": "service"}])
    b_jwt = ji.account_jwt(b, op, name="B", imports=[
        {"name": "n", "subject": "news.>", "account": a.public, "type": "stream",
         "local_subject": "fa.news.>", "allow_trace": True},
        {"name": "e", "subject": "ev.>", "account": a.public, "type": "stream"},
        {"name": "s", "subject": "svc.>", "account": a.public, "type": "service"},
        {"name": "p", "subject": "plain.>", "account": a.public, "type": "service"}])
    (tmp / "op.jwt").write_text(ji.operator_jwt(op, system_account=sys_.public))
    config = (f"operator: {tmp / 'op.jwt'}\nsystem_account: {sys_.public}\n"
              f"resolver: MEMORY\nresolver_preload: {{ {sys_.public}: "
              f"{ji.account_jwt(sys_, op, name='SYS')}, {a.public}: {a_jwt}, "
              f"{b.public}: {b_jwt} }}\n")
    creds: dict[str, str] = {}
    for name, acc, perms in (("a", a, {}), ("b", b, {}),
                             ("ad", a, {"pub": {"deny": ["trace.denied"]}})):
        user = ji.user_key()
        path = tmp / f"{name}.creds"
        path.write_text(ji.creds(ji.user_jwt(user, acc, name=name, **perms), user))
        creds[name] = str(path)
    return config, creds


def _headers(msg: Any) -> dict[str, str]:
    return {k: "_R_.<token>" if v.startswith("_R_.") else v
            for k, v in (msg.headers or {}).items() if k not in IGNORED_HEADERS}


async def _run(url: str, creds: dict[str, str]) -> list[dict[str, Any]]:
    conns: dict[str, nats.NATS] = {}
    errors: dict[str, list[str]] = {}
    for user, path in creds.items():
        errors[user] = []

        async def on_error(e: Exception, user: str = user) -> None:
            errors[user].append(str(e))

        conns[user] = await nats.connect(url, user_credentials=path, name=user,
                                         error_cb=on_error, max_reconnect_attempts=0)
    a, b = conns["a"], conns["b"]
    traces: list[tuple[str, dict[str, Any]]] = []
    got: list[tuple[str, str, dict[str, str]]] = []

    async def on_trace(msg: Any) -> None:
        traces.append((msg.subject, json.loads(msg.data)))

    def deliver(who: str) -> Any:
        async def cb(msg: Any) -> None:
            got.append((who, msg.subject, _headers(msg)))
            if msg.reply:
                await conns[who].publish(msg.reply, b"ok")
        return cb

    await a.subscribe("trace.>", cb=on_trace)
    await b.subscribe("trace.>", cb=on_trace)
    await b.subscribe("fa.news.>", cb=deliver("b"))
    await b.subscribe("ev.>", cb=deliver("b"))
    await a.subscribe("svc.>", cb=deliver("a"))
    await a.subscribe("plain.>", cb=deliver("a"))
    await a.subscribe("x.>", cb=deliver("a"))
    for nc in conns.values():
        await nc.flush()
    await asyncio.sleep(0.2)  # nats-server's import interest settles asynchronously
    out = await run_cases(conns, errors, CASES, traces, got, _strip)
    for nc in conns.values():
        await nc.close()
    return out


@pytest.fixture(scope="module")
def results(module_servers: Any, tmp_path_factory: pytest.TempPathFactory
            ) -> dict[str, list[dict[str, Any]]]:
    config, creds = _world(tmp_path_factory.mktemp("jwtrace"))
    pair = module_servers.both(config)
    return {name: asyncio.run(_run(proc.url, creds)) for name, proc in pair.items()}


@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_jwt_mode_trace_as_nats_server(results: dict[str, list[dict[str, Any]]], i: int) -> None:
    assert results["jetraft"][i] == results["nats-server"][i]


def test_oracle_saw_what_the_cases_claim(results: dict[str, list[dict[str, Any]]]) -> None:
    """Pins what the comparison relies on, so that an empty run cannot pass."""
    by = {r["case"][1]: r for r in results["nats-server"]}

    def types(subject: str) -> list[str]:
        return [e["type"] for e in by[subject]["traces"][0][1]["events"]]

    assert sorted(types("news.1")) == ["eg", "in", "se"]  # egress in B (allow_trace)
    assert types("ev.1") == ["in", "se"]
    assert types("svc.1") == ["in", "si", "eg"] and types("plain.1") == ["in", "si"]
    assert by["x.1"]["traces"][0][0] == "trace.acc" and by["x.2"]["traces"] == []
    assert [s for s, _ in by["x.3"]["traces"]] == ["trace.a"]
    assert by["news.3"]["traces"] == [] and by["news.3"]["errors"]["ad"]
    assert by["trace.denied"]["traces"][0][1]["events"][0]["error"]
