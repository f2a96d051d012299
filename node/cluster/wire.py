"""Conversions between the cluster's protobuf messages and its pure types,
and route URL parsing. No I/O."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from node.cluster.interest import Change
from node.cluster.members import Member
from proto import cluster_pb2 as pb

ROUTE_SCHEMES = ("nats-route", "nats", "tls", "route")
WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")


def member_to_pb(m: Member) -> pb.MemberInfo:
    return pb.MemberInfo(
        peer_id=m.peer_id, name=m.name, cluster_addr=m.cluster_addr, client_urls=m.client_urls,
        ws_urls=m.ws_urls, tags=m.tags, jetstream=m.jetstream, version=m.version,
        server_id=m.server_id, healthy=m.healthy, lame_duck=m.lame_duck, store_max=m.store_max,
        store_used=m.store_used, start_ms=m.start_ms, shutdown=m.shutdown,
        account_conns=m.account_conns, raft_addr=m.raft_addr)


def member_from_pb(p: pb.MemberInfo) -> Member:
    return Member(
        peer_id=p.peer_id, name=p.name, cluster_addr=p.cluster_addr,
        client_urls=list(p.client_urls), ws_urls=list(p.ws_urls), tags=list(p.tags),
        jetstream=p.jetstream, version=p.version, server_id=p.server_id, healthy=p.healthy,
        lame_duck=p.lame_duck, store_max=p.store_max, store_used=p.store_used,
        start_ms=p.start_ms, shutdown=p.shutdown, account_conns=dict(p.account_conns),
        raft_addr=p.raft_addr)


def change_to_pb(c: Change) -> pb.RouteOp:
    return pb.RouteOp(interest=pb.Interest(account=c.account, subject=c.subject, queue=c.queue,
                                           weight=c.weight))


def change_from_pb(i: pb.Interest) -> Change:
    return Change(i.account, i.subject, i.queue, i.weight)


@dataclass(frozen=True)
class RouteURL:
    addr: str  # host:port of a peer's cluster port
    credentials: str | None  # "user u:p" or None (the node's own are used)
    text: str


def parse_route_url(text: str) -> RouteURL:
    """`nats-route://[user:pass@]host:port` (also nats://, tls://, bare host:port)."""
    raw = text.strip()
    parts = urlsplit(raw if "://" in raw else f"nats-route://{raw}")
    if parts.scheme not in ROUTE_SCHEMES:
        raise ValueError(f"route URL {text!r}: unsupported scheme {parts.scheme!r}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or not 0 < port < 65536:
        raise ValueError(f"route URL {text!r}: expected nats-route://host:port")
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    cred = None
    if parts.username is not None:
        cred = f"user {unquote(parts.username)}:{unquote(parts.password or '')}"
    return RouteURL(f"{host}:{port}", cred, raw)


def public_host(host: str, fallback: str = "127.0.0.1") -> str:
    """A host others can dial for a listener bound to `host`."""
    return fallback if host in WILDCARD_HOSTS else host
