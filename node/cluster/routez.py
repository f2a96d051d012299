"""`/routez` and the `/varz` cluster block, shaped like nats-server's.

nats-server lists one entry per route connection (a pool of several per
peer); Jetraft has one route per peer (its gRPC connections), so `num_routes`
counts peers. Fields nats-server has and Jetraft fills from its own view:
`rid` (a stable number per peer), `ip`/`port` (the peer's cluster address),
`rtt` (the last gossip round trip), `pending_size` (bytes queued to the peer).
"""

from __future__ import annotations

import time
from typing import Any

from node.monitor import go_duration, rfc3339


def _rtt(seconds: float) -> str:
    us = seconds * 1e6
    if us < 1000:
        return f"{us:.0f}\u00b5s"
    return f"{us / 1000:.3f}ms"


def routez(server: Any, query: dict[str, str]) -> dict[str, Any]:
    cluster = server.cluster
    now = time.time()
    out: dict[str, Any] = {"server_id": server.server_id, "server_name": server.server_name,
                           "now": rfc3339(now), "num_routes": 0, "routes": []}
    if cluster is None or cluster.table is None:
        return out
    subs = query.get("subs", "") in ("1", "true", "detail")
    routes = []
    for link in sorted(cluster.links.values(), key=lambda x: x.name):
        m = cluster.table.members.get(link.peer)
        host, _, port = link.addr.rpartition(":")
        entry: dict[str, Any] = {
            "rid": cluster.rid(link.peer),
            "remote_id": m.server_id if m else "",
            "remote_name": link.name,
            "did_solicit": True,
            "is_configured": link.solicited,
            "ip": host.strip("[]"),
            "port": int(port) if port.isdigit() else 0,
            "start": rfc3339(link.start),
            "last_activity": rfc3339(link.last_activity),
            "rtt": _rtt(link.rtt),
            "uptime": go_duration(now - link.start),
            "idle": go_duration(max(0.0, now - link.last_activity)),
            "pending_size": link.queued_bytes + link.pending_bytes,
            "in_msgs": link.in_msgs,
            "out_msgs": link.out_msgs,
            "in_bytes": link.in_bytes,
            "out_bytes": link.out_bytes,
            "subscriptions": cluster.remote.count(link.peer),
        }
        if subs:
            entry["subscriptions_list"] = sorted(cluster.remote.subjects(link.peer))
        entry["compression"] = "off"
        routes.append(entry)
    out["num_routes"] = len(routes)
    out["routes"] = routes
    return out


def varz_cluster(server: Any) -> dict[str, Any]:
    o = server.options.cluster
    cluster = server.cluster
    block: dict[str, Any] = {}
    if cluster is not None and cluster.name:
        block["name"] = cluster.name
    block["addr"] = o.host
    block["cluster_port"] = cluster.port if cluster is not None else o.port
    block["auth_timeout"] = int(o.auth_timeout) if float(o.auth_timeout).is_integer() \
        else o.auth_timeout
    if cluster is not None and cluster.seeds:
        block["urls"] = [s.addr for s in cluster.seeds]
    block["tls_timeout"] = o.tls.timeout if o.tls else 2
    if o.tls is not None:
        block["tls_required"] = True
        block["tls_verify"] = True
    block["pool_size"] = 1
    return block
