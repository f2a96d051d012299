"""Sublist throughput: matches per second, cached and uncached, for a
literal-heavy and a wildcard-heavy subscription set, plus insert/remove
rates with a warm cache (where cache invalidation costs show up).

    python benchmarks/sublist_bench.py [--subs 100000] [--matches 200000]

"Cached" replays a working set smaller than the cache; "uncached" publishes
to distinct subjects only, so every match walks the trie and also pays for
filling and sweeping the cache, as a real miss does.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from node.sublist import CACHE_MAX, SubList


@dataclass(eq=False, slots=True)
class Sub:
    subject: str
    queue: str | None = None
    sid: str = "1"
    client: object = None


def literal_heavy(n: int, rng: random.Random) -> tuple[list[Sub], Callable[[int], str]]:
    """Mostly request/reply inboxes and per-entity subjects, a few wildcards."""
    subs = [Sub(f"_INBOX.{i:x}.{i % 97}") for i in range(n // 2)]
    subs += [Sub(f"orders.{i}.created", "workers" if i % 3 == 0 else None) for i in range(n // 2)]
    subs += [Sub("orders.*.created"), Sub("_INBOX.>"), Sub(">")]

    def subject(i: int) -> str:
        j = rng.randrange(n // 2)
        return f"orders.{j}.created" if i % 2 else f"_INBOX.{j:x}.{j % 97}"

    return subs, subject


def wildcard_heavy(n: int, rng: random.Random) -> tuple[list[Sub], Callable[[int], str]]:
    """Telemetry-style fan-in: many overlapping * and > patterns."""
    regions = [f"r{i}" for i in range(50)]
    kinds = ["temp", "hum", "volt", "amp"]
    subs: list[Sub] = []
    for i in range(n):
        region, kind, dev = rng.choice(regions), rng.choice(kinds), f"d{rng.randrange(n)}"
        form = i % 5
        if form == 0:
            subs.append(Sub(f"tele.{region}.*.{kind}"))
        elif form == 1:
            subs.append(Sub(f"tele.*.{dev}.>"))
        elif form == 2:
            subs.append(Sub(f"tele.{region}.>", "agg"))
        elif form == 3:
            subs.append(Sub(f"*.{region}.{dev}.{kind}"))
        else:
            subs.append(Sub(f"tele.{region}.{dev}.{kind}"))

    def subject(i: int) -> str:
        dev = f"d{rng.randrange(n)}"
        return f"tele.{rng.choice(regions)}.{dev}.{rng.choice(kinds)}"

    return subs, subject


def rate(count: int, fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return count / (time.perf_counter() - start)


def run(name: str, subs: list[Sub], subject: Callable[[int], str], matches: int) -> None:
    sl = SubList()
    ins = rate(len(subs), lambda: [sl.insert(s) for s in subs])
    distinct = list({subject(i) for i in range(matches)})
    working = distinct[: CACHE_MAX // 2]
    hot = [working[i % len(working)] for i in range(matches)]
    for s in working:
        sl.match(s)
    cached = rate(len(hot), lambda: [sl.match(s) for s in hot])
    uncached = rate(len(distinct), lambda: [sl.match(s) for s in distinct])
    fanout = sl.stats()["avg_fanout"]
    # Churn with a full cache: each change must drop the cached subjects it matches.
    churn = subs[: min(20_000, len(subs))]
    rem = rate(len(churn), lambda: [sl.remove(s) for s in churn])
    back = rate(len(churn), lambda: [sl.insert(s) for s in churn])
    print(f"{name}: {len(subs):,} subs, avg fanout {fanout:.1f}")
    print(f"  match cached    {cached:>12,.0f} /s")
    print(f"  match uncached  {uncached:>12,.0f} /s  ({len(distinct):,} distinct subjects)")
    print(f"  insert (cold)   {ins:>12,.0f} /s")
    print(f"  remove (warm)   {rem:>12,.0f} /s")
    print(f"  insert (warm)   {back:>12,.0f} /s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subs", type=int, default=100_000)
    parser.add_argument("--matches", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    for name, build in (("literal-heavy", literal_heavy), ("wildcard-heavy", wildcard_heavy)):
        rng = random.Random(args.seed)
        subs, subject = build(args.subs, rng)
        run(name, subs, subject, args.matches)


if __name__ == "__main__":
    main()
