"""HTTP monitoring: /varz /connz /subsz /healthz /metrics.

A deliberately tiny HTTP/1.1 server on asyncio streams (GET only, one
request per connection turn, keep-alive honoured) so monitoring adds no
dependency.  JSON field names are nats-server's, so existing dashboards
and `nats server` tooling read them; every key we emit also exists in
nats-server's output (a test checks this against the real server).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import UTC, datetime
from itertools import islice
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from node.version import GO_VERSION, VERSION


class Server(Protocol):
    """What the monitor reads from the server (which imports this module, never
    the other way round)."""

    options: Any
    server_id: str
    server_name: str
    port: int
    http_port: int
    start_time: float
    clients: dict[int, Any]
    total_connections: int
    slow_consumers: int
    stale_connections: int
    http_req_stats: dict[str, int]
    auth: Any
    accounts: dict[str, Any]
    cluster: Any  # node.cluster.Cluster or None

    def http_host(self) -> str: ...
    def totals(self) -> dict[str, int]: ...
    def subscription_count(self) -> int: ...

_MAX_REQUEST = 16 * 1024
CONNZ_DEFAULT_LIMIT = 1024


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def go_duration(seconds: float) -> str:
    """Uptime the way nats-server prints it: 1d2h3m4s, 5m0s, 12s."""
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d{hours}h{minutes}m{s}s"
    if hours:
        return f"{hours}h{minutes}m{s}s"
    if minutes:
        return f"{minutes}m{s}s"
    return f"{s}s"


def _rtt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f}s"
    if seconds >= 0.001:
        return f"{seconds * 1000:.3f}ms"
    return f"{seconds * 1e6:.0f}µs"


def _mem_rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def varz(server: Server) -> dict[str, Any]:
    o = server.options
    now = time.time()
    v: dict[str, Any] = {
        "server_id": server.server_id, "server_name": server.server_name,
        "version": VERSION, "proto": 1, "go": GO_VERSION, "host": o.host,
        "port": server.port, "max_connections": o.max_connections,
        "ping_interval": int(o.ping_interval * 1e9), "ping_max": o.ping_max,
        "http_host": server.http_host(), "http_port": server.http_port, "https_port": 0,
        "auth_timeout": o.auth_timeout, "max_control_line": o.max_control_line,
        "max_payload": o.max_payload, "max_pending": o.max_pending,
        "tls_timeout": o.tls.timeout if o.tls else 2, "write_deadline": int(o.write_deadline * 1e9),
        "start": rfc3339(server.start_time), "now": rfc3339(now),
        "uptime": go_duration(now - server.start_time), "mem": _mem_rss(),
        "cores": os.cpu_count() or 1, "cpu": _cpu_percent(),
        "connections": len(server.clients), "total_connections": server.total_connections,
        "routes": 0, "remotes": 0, "leafnodes": 0,
        "slow_consumers": server.slow_consumers, "stale_connections": server.stale_connections,
        "subscriptions": server.subscription_count(), "http_req_stats": dict(server.http_req_stats),
        "config_load_time": rfc3339(server.start_time),
    }
    totals = server.totals()
    v.update(totals)
    v["in_client_msgs"], v["in_client_bytes"] = totals["in_msgs"], totals["in_bytes"]
    v["out_client_msgs"], v["out_client_bytes"] = totals["out_msgs"], totals["out_bytes"]
    if server.cluster is not None or o.cluster.name:
        from node.cluster.routez import varz_cluster

        v["cluster"] = varz_cluster(server)
    if server.cluster is not None:
        v["routes"] = len(server.cluster.links)
        urls = server.cluster.connect_urls()[0]
        if urls:
            v["connect_urls"] = urls
    if server.auth is not None and server.auth.required:
        v["auth_required"] = True
    if o.jetstream.enabled:
        v["jetstream"] = {"config": {"store_dir": o.jetstream.store_dir}}
        if o.jetstream.unique_tag:
            v["jetstream"]["config"]["unique_tag"] = o.jetstream.unique_tag
    return v


_cpu_last = [time.monotonic(), time.process_time()]


def _cpu_percent() -> float:
    """Process CPU use since the previous /varz call."""
    wall, cpu = time.monotonic(), time.process_time()
    dw, dc = wall - _cpu_last[0], cpu - _cpu_last[1]
    _cpu_last[0], _cpu_last[1] = wall, cpu
    return round(100.0 * dc / dw, 1) if dw > 0 else 0.0


def _conn_info(c: Any, now: float, subs: str | None) -> dict[str, Any]:
    d: dict[str, Any] = {
        "cid": c.cid, "kind": c.kind.value,
        "type": "websocket" if c.conn_type == "WEBSOCKET" else "nats",
        "ip": c.host, "port": c.port, "start": rfc3339(c.start),
        "last_activity": rfc3339(c.last_activity), "rtt": _rtt(c.rtt),
        "uptime": go_duration(now - c.start), "idle": go_duration(now - c.last_activity),
        "pending_bytes": len(c.out) + c.tpending, "in_msgs": c.in_msgs, "out_msgs": c.out_msgs,
        "in_bytes": c.in_bytes, "out_bytes": c.out_bytes, "subscriptions": len(c.subs),
    }
    d.update({k: v for k, v in c.describe().items() if v})
    if c.user:
        d["authorized_user"] = c.user
    if subs == "detail":
        d["subscriptions_list_detail"] = [
            {"subject": s.subject, **({"qgroup": s.queue} if s.queue else {}), "sid": s.sid,
             "msgs": s.delivered, **({"max": s.max_msgs} if s.max_msgs else {}), "cid": c.cid}
            for s in c.subs.values()]
    elif subs and subs not in ("0", "false"):
        d["subscriptions_list"] = [s.subject for s in c.subs.values()]
    return d


def connz(server: Server, query: dict[str, str]) -> dict[str, Any]:
    offset = max(_int(query.get("offset"), 0), 0)
    limit = _int(query.get("limit"), CONNZ_DEFAULT_LIMIT)
    if limit <= 0:
        limit = CONNZ_DEFAULT_LIMIT
    clients = sorted(server.clients.values(), key=lambda c: c.cid)
    acc = query.get("acc")
    if acc:
        clients = [c for c in clients if c.account.name == acc]
    now = time.time()
    page = clients[offset:offset + limit]
    subs = query.get("subs")
    return {"server_id": server.server_id, "now": rfc3339(now), "num_connections": len(page),
            "total": len(clients), "offset": offset, "limit": limit,
            "connections": [_conn_info(c, now, subs) for c in page]}


_SUM_STATS = ("num_subscriptions", "num_cache", "num_inserts", "num_removes", "num_matches")


def _sublist_stats(accounts: list[Any]) -> dict[str, Any]:
    """nats-server's /subsz counters over `accounts` (summed when several)."""
    if len(accounts) == 1:
        return dict(accounts[0].sublist.stats())
    every = [a.sublist.stats() for a in accounts]
    st: dict[str, Any] = {k: sum(s[k] for s in every) for k in _SUM_STATS}
    st["max_fanout"] = max((s["max_fanout"] for s in every), default=0)
    st["cache_hit_rate"] = st["avg_fanout"] = 0  # not meaningful summed over sublists
    return st


def subsz(server: Server, query: dict[str, str]) -> dict[str, Any]:
    acc = query.get("acc")
    if acc:
        accounts = [server.accounts[acc]] if acc in server.accounts else []
    else:
        accounts = list(server.accounts.values())
    st = _sublist_stats(accounts)
    out: dict[str, Any] = {"server_id": server.server_id, "now": rfc3339(time.time())}
    keys = (*_SUM_STATS, "cache_hit_rate", "max_fanout", "avg_fanout")
    for k in keys:
        out[k] = st.get(k, 0)
    offset = max(_int(query.get("offset"), 0), 0)
    limit = _int(query.get("limit"), CONNZ_DEFAULT_LIMIT)
    if limit <= 0:
        limit = CONNZ_DEFAULT_LIMIT
    out.update({"total": 0, "offset": offset, "limit": limit})
    if query.get("subs") not in (None, "0", "false"):
        # One page, never the whole sublist: this runs on the event loop.
        every = ((a.name, s) for a in accounts for s in a.sublist.iter_subscriptions())
        page = islice(every, offset, offset + limit)
        out["total"] = sum(a.sublist.count() for a in accounts)
        out["subscriptions_list"] = [_sub_detail(name, s) for name, s in page]
    return out


def _sub_detail(account: str, s: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"account": account, "subject": s.subject}
    if s.queue:
        d["qgroup"] = s.queue
    d.update({"sid": s.sid, "msgs": s.delivered, "cid": getattr(s.client, "cid", 0)})
    return d


def _int(s: str | None, default: int) -> int:
    try:
        return int(s) if s is not None else default
    except ValueError:
        return default


# Prometheus: our own names, plus the prometheus-nats-exporter ("gnatsd_varz_*")
# names so existing NATS dashboards work unchanged.
_METRICS = [
    ("connections", "gauge", "Current client connections"),
    ("total_connections", "counter", "Client connections since start"),
    ("subscriptions", "gauge", "Current subscriptions"),
    ("in_msgs", "counter", "Messages received from clients"),
    ("out_msgs", "counter", "Messages sent to clients"),
    ("in_bytes", "counter", "Payload bytes received from clients"),
    ("out_bytes", "counter", "Payload bytes sent to clients"),
    ("slow_consumers", "counter", "Clients closed as slow consumers"),
    ("stale_connections", "counter", "Clients closed as stale"),
    ("mem", "gauge", "Resident memory in bytes"),
]


def metrics(server: Server) -> str:
    v = varz(server)
    lines: list[str] = []
    for key, kind, help_text in _METRICS:
        name = f"jetraft_{key}" + ("_total" if kind == "counter" else "")
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {v[key]}"]
    up = time.time() - server.start_time
    lines += ["# HELP jetraft_uptime_seconds Seconds since start",
              "# TYPE jetraft_uptime_seconds gauge", f"jetraft_uptime_seconds {up:.3f}"]
    for key, kind, help_text in _METRICS:
        name = f"gnatsd_varz_{key}"
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}",
                  f'{name}{{server_id="{server.server_id}"}} {v[key]}']
    return "\n".join(lines) + "\n"


def _routez(server: Server, query: dict[str, str]) -> dict[str, Any]:
    from node.cluster.routez import routez  # the cluster package pulls in grpc

    return routez(server, query)


def _jsz(server: Server, query: dict[str, str]) -> dict[str, Any]:
    from node.jetstream.jsz import jsz

    return jsz(server, query)


def _js_health(server: Server) -> tuple[bool, str]:
    if getattr(server, "jetstream", None) is None:
        return True, ""
    from node.jetstream.jsz import healthy

    return healthy(server)


def handle(server: Server, path: str, query: dict[str, str]) -> tuple[int, str, str]:
    """(status, content type, body) for one GET."""
    if path in ("", "/"):
        body = "\n".join(["/varz", "/connz", "/routez", "/subsz", "/healthz", "/metrics"]) + "\n"
        return 200, "text/plain; charset=utf-8", body
    routes = {
        "/varz": lambda: varz(server),
        "/connz": lambda: connz(server, query),
        "/subsz": lambda: subsz(server, query),
        "/subscriptionsz": lambda: subsz(server, query),
        "/healthz": lambda: {"status": "ok"},
        "/routez": lambda: _routez(server, query),
        "/jsz": lambda: _jsz(server, query),
    }
    if path == "/metrics":
        return 200, "text/plain; version=0.0.4; charset=utf-8", metrics(server)
    fn = routes.get(path)
    if fn is None:
        return 404, "text/plain; charset=utf-8", "404 page not found\n"
    server.http_req_stats[path] = server.http_req_stats.get(path, 0) + 1
    if path == "/healthz":
        ok, why = _js_health(server)
        if not ok:  # nats-server answers 503 until JetStream is current
            return 503, "application/json", json.dumps({"status": "unavailable", "error": why},
                                                       separators=(",", ":"))
        return 200, "application/json", json.dumps(fn(), separators=(",", ":"))
    return 200, "application/json", json.dumps(fn(), indent=2)


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            503: "Service Unavailable"}


async def _serve_conn(server: Server, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                return
            status, ctype, body, keep = _respond(server, head)
            data = body.encode()
            writer.write(
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(data)}\r\n"
                f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n".encode() + data)
            await writer.drain()
            if not keep:
                return
    except (ConnectionError, OSError):
        return
    finally:
        writer.close()


def _respond(server: Server, head: bytes) -> tuple[int, str, str, bool]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if len(parts) != 3:
        return 400, "text/plain", "bad request\n", False
    method, target, version = parts
    keep = version == "HTTP/1.1" and not any(
        ln.lower().startswith("connection:") and "close" in ln.lower() for ln in lines[1:])
    if method not in ("GET", "HEAD"):
        return 405, "text/plain", "method not allowed\n", keep
    url = urlsplit(target)
    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
    path = url.path.rstrip("/") or "/"
    status, ctype, body = handle(server, path, query)
    return status, ctype, body, keep


async def start_monitor(server: Server, host: str, port: int) -> asyncio.AbstractServer:
    return await asyncio.start_server(
        lambda r, w: _serve_conn(server, r, w), host, port, limit=_MAX_REQUEST)
