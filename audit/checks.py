"""The cross-node checks, as Spark jobs over the record and survivor DataFrames.

Each returns a short list of findings (only problems come back to the
driver, never the log): the heavy lifting (grouping millions of entries by
group and index) stays in Spark, which spills to disk as needed.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from audit.model import (
    ACKED_DUPLICATED,
    ACKED_MISPLACED,
    ACKED_MISSING,
    ACKED_UNCHECKED,
    COMMITTED_MISMATCH,
    ENTRY_TYPES,
    LOG_MATCHING,
    NOTE,
    VIOLATION,
    Finding,
)
from audit.verdicts import minority

_VARIANT_LIMIT = 8


def _variants(df: DataFrame, keys: list[str], value: str) -> list[Any]:
    """Keys whose rows disagree on `value`, with the nodes holding each value."""
    per_value = df.groupBy(*keys, value).agg(F.sort_array(F.collect_set("node")).alias("nodes"))
    return (per_value.groupBy(*keys)
            .agg(F.collect_list(F.struct(value, "nodes")).alias("variants"))
            .filter(F.size("variants") > 1)
            .orderBy(*keys).limit(10_000).collect())


def log_matching(records: DataFrame) -> list[Finding]:
    """Same group, index and term on two nodes => same payload (every valid record,
    superseded ones and copies included: a leader creates (index, term) exactly once)."""
    entries = records.filter(F.col("rtype").isin(*ENTRY_TYPES))
    out = []
    for row in _variants(entries.select("node", "grp", "idx", "term", "digest"),
                         ["grp", "idx", "term"], "digest"):
        variants = [(v["digest"], list(v["nodes"])) for v in row["variants"]]
        bad, good = minority(variants)
        for node in bad:
            out.append(Finding(LOG_MATCHING, VIOLATION,
                               f"payload differs from {good or 'the other nodes'} at the same "
                               "index and term", node=node, group=row["grp"], index=row["idx"],
                               term=row["term"], nodes=good))
    return out


def committed_entries(spark: SparkSession, survivors: DataFrame,
                      commits: list[tuple[str, str, int]]) -> DataFrame:
    """Each node's surviving entries up to its own commit index (all survivor columns)."""
    cdf = spark.createDataFrame(commits, "node string, grp string, commit long")
    return (survivors.join(F.broadcast(cdf), ["node", "grp"])
            .filter(F.col("idx") <= F.col("commit")).drop("commit"))


def committed_points(spark: SparkSession, own: DataFrame,
                     points: list[tuple[str, str, int, int]]) -> DataFrame:
    """(node, grp, idx, term) a node holds as committed: its committed entries, its
    compaction points and its snapshot points."""
    pdf = spark.createDataFrame(points, "node string, grp string, idx long, term long")
    return own.select("node", "grp", "idx", "term").unionByName(pdf)


def committed_mismatch(committed: DataFrame) -> list[Finding]:
    out = []
    for row in _variants(committed, ["grp", "idx"], "term"):
        variants = [(v["term"], list(v["nodes"])) for v in row["variants"]]
        bad, good = minority(variants)
        terms = {n: t for t, ns in variants for n in ns}
        for node in bad:
            out.append(Finding(COMMITTED_MISMATCH, VIOLATION,
                               f"committed term {terms[node]} here, "
                               f"{sorted({t for t, _ in variants if t != terms[node]})} on "
                               f"{good or 'the other nodes'}", node=node, group=row["grp"],
                               index=row["idx"], term=terms[node], nodes=good))
    return out


def terms_at(committed: DataFrame, spark: SparkSession,
             wanted: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The committed term other nodes hold at a few (group, index) places."""
    if not wanted:
        return {}
    w = spark.createDataFrame(wanted, "grp string, idx long")
    rows = (committed.join(F.broadcast(w), ["grp", "idx"]).groupBy("grp", "idx")
            .agg(F.max("term").alias("term")).collect())
    return {(r["grp"], r["idx"]): r["term"] for r in rows}


def acked_writes(acks: DataFrame, own: DataFrame,
                 uncovered: dict[str, list[tuple[int, int]]]) -> list[Finding]:
    """Every acknowledged write is in its group's committed log once (>= once if retried),
    at the index the client was told if it was told one."""
    held = own.select("grp", "idx", "digest").distinct()
    counts = held.groupBy("grp", "digest").agg(
        F.count("idx").alias("n"), F.slice(F.sort_array(F.collect_list("idx")), 1, 5).alias("at"))
    joined = acks.join(counts, ["grp", "digest"], "left")
    once = (F.col("n") == 1) & ~F.col("retried")
    elsewhere = once & F.col("told").isNotNull() & (F.col("told") != F.col("at")[0])
    bad = joined.filter(F.col("n").isNull() | ((F.col("n") > 1) & ~F.col("retried"))
                        | elsewhere)
    out = []
    for r in bad.orderBy("line").limit(10_000).collect():
        f = _ack_finding(r, uncovered.get(r["grp"], []))
        if f is not None:
            out.append(f)
    return out


def _ack_finding(r: Any, uncovered: list[tuple[int, int]]) -> Finding | None:
    where = f"acked write on line {r['line']}" + (
        f" (told index {r['told']})" if r["told"] is not None else "")
    if r["n"] == 1:  # found once, elsewhere than told
        if any(lo <= r["told"] <= hi for lo, hi in uncovered):
            return None  # a second copy may sit at the told index, unseen
        return Finding(ACKED_MISPLACED, VIOLATION,
                       f"{where} is committed at {r['at'][0]} instead", group=r["grp"],
                       index=r["told"])
    if r["n"] is not None:
        return Finding(ACKED_DUPLICATED, VIOLATION,
                       f"{where} is committed {r['n']} times, at {list(r['at'])}",
                       group=r["grp"], index=r["at"][0])
    blind = [(lo, hi) for lo, hi in uncovered
             if r["told"] is None or lo <= r["told"] <= hi]
    if blind:
        return Finding(ACKED_UNCHECKED, NOTE,
                       f"{where} not found; indexes {blind[:3]} could not be checked",
                       group=r["grp"], index=r["told"])
    return Finding(ACKED_MISSING, VIOLATION,
                   f"{where} is in no node's committed log", group=r["grp"], index=r["told"])


def entries_per_term(own: DataFrame) -> list[tuple[str, int, int]]:
    """(group, term, committed entries): the plot of entries over Raft's logical time."""
    rows = (own.select("grp", "idx", "term").distinct().groupBy("grp", "term").count()
            .orderBy("grp", "term").collect())
    return [(r["grp"], r["term"], r["count"]) for r in rows]
