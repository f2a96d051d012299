"""One chaos run: start N nodes, run the workload under a fault schedule, heal, drain,
read every node's final state, check, and write the report.

Files in the run directory: history.jsonl, state.json (every view), report.json,
report.md, n<i>/node.log (+ each node's store, kept for the audit). With `audit` (the
default when pyspark and Java are installed) the run ends with `jetraft audit` over every
node's directory and the acked writes (chaos/audit.py): acked.jsonl, audit/report.html, and
the run fails on any audit violation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from chaos import checker, kv_workload, state
from chaos.faults import Nemesis
from chaos.history import History, read
from chaos.nodes import Cluster, Loopback
from chaos.workload import CONSUMER, Spec, Workload, api, connect

# A stream that never gets a leader again must not hang the run: the report says so.
CLIENT_VIEW_TIMEOUT = 120.0


@dataclass
class RunConfig:
    workdir: Path
    nodes: int = 1
    fault: str = "kill-leader"
    duration: float = 60.0
    interval: float = 8.0  # mean seconds between faults (uniform in [interval/2, interval])
    hold: float = 3.0  # seconds a fault stays before it is healed
    net: str = "loopback"  # or "netns"
    seed: int = 1
    settle: float = 3.0  # seconds after the last heal before the drain
    spec: Spec | None = None
    audit: bool = False  # run `jetraft audit` over the node dirs at the end (chaos/audit.py)


def _has_cluster() -> bool:
    import importlib.util

    return importlib.util.find_spec("node.cluster") is not None


async def _find_leader(urls: list[str], stream: str) -> str | None:
    """The stream leader's server name, through any node that answers."""
    for url in urls:
        try:
            nc = await asyncio.wait_for(connect([url], "chaos-nemesis"), 3)
        except Exception:  # noqa: BLE001 - that node is down: ask another
            continue
        try:
            r = await api(nc, f"STREAM.INFO.{stream}", timeout=2)
            leader = r.get("cluster", {}).get("leader")
            if leader:
                return str(leader)
        except Exception:  # noqa: BLE001
            pass
        finally:
            with contextlib.suppress(Exception):
                await nc.close()
    return None


async def execute(cfg: RunConfig) -> dict[str, Any]:
    spec = cfg.spec or Spec(replicas=min(3, cfg.nodes))
    cfg.workdir.mkdir(parents=True, exist_ok=True)
    if cfg.nodes > 1 and not _has_cluster():
        raise SystemExit("this checkout has no cluster (node/cluster, branch `routes`): "
                         "run with --nodes 1")
    net: Any = None
    if cfg.net == "netns":
        from chaos.net import Netns, available

        ok, why = available()
        if not ok:
            raise SystemExit(f"--net netns: {why}")
        net = Netns(cfg.nodes)
        net.setup()
    hist_path = cfg.workdir / "history.jsonl"
    hist_path.unlink(missing_ok=True)
    h = History(hist_path)
    cluster = Cluster(cfg.workdir, cfg.nodes, net or Loopback())
    started = time.time()
    views: list[checker.View] = []
    errors: list[str] = []
    try:
        h.add("run", "info", "start", nodes=cfg.nodes, fault=cfg.fault, seed=cfg.seed)
        await asyncio.to_thread(cluster.start)
        w = Workload(h, cluster.urls(), spec, seed=cfg.seed)
        await w.setup()
        if spec.kv_clients:
            await kv_workload.setup_bucket(cluster.urls(), spec, h)
        nemesis = Nemesis(h, cluster, spec.stream,
                          lambda: _find_leader(cluster.urls(), spec.stream), net, cfg.seed)
        quiet = math.ceil(spec.ack_wait) + 3
        pubs = [asyncio.create_task(w.publisher(i)) for i in range(spec.publishers)]
        cons = [asyncio.create_task(w.consumer(i, quiet)) for i in range(spec.consumers)]
        pubs += [asyncio.create_task(w.creator(i)) for i in range(spec.creators)]
        pubs += [asyncio.create_task(kv_workload.kv_client(
            h, cluster.urls(), spec, i, spec.kv_keys, w.stop_publishing, cfg.seed))
            for i in range(spec.kv_clients)]
        stop_faults = asyncio.Event()
        nem = asyncio.create_task(nemesis.run(cfg.fault, stop_faults, cfg.interval, cfg.hold))
        await asyncio.sleep(cfg.duration)
        stop_faults.set()
        await nem
        nemesis.heal_all()
        for node in cluster.nodes:  # a restart that failed mid-fault
            if not node.alive():
                errors.append(f"{node.name} was down at the end: restarted")
                await asyncio.to_thread(node.start)
        h.add("run", "info", "healed")
        await asyncio.sleep(cfg.settle)
        w.stop_publishing.set()
        await asyncio.gather(*pubs, return_exceptions=True)
        w.stop_consuming.set()
        drained = await asyncio.wait(cons, timeout=120)
        for t in drained[1]:
            t.cancel()
            errors.append("a consumer did not drain in 120 s")
        h.add("run", "info", "drained")
        try:
            nc = await connect(cluster.urls(), "chaos-final")
            try:
                info = await api(nc, f"CONSUMER.INFO.{spec.stream}.{CONSUMER}", timeout=10)
            finally:
                await nc.close()
            if "error" in info:
                errors.append(f"CONSUMER.INFO after the drain: {info['error']}")
            else:
                h.add("run", "ok", "consumer-final", stream=spec.stream, consumer=CONSUMER,
                      info={k: info.get(k) for k in ("ack_floor", "delivered", "num_ack_pending",
                                                     "num_pending", "num_redelivered")})
        except Exception as e:  # noqa: BLE001
            errors.append(f"CONSUMER.INFO after the drain: {e!r}")
        for node in cluster.nodes:
            try:
                views.append(await asyncio.wait_for(
                    state.client_view(node.url, [spec.stream], f"client@{node.name}"),
                    CLIENT_VIEW_TIMEOUT))
            except Exception as e:  # noqa: BLE001 - reported, and the checker sees no view
                errors.append(f"client view through {node.name}: {e!r}")
    finally:
        await asyncio.to_thread(cluster.stop)
        if net is not None:
            net.teardown()
        h.close()
    for node in cluster.nodes:
        try:
            views.append(state.lmdb_view(node.store_dir, f"lmdb@{node.name}"))
        except Exception as e:  # noqa: BLE001
            errors.append(f"offline read of {node.name}: {e!r}")
    state.dump(views, cfg.workdir / "state.json")
    verdict = checker.check(read(hist_path), views)
    audited = None
    if cfg.audit:
        from chaos.audit import run_audit

        audited = await asyncio.to_thread(run_audit, cfg.workdir,
                                          [n.dir for n in cluster.nodes], read(hist_path))
    report = {
        "ok": verdict.ok and not errors and (audited is None or audited["ok"]),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()
                   if k != "spec"} | {"spec": asdict(spec)},
        "wall_s": round(time.time() - started, 1),
        "faults_injected": nemesis.count,
        "stats": verdict.stats,
        "anomalies": [{"kind": a.kind, **a.detail} for a in verdict.anomalies],
        "errors": errors,
        "audit": audited,
    }
    write_report(cfg.workdir, report)
    return report


def check_dir(workdir: Path) -> dict[str, Any]:
    """Re-check a finished run from its files (history.jsonl + state.json)."""
    views = state.load(workdir / "state.json")
    verdict = checker.check(read(workdir / "history.jsonl"), views)
    return {"ok": verdict.ok, "stats": verdict.stats,
            "anomalies": [{"kind": a.kind, **a.detail} for a in verdict.anomalies]}


def write_report(workdir: Path, report: dict[str, Any]) -> None:
    (workdir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    c = report["config"]
    lines = [
        f"# Chaos run: {'PASS' if report['ok'] else 'FAIL'}",
        "",
        f"- nodes {c['nodes']}, fault `{c['fault']}`, {c['duration']} s, net {c['net']}, "
        f"seed {c['seed']}; faults injected: {report['faults_injected']}; "
        f"wall {report['wall_s']} s",
        "",
        "| figure | value |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in report["stats"].items()],
        "",
    ]
    if report["anomalies"]:
        lines += ["## Anomalies", ""] + [f"- {json.dumps(a)}" for a in report["anomalies"]]
    if report["errors"]:
        lines += ["", "## Errors", ""] + [f"- {e}" for e in report["errors"]]
    a = report.get("audit")
    if a is not None:
        lines += ["", "## Audit", "", f"- {a.get('verdict') or a.get('error', '')[:500]}",
                  f"- report: {a.get('report', '-')}", f"- command: `{a['command']}`"]
        lines += [f"- {json.dumps(v)}" for v in a.get("violations", [])]
    (workdir / "report.md").write_text("\n".join(lines) + "\n")
