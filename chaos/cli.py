"""`python -m chaos run ...`, `python -m chaos check <dir>`, `python -m chaos faults`."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaos.faults import FAULTS, applicable
from chaos.run import RunConfig, check_dir, execute
from chaos.workload import Spec


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one run: nodes, workload, faults, check, report")
    r.add_argument("--nodes", type=int, default=1, choices=[1, 3, 5])
    r.add_argument("--fault", default="kill-leader",
                   help="a fault, a comma list, or 'mixed' (see `faults`)")
    r.add_argument("--duration", type=float, default=60.0, help="seconds of faults")
    r.add_argument("--interval", type=float, default=8.0, help="mean seconds between faults")
    r.add_argument("--hold", type=float, default=3.0, help="seconds a fault lasts")
    r.add_argument("--net", choices=["loopback", "netns"], default="loopback")
    r.add_argument("--publishers", type=int, default=3)
    r.add_argument("--consumers", type=int, default=2)
    r.add_argument("--replicas", type=int, default=0, help="stream R (default min(3, nodes))")
    r.add_argument("--creators", type=int, default=1,
                   help="clients creating streams during the run (0: none)")
    r.add_argument("--kv-clients", type=int, default=2,
                   help="clients doing per-key CAS and reads on an R-replica KV bucket")
    r.add_argument("--kv-keys", type=int, default=4, help="keys the KV clients share")
    r.add_argument("--rate", type=float, default=0.0, help="publishes/s per publisher (0: max)")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--workdir", type=Path, default=None, help="default: a new temp dir")
    r.add_argument("--audit", choices=["auto", "on", "off"], default="auto",
                   help="end with `jetraft audit` over every node's data and the acked "
                        "writes (auto: when pyspark and Java are installed)")
    c = sub.add_parser("check", help="re-check a finished run directory")
    c.add_argument("workdir", type=Path)
    sub.add_parser("faults", help="list the faults")
    return p


def _audit_wanted(mode: str) -> tuple[bool, str]:
    """(run the audit, why it cannot run when asked for)."""
    if mode == "off":
        return False, ""
    from chaos.audit import available

    ok, why = available()
    return ok, ("" if ok or mode == "auto" else why)


async def _cancellable(coro: Any) -> Any:
    """SIGTERM / SIGINT cancel the run, so its `finally` stops the nodes (they run in
    their own sessions and would otherwise outlive it) and removes the namespaces."""
    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    return await task


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "faults":
        for f in FAULTS.values():
            extra = f" (>= {f.min_nodes} nodes)" if f.min_nodes > 1 else ""
            extra += " (--net netns)" if f.needs_net else ""
            print(f"{f.name:18} {f.doc}{extra}")
        print(f"{'mixed':18} a random applicable fault each time")
        return 0
    if args.cmd == "check":
        out = check_dir(args.workdir)
        print(json.dumps(out, indent=2))
        return 0 if out["ok"] else 1
    why = applicable(args.fault, args.nodes, args.net == "netns")
    if why:
        print(f"chaos: {why}", file=sys.stderr)
        return 2
    audit, why = _audit_wanted(args.audit)
    if why:
        print(f"chaos: --audit on: {why}", file=sys.stderr)
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
    spec = Spec(replicas=args.replicas or min(3, args.nodes), publishers=args.publishers,
                consumers=args.consumers, rate=args.rate, creators=args.creators,
                kv_clients=args.kv_clients, kv_keys=args.kv_keys)
    cfg = RunConfig(workdir=workdir, nodes=args.nodes, fault=args.fault,
                    duration=args.duration, interval=args.interval, hold=args.hold,
                    net=args.net, seed=args.seed, spec=spec, audit=audit)
    try:
        report = asyncio.run(_cancellable(execute(cfg)))
    except asyncio.CancelledError:
        print(f"chaos: cancelled (nodes stopped); history so far in {workdir}", file=sys.stderr)
        return 130
    print((workdir / "report.md").read_text())
    print(f"run directory: {workdir}")
    return 0 if report["ok"] else 1
