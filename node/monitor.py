"""HTTP monitoring: /varz /connz /subsz /accountz /accstatz /healthz /metrics.

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
    jetstream: Any

    def http_host(self) -> str: ...
    def totals(self) -> dict[str, int]: ...
    def subscription_count(self) -> int: ...

_MAX_REQUEST = 16 * 1024
HEADER_TIMEOUT = 5.0  # seconds from accept to a whole request head
IDLE_TIMEOUT = 30.0  # seconds a kept-alive connection may wait for its next request
WRITE_TIMEOUT = 10.0  # seconds for a reply to leave (a client that never reads)
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


def mem_rss() -> int:
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
        "http_host": server.http_host(), "http_port": server.http_port, "http_base_path": "",
        "https_port": 0,
        "auth_timeout": o.auth_timeout, "max_control_line": o.max_control_line,
        "max_payload": o.max_payload, "max_pending": o.max_pending,
        "tls_timeout": o.tls.timeout if o.tls else 2, "write_deadline": int(o.write_deadline * 1e9),
        "start": rfc3339(server.start_time), "now": rfc3339(now),
        "uptime": go_duration(now - server.start_time), "mem": mem_rss(),
        "cores": os.cpu_count() or 1, "gomaxprocs": os.cpu_count() or 1, "cpu": cpu_percent(),
        "connections": len(server.clients), "total_connections": server.total_connections,
        "routes": 0, "remotes": 0, "leafnodes": 0,
        "slow_consumers": server.slow_consumers, "stale_connections": server.stale_connections,
        "stalled_clients": 0,
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
    system = system_account_name(server)
    if system:
        v["system_account"] = system
    if o.jetstream.enabled:
        from node.jetstream.jszdetail import config_block

        store_dir = getattr(server.jetstream, "store_dir", None) or o.jetstream.store_dir
        v["jetstream"] = {"config": config_block(o.jetstream, store_dir)}
        if o.jetstream.unique_tag:
            v["jetstream"]["config"]["unique_tag"] = o.jetstream.unique_tag
    return v


_cpu_last = [time.monotonic(), time.process_time()]


def cpu_percent() -> float:
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


# What nats-server imports from the system account into every other account:
# (subject the account publishes on, kind served there, import subject, share).
SYSTEM_ACCOUNT_IMPORTS = (
    ("$SYS.REQ.SERVER.PING.CONNZ", "CONNZ", "$SYS.REQ.ACCOUNT.{}.CONNZ", False),
    ("$SYS.REQ.ACCOUNT.PING.CONNZ", "CONNZ", "$SYS.REQ.ACCOUNT.{}.CONNZ", False),
    ("$SYS.REQ.ACCOUNT.PING.STATZ", "STATZ", "$SYS.REQ.ACCOUNT.{}.STATZ", False),
    ("$SYS.REQ.USER.INFO", "USERINFO", "$SYS.REQ.USER.{}.INFO", True),
)
# What nats-server's system account exports.
SYSTEM_EXPORTS = (
    {"subject": "$SYS.DEBUG.SUBSCRIBERS", "type": "service", "response_type": "Singleton"},
    {"subject": "$SYS.REQ.USER.*.INFO", "type": "service", "response_type": "Singleton"},
    {"subject": "$SYS.REQ.ACCOUNT.*.CONNZ", "type": "service", "response_type": "Streamed"},
    {"subject": "$SYS.REQ.ACCOUNT.*.STATZ", "type": "service", "response_type": "Streamed"},
)
_RESPONSE_TYPES = {"singleton": "Singleton", "stream": "Streamed", "chunked": "Chunked"}


def system_account_name(server: Server) -> str:
    conf = server.options.accounts
    if conf is None or conf.no_system_account:
        return ""
    return str(conf.system_account)


def accountz(server: Server, query: dict[str, str]) -> dict[str, Any]:
    """/accountz: the account names, or one account's detail with ?acc=."""
    out: dict[str, Any] = {"server_id": server.server_id, "now": rfc3339(time.time())}
    system = system_account_name(server)
    if system:
        out["system_account"] = system
    acc = query.get("acc")
    if acc:
        out["account_detail"] = account_detail(server, acc)
    else:
        out["accounts"] = list(server.accounts)
    return out


def account_detail(server: Server, name: str) -> dict[str, Any]:
    """One account as /accountz?acc= and $SYS.REQ.ACCOUNT.<acc>.INFO show it."""
    account = server.accounts[name]
    system = system_account_name(server)
    conf = server.options.accounts
    acc_conf = conf.accounts.get(name) if conf is not None else None
    d: dict[str, Any] = {"account_name": name,
                         "update_time": rfc3339(getattr(account, "updated", server.start_time))}
    if name == system:
        d["is_system"] = True
    js = server.jetstream is not None and (acc_conf is None or acc_conf.jetstream.enabled)
    d.update({"expired": False, "complete": True, "jetstream_enabled": bool(js),
              "leafnode_connections": 0, "client_connections": account.connections,
              "subscriptions": account.subscription_count()})
    exports: list[dict[str, Any]] = list(SYSTEM_EXPORTS) if name == system else []
    imports: list[dict[str, Any]] = []
    if acc_conf is not None:
        for e in acc_conf.stream_exports:
            exports.append({"subject": e.subject, "type": "stream",
                            **({"account_ids": list(e.accounts)} if e.accounts else {})})
        for e in acc_conf.service_exports:
            exports.append({"subject": e.subject, "type": "service",
                            **({"account_ids": list(e.accounts)} if e.accounts else {}),
                            "response_type": _RESPONSE_TYPES.get(
                                str(e.response_type).lower(), "Singleton")})
        for i in acc_conf.stream_imports:
            imports.append({"subject": i.subject, "account": i.account,
                            "local_subject": i.local_subject, "type": "stream",
                            "invalid": False, "share": False, "tracking": False})
        for i in acc_conf.service_imports:
            imports.append({"subject": i.subject, "account": i.account, "to": i.local_subject,
                            "local_subject": i.local_subject, "type": "service",
                            "invalid": False, "share": i.share, "tracking": False})
    if system and getattr(server, "system", None) is not None:
        names = [(system, "$SYS.REQ.USER.INFO", "$SYS.REQ.USER.{}.INFO", True)] \
            if name == system else [(system, local, tmpl, share)
                                    for local, _k, tmpl, share in SYSTEM_ACCOUNT_IMPORTS]
        imports += [{"subject": tmpl.format(name), "account": sys_acc, "to": local,
                     "local_subject": local, "type": "service", "invalid": False,
                     "share": share, "tracking": False} for sys_acc, local, tmpl, share in names]
    if exports:
        d["exports"] = exports
    if imports:
        d["imports"] = imports
    d["name_tag"] = name
    d["sublist_stats"] = dict(account.sublist.stats())
    return d


def _traffic(msgs: int, data: int) -> dict[str, Any]:
    zero = {"msgs": 0, "bytes": 0}
    return {"msgs": msgs, "bytes": data, "gateways": dict(zero), "routes": dict(zero),
            "leafs": dict(zero)}


def account_statz(server: Server, account: Any) -> dict[str, Any]:
    """One account's connection and traffic counts (nats-server's AccountStat):
    `received` is what its clients published, `sent` what they were given,
    since the start (clients gone included)."""
    in_msgs, in_bytes, out_msgs, out_bytes = getattr(server, "account_closed", {}).get(
        account.name, (0, 0, 0, 0))
    for c in server.clients.values():
        if c.account is account:
            in_msgs += c.in_msgs
            in_bytes += c.in_bytes
            out_msgs += c.out_msgs
            out_bytes += c.out_bytes
    return {"acc": account.name, "name": account.name, "conns": account.connections,
            "leafnodes": 0, "total_conns": account.connections,
            "num_subscriptions": account.subscription_count(),
            "sent": _traffic(out_msgs, out_bytes), "received": _traffic(in_msgs, in_bytes),
            "slow_consumers": 0}


def accstatz(server: Server, query: dict[str, str]) -> dict[str, Any]:
    """/accstatz: accounts with connections (all with ?unused=1), or those named
    in ?accounts=a,b."""
    unused = query.get("unused") not in (None, "", "0", "false")
    wanted = [a for a in (query.get("accounts") or "").split(",") if a]
    if wanted:
        accounts = [server.accounts[a] for a in wanted if a in server.accounts]
    else:
        accounts = list(server.accounts.values())
    stats = [account_statz(server, a) for a in accounts if unused or a.connections > 0]
    return {"server_id": server.server_id, "now": rfc3339(time.time()), "account_statz": stats}


def routez(server: Server) -> dict[str, Any]:
    """nats-server's /routez shape; the cluster's routes fill `routes` once they exist."""
    cluster = getattr(server, "cluster", None)
    routes: list[dict[str, Any]] = []
    if cluster is not None and hasattr(cluster, "routez"):
        routes = cluster.routez()
    return {"server_id": server.server_id, "server_name": server.server_name,
            "now": rfc3339(time.time()), "num_routes": len(routes), "routes": routes}


def jsz(server: Server) -> dict[str, Any]:
    """The /jsz summary: its shape only (counts are not kept per server yet)."""
    o = server.options
    enabled = server.jetstream is not None
    return {"memory": 0, "storage": 0, "reserved_memory": 0, "reserved_storage": 0,
            "accounts": 0, "ha_assets": 0, "api": {"level": 0, "total": 0, "errors": 0},
            "server_id": server.server_id, "now": rfc3339(time.time()), "disabled": not enabled,
            "config": {"max_memory": 0, "max_storage": 0,
                       **({"store_dir": o.jetstream.store_dir} if enabled else {})},
            "streams": 0, "consumers": 0, "messages": 0, "bytes": 0, "total": 0}


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
    from node.jetstream.jszdetail import metric_lines  # JetStream's series, when it runs
    lines += metric_lines(server)
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
        body = "\n".join(["/varz", "/connz", "/routez", "/subsz", "/accountz", "/accstatz",
                           "/jsz", "/healthz", "/metrics"]) + "\n"
        return 200, "text/plain; charset=utf-8", body
    routes = {
        "/varz": lambda: varz(server),
        "/connz": lambda: connz(server, query),
        "/subsz": lambda: subsz(server, query),
        "/subscriptionsz": lambda: subsz(server, query),
        "/healthz": lambda: {"status": "ok"},
        "/routez": lambda: _routez(server, query),
        "/jsz": lambda: _jsz(server, query),
        "/accountz": lambda: accountz(server, query),
        # nats-server's HTTP handler reads only `unused` (the account filter is
        # for $SYS.REQ.ACCOUNT.<acc>.STATZ).
        "/accstatz": lambda: accstatz(server, {"unused": query.get("unused", "")}),
    }
    if path == "/metrics":
        return 200, "text/plain; version=0.0.4; charset=utf-8", metrics(server)
    fn = routes.get(path)
    if fn is None:
        return 404, "text/plain; charset=utf-8", "404 page not found\n"
    if path == "/accountz" and query.get("acc") and query["acc"] not in server.accounts:
        server.http_req_stats[path] = server.http_req_stats.get(path, 0) + 1
        return 400, "text/plain; charset=utf-8", f"Account {query['acc']} does not exist"
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
    # Anyone who reaches the port holds a socket (and a descriptor the client and
    # cluster listeners share) only for a bounded time: a request head in HEADER_TIMEOUT
    # of the connection (nats-server's ReadHeaderTimeout), a next one in IDLE_TIMEOUT,
    # a reply taken in WRITE_TIMEOUT.
    wait = HEADER_TIMEOUT
    try:
        while True:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), wait)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                return
            status, ctype, body, keep = _respond(server, head)
            data = body.encode()
            writer.write(
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(data)}\r\n"
                f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n".encode() + data)
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)
            if not keep:
                return
            wait = IDLE_TIMEOUT
    except (ConnectionError, OSError, TimeoutError):
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
