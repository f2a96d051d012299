"""A Raft-only node process for process-level tests and benchmarks.

    python -m raft.node --id 1 --dir D --listen 127.0.0.1:P \\
        --peers 1=127.0.0.1:P,2=127.0.0.1:Q,3=127.0.0.1:R --control-port C \\
        [--groups 3] [--voters 1,2,3] [--sm full|count] [--snapshot-every N]
        [--segment-bytes N]

Hosts groups `g0`..`g<N-1>` (initial voters `--voters`, default every peer;
a node not among them joins empty, to be added with `add_member`). Each group
runs an append-log state machine: a named database `g<k>` in the node's one
LMDB environment under `D/sm` (`--sm full`),
or a bare counter (`--sm count`, benchmarks). The control interface is newline-delimited
JSON on 127.0.0.1:C; requests carry an `id`, are served concurrently, and
each response echoes it:

    {"id": 1, "op": "propose", "group": "g0", "data": "x"}  -> {"ok": true, "index": 7}
    errors: {"ok": false, "err": "not_leader", "leader": 2} / {"ok": false, "err": "..."}
    ops: propose, entries, status, stats, activity, add_member, remove_member,
         transfer, read_index, snapshot
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import struct
from typing import Any

import lmdb

from raft.multigroup import MultiRaft, NotLeader, ProposalDropped, create

_LEN = struct.Struct(">I")


class LmdbStore:
    """One LMDB environment per node; each group's state machine is a named
    database in it (`LmdbSM`). One environment instead of one per group: a
    single map and file, one reader table, one set of file descriptors, and
    pages shared between groups (a 4 GiB map per group is 40 TiB of address
    space at 10,000 groups).

    LMDB runs with `sync=False`: the Raft WAL is the source of truth and every
    entry is re-applied from it after a crash; the state machines skip what
    they already hold (their `applied` key). `sync()` (called before a
    snapshot image is taken) makes everything applied so far durable.
    """

    MAP_SIZE = 1 << 40  # address space only; the file grows as needed
    MAX_DBS = 1 << 16  # named databases: one per group hosted on the node

    def __init__(self, dir: str) -> None:
        self.dir = dir
        os.makedirs(dir, exist_ok=True)
        self.env = lmdb.open(dir, map_size=self.MAP_SIZE, max_dbs=self.MAX_DBS, sync=False,
                             metasync=False, readahead=False)

    def db(self, name: str) -> Any:
        return self.env.open_db(name.encode(), create=True)

    def sync(self) -> None:
        self.env.sync(True)

    def close(self) -> None:
        self.env.close()


class LmdbSM:
    """An append-log state machine: one named database in the node's LMDB
    environment (`LmdbStore`).

    A batch of committed entries and the `applied` key are written in ONE
    write transaction (`apply_batch`, in the driver's apply worker); an entry
    at or below `applied` is skipped, so re-applying after a restart is
    harmless. `applied_index()` tells the driver what the database already
    holds, so a restart does not copy the snapshot image back when the state
    is already there. Images are this group's records only (`snapshot_to`),
    read from one read transaction together with its `applied` key.
    """

    def __init__(self, store: LmdbStore | str, group: str = "sm") -> None:
        # A path opens a store of its own (tests, a single group).
        self._own = isinstance(store, str)
        self.store = LmdbStore(store) if isinstance(store, str) else store
        self.group = group
        self.env = self.store.env
        self.db = self.store.db(group)
        self.leader = (0, 0)

    def apply(self, index: int, data: bytes) -> None:
        self.apply_batch([(index, data)])

    def apply_batch(self, items: list[tuple[int, bytes]]) -> None:
        with self.env.begin(write=True, db=self.db) as txn:
            applied = _index(txn.get(_APPLIED))
            for index, data in items:
                if index > applied:  # else: re-applied after a restart
                    txn.put(_ENTRY + index.to_bytes(8, "big"), data)
                    applied = index
            txn.put(_APPLIED, applied.to_bytes(8, "big"))

    def applied_index(self) -> int:
        with self.env.begin(db=self.db) as txn:
            return _index(txn.get(_APPLIED))

    def snapshot_to(self, path: str) -> int:
        """This group's records from one read transaction (length-prefixed
        key/value pairs); the applied index read in it is exactly the image's."""
        self.store.sync()  # what the image says is applied is durable here too
        with self.env.begin(db=self.db) as txn, open(path, "wb") as f:
            applied = _index(txn.get(_APPLIED))
            for k, v in txn.cursor():
                f.write(_KV.pack(len(k), len(v)))
                f.write(k)
                f.write(v)
        return applied

    RESTORE_TXN_BYTES = 16 << 20

    def restore_from(self, path: str) -> None:
        """Replace this group's records by an image, in write transactions of
        about RESTORE_TXN_BYTES: LMDB has one writer per environment, so one
        huge transaction would stall every other group's applies. The first
        transaction empties the database (the `applied` key too) and the
        `applied` key is written last, so a crash midway leaves
        `applied_index()` at 0 and the driver restores again."""
        with open(path, "rb") as f:
            applied: bytes | None = None
            txn = self.env.begin(write=True, db=self.db)
            try:
                txn.drop(self.db, delete=False)
                size = 0
                while head := f.read(_KV.size):
                    if len(head) != _KV.size:
                        raise ValueError(f"{path}: image truncated")
                    klen, vlen = _KV.unpack(head)
                    key, value = f.read(klen), f.read(vlen)
                    if len(key) != klen or len(value) != vlen:
                        raise ValueError(f"{path}: image truncated")
                    if key == _APPLIED:
                        applied = value
                        continue
                    txn.put(key, value)
                    size += klen + vlen
                    if size >= self.RESTORE_TXN_BYTES:
                        txn.commit()
                        txn, size = self.env.begin(write=True, db=self.db), 0
                if applied is not None:
                    txn.put(_APPLIED, applied)
                txn.commit()
            except BaseException:
                txn.abort()
                raise

    def on_leader_change(self, leader_id: int, term: int) -> None:
        self.leader = (leader_id, term)

    def entries(self) -> list[tuple[int, bytes]]:
        with self.env.begin(db=self.db) as txn:
            cur = txn.cursor()
            out = []
            if cur.set_range(_ENTRY):
                for k, v in cur:
                    if not k.startswith(_ENTRY):
                        break
                    out.append((int.from_bytes(k[1:], "big"), bytes(v)))
            return out

    @property
    def count(self) -> int:
        with self.env.begin(db=self.db) as txn:
            return txn.stat(self.db)["entries"] - (1 if txn.get(_APPLIED) is not None else 0)

    @property
    def applied(self) -> int:
        return self.applied_index()

    def close(self) -> None:
        if self._own:
            self.store.close()


_ENTRY = b"e"
_APPLIED = b"m:applied"
_KV = struct.Struct(">II")


def _index(raw: bytes | None) -> int:
    return int.from_bytes(raw, "big") if raw else 0


class CountSM:
    """Only counts applied entries (benchmarks); its image is 16 bytes."""

    def __init__(self) -> None:
        self.state = (0, 0)  # (count, last index): one tuple, read atomically by snapshot_to
        self.leader = (0, 0)

    def apply(self, index: int, data: bytes) -> None:
        count, last = self.state
        if index > last:
            self.state = (count + 1, index)

    def snapshot_to(self, path: str) -> int:
        count, last = self.state
        with open(path, "wb") as f:
            f.write(struct.pack(">QQ", count, last))
        return last

    def restore_from(self, path: str) -> None:
        with open(path, "rb") as f:
            raw = f.read(16)
        self.state = struct.unpack(">QQ", raw) if raw else (0, 0)

    def on_leader_change(self, leader_id: int, term: int) -> None:
        self.leader = (leader_id, term)

    def entries(self) -> list[tuple[int, bytes]]:
        return []

    @property
    def count(self) -> int:
        return self.state[0]


class Control:
    """The JSON-lines control server of one node."""

    def __init__(self, mr: MultiRaft, sms: dict[str, Any]) -> None:
        self.mr = mr
        self.sms = sms

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks: set[asyncio.Task[None]] = set()
        try:
            while line := await reader.readline():
                task = asyncio.ensure_future(self._one(json.loads(line), writer))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            for t in tasks:
                t.cancel()
            writer.close()

    async def _one(self, req: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        try:
            resp = {"ok": True, **(await self._handle(req))}
        except NotLeader as e:
            resp = {"ok": False, "err": "not_leader", "leader": e.leader_id}
        except (ProposalDropped, TimeoutError, KeyError, ValueError) as e:
            resp = {"ok": False, "err": type(e).__name__, "detail": str(e)}
        resp["id"] = req.get("id")
        writer.write(json.dumps(resp).encode() + b"\n")

    async def _handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op, group = req["op"], req.get("group", "g0")
        mr = self.mr
        if op == "propose":
            return {"index": await mr.propose(group, req["data"].encode())}
        if op == "entries":
            sm = self.sms[group]
            return {"entries": [[i, d.decode()] for i, d in sm.entries()], "count": sm.count}
        if op == "status":
            return {"status": mr.status(group)}
        if op == "stats":
            return {"driver": vars(mr.stats), "wal": _slots(mr.node_log.stats),
                    "leaders": sum(1 for g in mr.groups() if mr.leader(g) == mr.node_id)}
        if op == "activity":
            return {"activity": mr.activity()}
        if op == "add_member":
            return {"index": await mr.add_member(group, req["node"], req.get("learner", False))}
        if op == "remove_member":
            return {"index": await mr.remove_member(group, req["node"])}
        if op == "transfer":
            await mr.transfer_leader(group, req["node"])
            return {}
        if op == "read_index":
            await mr.read_index(group)
            return {"applied": mr.status(group)["applied"]}
        if op == "snapshot":
            mr.snapshot_now(group)
            return {}
        raise ValueError(f"unknown op {op!r}")


def _slots(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__slots__}


def parse_peers(text: str) -> dict[int, str]:
    out = {}
    for part in text.split(","):
        nid, addr = part.split("=", 1)
        out[int(nid)] = addr
    return out


async def run(args: argparse.Namespace) -> None:
    peers = parse_peers(args.peers)
    voters = [int(x) for x in args.voters.split(",")] if args.voters else sorted(peers)
    stop = asyncio.Event()
    fatal: list[BaseException] = []

    def on_fatal(exc: BaseException) -> None:  # fail-stop: the process exits, non-zero
        fatal.append(exc)
        stop.set()

    mr = create(args.id, args.dir, args.listen, peers, tick_interval_s=args.tick,
                snapshot_every=args.snapshot_every, on_fatal=on_fatal,
                log_options={"segment_bytes": args.segment_bytes},
                direct=parse_peers(args.direct) if args.direct else None)
    sms = {}
    store = LmdbStore(os.path.join(args.dir, "sm")) if args.sm == "full" else None
    for k in range(args.groups):
        sms[f"g{k}"] = LmdbSM(store, f"g{k}") if store is not None else CountSM()
        mr.add_group(f"g{k}", voters, state_machine=sms[f"g{k}"])
    await mr.start()
    server = await asyncio.start_server(Control(mr, sms).serve, "127.0.0.1", args.control_port)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"READY {args.id}", flush=True)
    await stop.wait()
    server.close()
    await mr.stop()
    if store is not None:
        store.close()
    if fatal:
        print(f"[FTL] node {args.id} stopped: {fatal[0]!r}", flush=True)
        raise SystemExit(70)  # EX_SOFTWARE: a supervisor restarts it from disk


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m raft.node")
    ap.add_argument("--id", type=int, required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--listen", required=True)
    ap.add_argument("--peers", required=True)
    ap.add_argument("--control-port", type=int, required=True)
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--voters", default="")
    ap.add_argument("--sm", choices=("full", "count"), default="full")
    ap.add_argument("--snapshot-every", type=int, default=10_000)
    ap.add_argument("--segment-bytes", type=int, default=64 << 20)
    ap.add_argument("--tick", type=float, default=0.1)
    ap.add_argument("--uvloop", action="store_true")
    ap.add_argument("--direct", default="",
                    help="id=host:port,... direct TCP lanes (raft/tcp_lane.py) instead of gRPC")
    args = ap.parse_args(argv)
    logging.basicConfig(level=os.environ.get("JETRAFT_LOG", "WARNING"))
    if args.uvloop:
        import uvloop

        uvloop.install()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
