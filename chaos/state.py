"""Final states for the checker: online through nats-py, offline from each node's LMDB.

Online (`client_view`): what a client connected to one node reads, message by message
(STREAM.MSG.GET; in a cluster the stream leader answers). Offline (`replica_views`): each
node's own copy, read after every node has stopped, with the node's own store classes
(node/jetstream/store/lmdbstore.py), so a replica that diverged shows up even when the
leader is right.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from chaos.checker import Streams, View
from chaos.workload import api


async def client_view(url: str, streams: list[str], source: str) -> View:
    import nats

    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=5)
    out: Streams = {}
    try:
        names = await _names(nc)
        for stream in sorted(set(streams) | names):
            info = await _retry_info(nc, stream)
            if info is None:
                continue
            # An empty stream says first 0 (or last+1 after a purge): nothing to read.
            first, last = max(1, info["state"]["first_seq"]), info["state"]["last_seq"]
            msgs: dict[int, str] = {}
            for lo in range(first, last + 1, 200):
                seqs = range(lo, min(last, lo + 199) + 1)
                got = await asyncio.gather(*(_get(nc, stream, s) for s in seqs))
                msgs.update((s, p) for s, p in zip(seqs, got, strict=True) if p is not None)
            out[stream] = msgs
    finally:
        await nc.close()
    return View(source, out, authoritative=True)


async def _names(nc: Any) -> set[str]:
    """Every stream the cluster knows (STREAM.NAMES, paged)."""
    names: set[str] = set()
    offset = 0
    while True:
        r = await api(nc, "STREAM.NAMES", json.dumps({"offset": offset}).encode(), timeout=5)
        if "error" in r:
            raise RuntimeError(f"STREAM.NAMES: {r['error']}")
        page = r.get("streams") or []
        names.update(page)
        offset += len(page)
        if not page or offset >= r.get("total", 0):
            return names


async def _retry_info(nc: Any, stream: str) -> dict[str, Any] | None:
    last: Any = None
    for _ in range(20):
        try:
            r = await api(nc, f"STREAM.INFO.{stream}", timeout=2)
        except Exception as e:  # noqa: BLE001 - no leader yet after the last fault
            last = e
        else:
            if "error" not in r:
                return r
            if r["error"].get("err_code") == 10059:  # stream not found
                return None
            last = r["error"]
        await asyncio.sleep(0.5)
    raise RuntimeError(f"STREAM.INFO {stream}: {last}")


async def _get(nc: Any, stream: str, seq: int) -> str | None:
    import base64

    for _ in range(20):
        try:
            r = await api(nc, f"STREAM.MSG.GET.{stream}", json.dumps({"seq": seq}).encode())
        except Exception:  # noqa: BLE001 - retried: a leader change mid-read
            await asyncio.sleep(0.25)
            continue
        if "message" in r:
            return base64.b64decode(r["message"].get("data", "")).decode()
        if r.get("error", {}).get("err_code") == 10037:  # no message found (deleted)
            return None
        await asyncio.sleep(0.25)
    raise RuntimeError(f"STREAM.MSG.GET {stream} {seq}: no answer")


def lmdb_view(store_dir: Path, source: str) -> View:
    """One node's replicas of every stream, read from its LMDB (the node must be down).
    Stream groups are named js.<stream>.<created_ns>; the newest incarnation wins."""
    from node.jetstream.store.lmdbstore import LmdbStore, NodeEnv, stored_names

    path = store_dir / "lmdb"
    if not path.is_dir():
        return View(source, {})
    env = NodeEnv(str(path))
    try:
        newest: dict[str, tuple[int, str]] = {}
        for group in stored_names(env):
            parts = group.split(".")
            if len(parts) != 3 or parts[0] != "js" or not parts[2].isdigit():
                continue  # the catalogue and anything else that is not a stream
            created = int(parts[2])
            if created >= newest.get(parts[1], (-1, ""))[0]:
                newest[parts[1]] = (created, group)
        out: Streams = {}
        for stream, (_, group) in newest.items():
            store = LmdbStore(env, group)
            msgs: dict[int, str] = {}
            for seq in store.seqs():
                m = store.load(seq)
                if m is not None:
                    msgs[seq] = m.data.decode(errors="replace")
            out[stream] = msgs
        return View(source, out)
    finally:
        env.close()


def dump(views: list[View], path: Path) -> None:
    path.write_text(json.dumps([{"source": v.source, "authoritative": v.authoritative,
                                 "streams": {s: {str(k): p for k, p in m.items()}
                                             for s, m in v.streams.items()}}
                                for v in views]))


def load(path: Path) -> list[View]:
    raw = json.loads(path.read_text())
    return [View(v["source"], {s: {int(k): p for k, p in m.items()}
                               for s, m in v["streams"].items()}, v["authoritative"])
            for v in raw]
