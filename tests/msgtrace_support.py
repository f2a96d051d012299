"""Shared by the message-tracing differential tests (tests/integration/test_msgtrace_*.py,
tests/cluster/test_msgtrace_routes.py): how a trace document is normalised before it
is compared with nats-server's, and the loop that publishes each case and records
what every connection saw."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats

EVENT_FIELDS = ("ts", "cid")  # timestamps; connection ids count differently
# Each case: (user, subject, headers, request?)
Case = tuple[str, str, dict[str, str], bool]


def strip_document(doc: dict[str, Any], server_fields: tuple[str, ...]) -> dict[str, Any]:
    """`doc` without the server fields that cannot agree, event fields that cannot
    agree, and with nats-server's random event order normalised (`unordered_runs`)."""
    server = {k: v for k, v in doc["server"].items() if k not in server_fields}
    events = [{k: v for k, v in ev.items() if k not in EVENT_FIELDS} for ev in doc["events"]]
    out = {"server": server, "request": doc["request"]}
    if "hops" in doc:
        out["hops"] = doc["hops"]
    out["events"] = unordered_runs(events)
    return out


def unordered_runs(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """nats-server visits the subscriptions a message reaches in its sublist's Go map
    order (random), so a run of consecutive egress and stream-export events is
    compared as a set: of units, each a `se` with the egress in that importer that
    follows it (nats-server records a `se` per importer subscription it reaches),
    or a lone egress. Every other event keeps its place."""
    out: list[dict[str, Any]] = []
    units: list[list[dict[str, Any]]] = []
    for ev in [*events, {"type": "end"}]:
        kind = ev["type"]
        if kind == "eg" and units and units[-1][0]["type"] == "se" and len(units[-1]) == 1 \
                and ev.get("acc") == units[-1][0]["acc"]:
            units[-1].append(ev)
            continue
        if kind in ("eg", "se"):
            units.append([ev])
            continue
        for unit in sorted(units, key=lambda u: json.dumps(u, sort_keys=True)):
            out += unit
        units = []
        out.append(ev)
    return out[:-1]


async def run_cases(conns: dict[str, nats.NATS], errors: dict[str, list[str]],
                    cases: list[Case], traces: list[tuple[str, dict[str, Any]]],
                    got: list[Any], strip: Any, settle: float = 0.15) -> list[dict[str, Any]]:
    """Publish (or request) each case as its user and record the reply, the
    deliveries and -ERRs it caused, and the trace documents (`strip`ped) that
    arrived in `traces`; the callbacks the caller subscribed fill `got`/`traces`."""
    out = []
    for user, subject, headers, request in cases:
        traces.clear()
        got.clear()
        for errs in errors.values():
            errs.clear()
        nc = conns[user]
        reply = "-"
        if request:
            # a trace-only request is never answered: 0.5 s; an answer may take seconds on
            # a loaded machine
            only = any(k.lower() == "nats-trace-only" for k in headers)
            try:
                reply = (await nc.request(subject, b"hello", headers=headers,
                                          timeout=0.5 if only else 5)).data.decode()
            except nats.errors.NoRespondersError:
                reply = "no responders"
            except nats.errors.TimeoutError:
                reply = "timeout"
        else:
            await nc.publish(subject, b"hello", headers=headers)
        for c in conns.values():
            await c.flush()
        await asyncio.sleep(settle)  # internal deliveries and the -ERR callbacks
        out.append({"case": [user, subject, headers], "reply": reply,
                    "delivered": sorted(got, key=repr),
                    "errors": {u: sorted(e) for u, e in errors.items() if e},
                    "traces": sorted(((s, strip(d)) for s, d in traces), key=repr)})
    return out
