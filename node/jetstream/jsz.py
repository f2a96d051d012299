"""`/jsz`: JetStream's monitoring page (nats-server's shape, the fields Jetraft has).

With a cluster it carries `meta_cluster` (the meta group's leader, its peers with their lag,
this node's peer name); `?raft=1` adds the Raft state of the meta group and of every stream
group this node hosts (term, commit, applied, voters), and `raft_transport`: what carries
Raft to each peer (the direct TCP lane or its gRPC fallback) with the fallback counters."""

from __future__ import annotations

import time
from typing import Any


def jsz(server: Any, query: dict[str, str]) -> dict[str, Any]:
    """jsgaps' detailed single-node page (node/jetstream/jszdetail.py) when present, plus
    `meta_cluster` (after "bytes", where nats-server puts it) and `raft`."""
    try:
        from node.jetstream import jszdetail  # type: ignore[attr-defined]
    except ImportError:
        out = _basic(server)
    else:
        out = jszdetail.jsz(server, query)
    return _with_cluster(server, out, query)


def _with_cluster(server: Any, base: dict[str, Any], query: dict[str, str]) -> dict[str, Any]:
    svc = server.jetstream
    if svc is None:
        return base
    unique = server.options.jetstream.unique_tag
    if unique and isinstance(base.get("config"), dict):
        base["config"]["unique_tag"] = unique  # nats-server shows it in /jsz and /varz
    out: dict[str, Any] = {}
    for k, v in base.items():
        out[k] = v
        if k == "bytes" and svc.jsc is not None:
            out["meta_cluster"] = svc.jsc.jsz_meta()
    if svc.jsc is not None:
        out.setdefault("meta_cluster", svc.jsc.jsz_meta())
    if query.get("raft") in ("1", "true") and svc.mr is not None:
        groups = {}
        for group in sorted(svc.mr.groups()):
            st = svc.mr.status(group)
            groups[group] = {k: st[k] for k in ("state", "term", "commit", "applied",
                                                "learners")}
            groups[group]["leader"] = f"{st['leader']:016x}" if st["leader"] else ""
            groups[group]["voters"] = [f"{v:016x}" for v in st["voters"]]
        out["raft"] = groups
        lanes = _raft_lanes(svc.mr.transport)
        if lanes is not None:
            out["raft_transport"] = lanes
    return out


def _raft_lanes(transport: Any) -> dict[str, Any] | None:
    """What carries Raft to each peer now ("direct" TCP lane, "grpc", "down"; priority
    and bulk lane) and the direct lane's fallback counters (`?raft=1` only)."""
    kinds = getattr(transport, "lane_kinds", None)
    if kinds is None:
        return None
    peers = {f"{p:016x}": {"priority": pri, "bulk": bulk}
             for p, (pri, bulk) in sorted(kinds().items())}
    return {"peers": peers, **transport.lane_stats()}


def _basic(server: Any) -> dict[str, Any]:
    svc = server.jetstream
    o = server.options.jetstream
    out: dict[str, Any] = {"server_id": server.server_id,
                           "now": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if svc is None:
        out["disabled"] = True
        return out
    config = {"max_memory": o.max_mem, "max_storage": o.max_file, "store_dir": svc.store_dir,
              "sync_interval": o.sync_interval}
    if o.domain:
        config["domain"] = o.domain
    if o.unique_tag:
        config["unique_tag"] = o.unique_tag
    streams = consumers = messages = size = 0
    for sm in list(svc.streams.values()):
        with sm.lock:
            streams += 1
            consumers += len(sm.stream.consumers)
            messages += sm.store.msgs()
            size += sm.store.bytes()
    out.update({"config": config, "memory": 0, "storage": size, "reserved_memory": 0,
                "reserved_storage": 0, "accounts": 1, "ha_assets": streams, "api": {
                    "total": svc.api_total, "errors": svc.api_errors},
                "streams": streams, "consumers": consumers, "messages": messages,
                "bytes": size})
    return out


def healthy(server: Any) -> tuple[bool, str]:
    """Ready for /healthz: clustered JetStream must have caught up with the meta group and
    with every group assigned to this node."""
    svc = server.jetstream
    if svc is None or svc.jsc is None:
        return True, ""
    if svc.jsc.healthy():
        return True, ""
    return False, "JetStream is not current with the meta leader or its assigned groups"
