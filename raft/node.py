"""A Raft-only node process for process-level tests and benchmarks.

    python -m raft.node --id 1 --dir D --listen 127.0.0.1:P \\
        --peers 1=127.0.0.1:P,2=127.0.0.1:Q,3=127.0.0.1:R --control-port C \\
        [--groups 3] [--voters 1,2,3] [--sm full|count] [--snapshot-every N]

Hosts groups `g0`..`g<N-1>` (initial voters `--voters`, default every peer;
a node not among them joins empty, to be added with `add_member`). Each group
runs an append-log state machine. The control interface is newline-delimited
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
import signal
import struct
from typing import Any

from raft.multigroup import MultiRaft, NotLeader, ProposalDropped, create

_LEN = struct.Struct(">I")


class AppendLogSM:
    """Keeps every applied entry (`full`) or only counts them (`count`, benchmarks)."""

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.entries: list[tuple[int, bytes]] = []
        self.count = 0
        self.last = 0
        self.leader = (0, 0)

    def apply(self, index: int, data: bytes) -> None:
        if index <= self.last:
            raise AssertionError(f"apply {index} after {self.last}")
        self.last = index
        self.count += 1
        if self.keep:
            self.entries.append((index, data))

    def snapshot(self) -> bytes:
        head = struct.pack(">QQ", self.count, self.last)
        return head + b"".join(struct.pack(">QI", i, len(d)) + d for i, d in self.entries)

    def restore(self, data: bytes) -> None:
        self.count, self.last = struct.unpack_from(">QQ", data)
        self.entries = []
        pos = 16
        while pos < len(data):
            i, n = struct.unpack_from(">QI", data, pos)
            self.entries.append((i, data[pos + 12 : pos + 12 + n]))
            pos += 12 + n

    def on_leader_change(self, leader_id: int, term: int) -> None:
        self.leader = (leader_id, term)


class Control:
    """The JSON-lines control server of one node."""

    def __init__(self, mr: MultiRaft, sms: dict[str, AppendLogSM]) -> None:
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
            return {"entries": [[i, d.decode()] for i, d in sm.entries], "count": sm.count}
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
    mr = create(args.id, args.dir, args.listen, peers, tick_interval_s=args.tick,
                snapshot_every=args.snapshot_every)
    sms = {}
    for k in range(args.groups):
        sms[f"g{k}"] = AppendLogSM(keep=args.sm == "full")
        mr.add_group(f"g{k}", voters, state_machine=sms[f"g{k}"])
    await mr.start()
    server = await asyncio.start_server(Control(mr, sms).serve, "127.0.0.1", args.control_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"READY {args.id}", flush=True)
    await stop.wait()
    server.close()
    await mr.stop()


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
