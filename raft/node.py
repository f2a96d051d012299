"""A Raft-only node process for process-level tests and benchmarks.

    python -m raft.node --id 1 --dir D --listen 127.0.0.1:P \\
        --peers 1=127.0.0.1:P,2=127.0.0.1:Q,3=127.0.0.1:R --control-port C \\
        [--groups 3] [--voters 1,2,3] [--sm full|count] [--snapshot-every N]

Hosts groups `g0`..`g<N-1>` (initial voters `--voters`, default every peer;
a node not among them joins empty, to be added with `add_member`). Each group
runs an append-log state machine: in LMDB under `D/sm/g<k>` (`--sm full`),
or a bare counter (`--sm count`, benchmarks). The control interface is newline-delimited
JSON on 127.0.0.1:C; requests carry an `id`, are served concurrently, and
each response echoes it:

    {"id": 1, "op": "propose", "group": "g0", "data": "x"}  -> {"ok": true, "index": 7}
    errors: {"ok": false, "err": "not_leader", "leader": 2} / {"ok": false, "err": "..."}
    ops: propose, entries, status, stats, add_member, remove_member, transfer,
         read_index, snapshot
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import struct
import threading
from typing import Any

import lmdb

from raft.multigroup import MultiRaft, NotLeader, ProposalDropped, create

_LEN = struct.Struct(">I")


class LmdbSM:
    """An append-log state machine in LMDB, one environment per group.

    Each apply writes the entry under its index and the `applied` key in one
    write transaction. LMDB runs with `sync=False`: the Raft WAL is the
    source of truth, and after a restart the driver restores the last
    snapshot and re-applies the entries after it (an index at or below
    `applied` is skipped, so re-applying is harmless either way).
    """

    MAP_SIZE = 1 << 32  # address space only; the file grows as needed

    def __init__(self, dir: str) -> None:
        self.dir = dir
        self._env_dir = os.path.join(dir, "env")
        # Guards the env handle: restore_from swaps it from a worker thread.
        self._lock = threading.Lock()
        shutil.rmtree(self._env_dir + ".new", ignore_errors=True)  # an interrupted restore
        self.env = self._open(self._env_dir)
        self.leader = (0, 0)

    def _open(self, path: str) -> lmdb.Environment:
        os.makedirs(path, exist_ok=True)
        return lmdb.open(path, map_size=self.MAP_SIZE, sync=False, metasync=False,
                         readahead=False)

    def apply(self, index: int, data: bytes) -> None:
        key = index.to_bytes(8, "big")
        with self._lock, self.env.begin(write=True) as txn:
            if index <= _index(txn.get(_APPLIED)):
                return  # re-applied after a restart: already in the state
            txn.put(_ENTRY + key, data)
            txn.put(_APPLIED, key)

    def snapshot_to(self, path: str) -> int:
        """A compacted copy of the environment taken from one read transaction;
        the applied index read in that same transaction is exactly the image's."""
        with self._lock:
            env = self.env
            txn = env.begin()
        try:
            applied = _index(txn.get(_APPLIED))
            with open(path, "wb") as f:
                env.copyfd(f.fileno(), compact=True, txn=txn)
        finally:
            txn.abort()
        return applied

    def restore_from(self, path: str) -> None:
        """Copy the image into a fresh environment directory (sendfile: no
        buffering of the image), then swap it in."""
        fresh = self._env_dir + ".new"
        shutil.rmtree(fresh, ignore_errors=True)
        os.makedirs(fresh)
        if os.path.getsize(path):
            shutil.copyfile(path, os.path.join(fresh, "data.mdb"))
        with self._lock:
            self.env.close()
            shutil.rmtree(self._env_dir)
            os.replace(fresh, self._env_dir)
            self.env = self._open(self._env_dir)

    def on_leader_change(self, leader_id: int, term: int) -> None:
        self.leader = (leader_id, term)

    def entries(self) -> list[tuple[int, bytes]]:
        with self._lock, self.env.begin() as txn:
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
        with self._lock, self.env.begin() as txn:
            return txn.stat()["entries"] - (1 if txn.get(_APPLIED) is not None else 0)

    @property
    def applied(self) -> int:
        with self._lock, self.env.begin() as txn:
            return _index(txn.get(_APPLIED))

    def close(self) -> None:
        with self._lock:
            self.env.close()


_ENTRY = b"e"
_APPLIED = b"m:applied"


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
                snapshot_every=args.snapshot_every, on_fatal=on_fatal)
    sms = {}
    for k in range(args.groups):
        sms[f"g{k}"] = (LmdbSM(os.path.join(args.dir, "sm", f"g{k}")) if args.sm == "full"
                        else CountSM())
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
    for sm in sms.values():
        if isinstance(sm, LmdbSM):
            sm.close()
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
    ap.add_argument("--tick", type=float, default=0.1)
    ap.add_argument("--uvloop", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=os.environ.get("JETRAFT_LOG", "WARNING"))
    if args.uvloop:
        import uvloop

        uvloop.install()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
