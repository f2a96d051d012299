"""The audit as a Spark job.

    jetraft audit DATA_DIR... [--master local[*]] [--out report/] [--acked FILE]
                  [--config NODE.CONF | --key-file FILE [--cipher chacha|aes]]
    spark-submit --master spark://host:7077 audit/job.py DATA_DIR... --out report/

The executors read the data directories by path, so on a real cluster they
must see them at the same paths (a shared or copied file system). The job
ships its own code (`audit`, `raft` and `node` packages, zipped) to the executors.

Stages: read (one task per byte range of a segment) -> log pass (per node
and group, newest record first: survivors, holes, votes) -> cross-node
checks -> replay hooks -> report. Exit status 1 iff a finding is a violation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field, replace
from typing import Any

if __package__ in (None, ""):  # run as a file by spark-submit: import from the repo root,
    # not from audit/ (its module names must not shadow the standard library's)
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from audit import checks, layout, verdicts  # noqa: E402
from audit.acked import AckFileError, check_file, parse_numbered  # noqa: E402
from audit.hooks import default_hooks, read_entries, run_hooks  # noqa: E402
from audit.keyring import Keyring, KeyringError, load_key  # noqa: E402
from audit.logpass import run_partition  # noqa: E402
from audit.model import (  # noqa: E402
    ACKED_MISSING,
    ACKED_UNCHECKED,
    COMMITTED_MISSING,
    NOTE,
    PASS_FIELDS,
    SEGMENT_MISSING,
    VIOLATION,
    Finding,
)
from audit.segread import SplitEdges, read_split  # noqa: E402
from audit.snapmeta import read_metas  # noqa: E402
from audit.stitch import grade  # noqa: E402

RECORD_SCHEMA = ("node string, seg long, off long, rtype int, grp string, term long, idx long, "
                 "etype int, plen long, digest binary, vote long, conf string")
PASS_SCHEMA = ("tag string, node string, grp string, idx long, term long, digest binary, "
               "etype int, seg long, off long, info string")
ACK_SCHEMA = "line long, grp string, digest binary, told long, retried boolean"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
assert PASS_SCHEMA.count(",") + 1 == len(PASS_FIELDS)


@dataclass
class Outcome:
    findings: list[Finding] = field(default_factory=list)
    coverage: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    summaries: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    term_starts: list[tuple[str, str, int, int]] = field(default_factory=list)
    votes: list[tuple[str, str, int, int]] = field(default_factory=list)
    per_term: list[tuple[str, int, int]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)


# ---- Spark plumbing ------------------------------------------------------------


def session(master: str | None, conf: dict[str, str] | None = None):
    from pyspark.sql import SparkSession

    # Local mode stays on loopback: the driver would otherwise bind the host's address.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    b = SparkSession.builder.appName("jetraft-audit")
    if master:
        b = b.master(master)
    settings = {"spark.sql.shuffle.partitions": "8", "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.pyspark.python": sys.executable, "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1", **(conf or {})}
    for k, v in settings.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    ship_code(spark)
    return spark


def ship_code(spark) -> None:
    """Zip the `audit` and `raft` packages, and `node` (the JetStream replay hooks run its
    pure state machines), for the executors (any master)."""
    path = os.path.join(tempfile.mkdtemp(prefix="jetraft-audit-"), "audit_code.zip")
    with zipfile.ZipFile(path, "w") as z:
        for pkg in ("audit", "raft", "node"):
            for root, dirs, files in os.walk(os.path.join(ROOT, pkg)):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                for name in sorted(files):
                    if name.endswith((".py", ".json")):
                        full = os.path.join(root, name)
                        z.write(full, os.path.relpath(full, ROOT))
    spark.sparkContext.addPyFile(path)


def _read_task(splits, keyring: Keyring | None = None):
    for sp in splits:
        crypt = keyring.crypt(sp.node) if keyring is not None else None
        rows, edges = read_split(sp.node, sp.seq, sp.path, sp.start, sp.end,
                                 crypt.wal if crypt is not None else None)
        yield from rows
        yield (sp.node, sp.seq, sp.start, 0, "", 0, 0, 0, 0, None, None,
               json.dumps([edges.start, edges.end, edges.first, edges.last_end, edges.damage,
                           edges.unopened]))


def _edges(row: Any) -> SplitEdges:
    start, end, first, last_end, damage, unopened = json.loads(row["conf"])
    return SplitEdges(start, end, first, last_end, [tuple(d) for d in damage],
                      [tuple(u) for u in unopened])


# ---- stages -------------------------------------------------------------------


def read_stage(spark, nodes: list[layout.NodeDirs], out: Outcome, split_bytes: int,
               keyring: Keyring | None = None):
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    splits = layout.plan_splits(nodes, split_bytes)
    out.stats["segments"] = sum(len(n.segments) for n in nodes)
    out.stats["splits"] = len(splits)
    out.stats["bytes"] = sum(s.size for n in nodes for s in n.segments)
    rdd = spark.sparkContext.parallelize(splits, max(1, len(splits))).mapPartitions(
        lambda part: _read_task(part, keyring))
    every = spark.createDataFrame(rdd, RECORD_SCHEMA, verifySchema=False)
    every = every.persist(StorageLevel.MEMORY_AND_DISK)
    edges: dict[tuple[str, int], list[SplitEdges]] = {}
    for row in every.filter(F.col("rtype") == 0).collect():
        edges.setdefault((row["node"], row["seg"]), []).append(_edges(row))
    for n in nodes:
        # The torn write in flight can only be in the newest segment with data: a crash in
        # a batch that crossed a roll leaves the next segments empty (docs/raft.md).
        newest = max((s.seq for s in n.segments if s.size), default=0)
        for s in n.segments:
            out.findings += grade(n.name, s.seq, s.size, s.seq == newest,
                                  edges.get((n.name, s.seq), []))
        out.findings += _segment_holes(n)
    return every.filter(F.col("rtype") > 0)


def _segment_holes(n: layout.NodeDirs) -> list[Finding]:
    seqs = n.seqs
    # A note: the storage skips numbers after dropping a torn roll's empty segments or a
    # repair's damaged ones. Entries lost with them show up as missing committed entries.
    return [Finding(SEGMENT_MISSING, NOTE,
                    f"segments {a + 1}..{b - 1} missing between {a} and {b}", node=n.name)
            for a, b in zip(seqs, seqs[1:], strict=False) if b != a + 1]


def log_pass(records, out: Outcome):
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    ordered = (records.repartition("node", "grp")
               .sortWithinPartitions("node", "grp", F.desc("seg"), F.desc("off")))
    passed = records.sparkSession.createDataFrame(
        ordered.rdd.mapPartitions(run_partition), PASS_SCHEMA, verifySchema=False)
    passed = passed.persist(StorageLevel.MEMORY_AND_DISK)
    small = passed.filter(F.col("tag") != "E").collect()
    return passed.filter(F.col("tag") == "E"), small


def judge_logs(nodes: list[layout.NodeDirs], small: list[Any], out: Outcome):
    """Summaries, holes, term starts, votes and findings of the log pass, per log."""
    gaps: dict[tuple[str, str], list[tuple[int, int]]] = {}
    points = []
    for r in small:
        key, tag = (r["node"], r["grp"]), r["tag"]
        info = json.loads(r["info"]) if r["info"] else {}
        if tag == "S":
            out.summaries[key] = info
        elif tag == "G":
            gaps.setdefault(key, []).append((r["idx"], info["hi"]))
        elif tag == "T":
            out.term_starts.append((r["node"], r["grp"], r["idx"], r["term"]))
        elif tag == "V":
            out.votes.append((r["node"], r["grp"], r["term"], info["vote"]))
        elif tag == "P":
            points.append((r["node"], r["grp"], r["idx"], r["term"]))
        elif tag == "F":
            out.findings.append(Finding.from_json(info))
    complete = {n.name: n.complete for n in nodes}
    for (node, grp), info in sorted(out.summaries.items()):
        cov, found = verdicts.judge_log(node, grp, info, sorted(gaps.get((node, grp), [])),
                                        complete[node])
        out.coverage.setdefault(grp, []).append(cov.to_json())
        out.findings += found
    out.findings += verdicts.two_leaders(out.term_starts)
    return points


def uncovered(out: Outcome) -> dict[str, list[tuple[int, int]]]:
    """Per group, committed indexes no node's log lets us check."""
    result = {}
    for grp, logs in out.coverage.items():
        top = max(c["commit"] for c in logs)
        floor = min((c["snapshot"][1] if c["snapshot"] else 0) for c in logs)
        runs = sorted(r for c in logs for r in c["checked"])
        holes, at = [], floor + 1
        for lo, hi in runs:
            if lo > at:
                holes.append((at, min(lo - 1, top)))
            at = max(at, hi + 1)
        if at <= top:
            holes.append((at, top))
        result[grp] = [h for h in holes if h[0] <= h[1]]
    return result


def cross_checks(spark, records, survivors, points, nodes, acked: str | None, out: Outcome):
    metas = []
    for n in nodes:
        found, bad = read_metas(n.name, n.snap)
        metas += [(n.name, g, i, t) for g, i, t in found]
        out.findings += bad
    commits = [(node, grp, info["commit"]) for (node, grp), info in out.summaries.items()]
    own = checks.committed_entries(spark, survivors, commits).persist()
    committed = checks.committed_points(spark, own, points + metas).persist()
    out.findings += checks.log_matching(records)
    out.findings += checks.committed_mismatch(committed)
    _fill_missing_terms(spark, committed, out)
    if acked:
        lines = spark.sparkContext.textFile(acked).zipWithIndex().map(parse_numbered)
        acks = spark.createDataFrame(lines.filter(lambda x: x is not None), ACK_SCHEMA)
        out.findings += checks.acked_writes(acks, own, uncovered(out))
    out.per_term = checks.entries_per_term(own)
    return own


def replay_stage(own, nodes: list[layout.NodeDirs], out: Outcome,
                 acked: str | None = None, keyring: Keyring | None = None) -> None:
    """Per-group replay hooks (audit/hooks.py), one Spark task per group, index order.
    JetStream PubAcks in the acked file are checked by the stream hook during its replay."""
    from pyspark.sql import functions as F

    hooks = default_hooks(keyring)
    dirs = {n.name: n.root for n in nodes}
    groups = sorted(g for g in out.coverage if any(h.wants(g, dirs) for h in hooks))
    out.stats["replayed_groups"] = groups
    stream_acks = acked_streams(acked) if acked else []
    if not groups:
        out.findings += [_orphan_ack(a) for a in stream_acks]
        return
    paths = {(n.name, s.seq): s.path for n in nodes for s in n.segments}
    one_copy = (own.filter(F.col("grp").isin(groups))
                .groupBy("grp", "idx")
                .agg(F.min(F.struct("node", "term", "etype", "seg", "off")).alias("c"))
                .select("grp", "idx", "c.*")
                .repartition("grp").sortWithinPartitions("grp", "idx"))
    for hook in hooks:  # a hook may need another group's entries first (read on the driver)
        source = getattr(hook, "prepare_from", None)
        if source in groups:
            rows = one_copy.filter(F.col("grp") == source).orderBy("idx").collect()
            hook.prepare(list(read_entries(rows, paths, keyring)))
    out.findings += _hand_acks(hooks, stream_acks, set(groups))
    found = one_copy.rdd.mapPartitions(
        lambda rows: run_hooks(rows, hooks, dirs, paths, keyring)).collect()
    out.findings += [Finding.from_json(json.loads(f)) for f in found]


def acked_streams(path: str) -> list[Any]:
    from audit.acked import stream_acks

    return stream_acks(path)


def _hand_acks(hooks: list[Any], acks: list[Any], groups: set[str]) -> list[Finding]:
    """Give the stream hook its PubAcks; the ones it cannot check become findings here."""
    if not acks:
        return []
    hook = next((h for h in hooks if hasattr(h, "take_acks")), None)
    if hook is None:
        return [_orphan_ack(a) for a in acks]
    found = [_orphan_ack(a) for a in hook.take_acks(acks)]
    for group in sorted(set(hook.acks) - groups):  # no node holds that group's log
        for a in hook.acks.pop(group):
            found.append(Finding(ACKED_UNCHECKED, NOTE, f"acked message of stream "
                                 f"{a.stream!r} on line {a.line}: no node holds the log of "
                                 "its group", group=group))
    return found


def _orphan_ack(a: Any) -> Finding:
    return Finding(ACKED_MISSING, VIOLATION, f"acked message of stream {a.stream!r} on line "
                   f"{a.line}: no committed meta entry creates that stream")


def _fill_missing_terms(spark, committed, out: Outcome) -> None:
    """A missing committed entry is named with the term the other nodes hold there."""
    wanted = sorted({(f.group, f.index) for f in out.findings
                     if f.kind == COMMITTED_MISSING and f.term is None})
    terms = checks.terms_at(committed, spark, wanted)
    out.findings = [replace(f, term=terms.get((f.group, f.index)))
                    if f.kind == COMMITTED_MISSING and f.term is None else f
                    for f in out.findings]


def run(spark, data_dirs: list[str], acked: str | None = None,
        split_bytes: int = layout.SPLIT_BYTES, progress=None,
        keyring: Keyring | None = None) -> Outcome:
    """`keyring`: the key of stores encrypted at rest (audit/keyring.py); checked against
    every encrypted node's key file before anything is read."""
    nodes = layout.node_dirs(data_dirs, keyring)
    out = Outcome()
    timer = _PhaseTimer(out, progress)
    timer("reading segments")
    records = read_stage(spark, nodes, out, split_bytes, keyring)
    timer("replaying each node's logs")
    survivors, small = log_pass(records, out)
    points = judge_logs(nodes, small, out)
    timer("comparing nodes")
    own = cross_checks(spark, records, survivors, points, nodes, acked, out)
    timer("replaying groups through their stores")
    replay_stage(own, nodes, out, acked, keyring)
    out.stats["records"] = records.count()
    out.stats["nodes"] = [n.name for n in nodes]
    out.stats["archived_segments"] = sum(s.archived for n in nodes for s in n.segments)
    out.stats["encrypted_nodes"] = sorted(keyring.stores) if keyring is not None else []
    timer(None)
    return out


class _PhaseTimer:
    """Shows each phase on the progress line and keeps its wall time in the stats."""

    def __init__(self, out: Outcome, progress) -> None:
        self.times = out.stats.setdefault("phase_s", {})
        self.progress = progress
        self.name: str | None = None
        self.t0 = time.monotonic()

    def __call__(self, name: str | None) -> None:
        now = time.monotonic()
        if self.name is not None:
            self.times[self.name] = round(now - self.t0, 2)
        self.name, self.t0 = name, now
        if name is not None and self.progress is not None:
            self.progress.phase(name)


# ---- command line ------------------------------------------------------------------


def parser(prog: str = "jetraft audit") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description="Replay every node's Raft logs on "
                                 "Spark and check that the replicas kept every promise.")
    ap.add_argument("data_dirs", nargs="+", metavar="DATA_DIR")
    ap.add_argument("--master", default=None, help="Spark master (default local[*]; "
                    "spark-submit's --master wins when run through it)")
    ap.add_argument("--out", default="report", help="report directory (default report/)")
    ap.add_argument("--acked", default=None, help="acknowledged writes, JSON lines "
                    "(see audit/acked.py)")
    ap.add_argument("--split-mb", type=int, default=layout.SPLIT_BYTES >> 20)
    ap.add_argument("--key-file", default=None, metavar="FILE", help="stores encrypted at "
                    "rest: a file holding the jetstream.key (one line)")
    ap.add_argument("--config", default=None, metavar="NODE.CONF", help="stores encrypted at "
                    "rest: the node's config file; its jetstream { key, cipher } is used")
    ap.add_argument("--cipher", default=None, help="chacha or aes (default: the one the "
                    "store's key file names)")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="extra Spark setting, e.g. spark.driver.memory=4g")
    return ap


def main(argv: list[str] | None = None, prog: str = "jetraft audit") -> int:
    args = parser(prog).parse_args(argv)
    try:
        keyring = _keyring(args)
        layout.node_dirs(args.data_dirs, keyring)
        if args.acked:
            check_file(args.acked)
    except (layout.LayoutError, AckFileError, KeyringError, OSError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    conf = dict(kv.split("=", 1) for kv in args.conf)
    master = args.master or (None if _submitted() else "local[*]")
    from audit.progress import Progress
    from audit.report import write_reports

    spark = session(master, conf)
    try:
        with Progress(spark.sparkContext) as progress:
            out = run(spark, args.data_dirs, args.acked, args.split_mb << 20, progress,
                      keyring)
            progress.phase("writing the report")
            verdict = write_reports(out, args.out)
    finally:
        spark.stop()
    print(f"{verdict['text']}: {args.out}/report.html")
    return 1 if verdict["violations"] else 0


def _keyring(args: argparse.Namespace) -> Keyring | None:
    got = load_key(args.key_file, args.config, args.cipher)
    return None if got is None else Keyring(got[0], got[1], prev_key=got[2])


def _submitted() -> bool:
    """True under spark-submit (its JVM is already up), whose --master stands."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


if __name__ == "__main__":
    sys.exit(main(prog="audit/job.py"))
