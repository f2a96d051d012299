"""The apply's per-batch caches change nothing a store holds.

`LmdbStore` keeps the stream's counters in memory for the length of a batch and skips the
TTL / dedup index scans below known floors; `Stream` skips unchanged progress keys and reads
max_age's oldest message from a cache. The audit replays a log with other batch boundaries
than the node had and compares every key of every database, so the keys and values must be a
function of the applied entries alone: these tests apply one varied log in several batchings
(and across a restart) and compare whole databases, and check the cases where a stale cache
would be wrong (an aborted batch, a first message removed under max_age).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from node.jetstream import config, ops
from node.jetstream.store.base import file_size
from node.jetstream.store.lmdbstore import DB_NAMES, LmdbStore, NodeEnv
from node.jetstream.store.memstore import MemStore
from node.jetstream.stream import Stream

S = 1_000_000_000
T0 = 1_700_000_000 * S
CFG: dict[str, Any] = {"subjects": ["s.>"], "max_msgs": 80, "max_age": 30 * S,
                       "allow_rollup_hdrs": True, "duplicate_window": 3 * S,
                       "allow_msg_ttl": True, "max_msgs_per_subject": 12}


def make_cfg(**extra: Any) -> config.Config:
    cfg, pedantic = config.parse_request(json.dumps({"name": "T", **extra}).encode())
    return config.check_create("T", cfg, pedantic, {})[0]


def _hdr(pairs: list[tuple[str, str]]) -> bytes:
    if not pairs:
        return b""
    return b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in pairs) + b"\r\n"


def _log() -> list[tuple[int, bytes]]:
    """Publishes over 9 subjects with msg ids, TTLs and rollups; purges, deletes, expiries,
    a config update that tightens the per-subject limit mid-log, and a clock that steps back."""
    rng = random.Random(7)
    out: list[ops.Op] = []
    now = T0
    for i in range(400):
        now += rng.choice((S // 20, S // 5, S, -S // 2))  # a leader's clock may step back
        pairs = []
        if i % 5 == 0:
            pairs.append(("Nats-Msg-Id", f"id{i % 17}"))
        if i % 9 == 0:
            pairs.append(("Nats-TTL", f"{rng.randint(1, 6)}s"))
        if i % 23 == 0:
            pairs.append(("Nats-Rollup", "sub"))
        out.append(ops.StreamMsg(now, f"s.{rng.randint(0, 8)}", "r", _hdr(pairs),
                                 bytes(rng.randint(0, 40))))
        if i % 41 == 0:
            out.append(ops.Purge(now, f"s.{i % 9}", keep=2))
        if i % 29 == 0:
            out.append(ops.DeleteMsg(now, max(1, i - 10)))
        if i % 13 == 0:
            out.append(ops.Expire(now + 5 * S))
        if i == 250:
            tighter = make_cfg(**{**CFG, "max_msgs_per_subject": 3})
            out.append(ops.UpdateConfig(now, json.dumps(config.to_wire(tighter)).encode()))
    return [(i, ops.encode(op)) for i, op in enumerate(out, start=1)]


def _dump(env: NodeEnv) -> dict[str, list[tuple[bytes, bytes]]]:
    with env.env.begin() as txn:
        return {name: [(bytes(k), bytes(v)) for k, v in txn.cursor(db=env.dbs[name])]
                for name in DB_NAMES}


def _apply(path: Path, entries: list[tuple[int, bytes]], cuts: list[int],
           restart_at: int = -1) -> tuple[list[Any], dict[str, Any], NodeEnv]:
    env = NodeEnv(str(path))
    stream = Stream(make_cfg(**CFG), LmdbStore(env, "T"))
    effects: list[Any] = []
    for lo, hi in zip([0, *cuts], [*cuts, len(entries)], strict=True):
        if lo == restart_at:  # a restart: a new Stream and store over the same environment
            stream = Stream(make_cfg(**CFG), LmdbStore(env, "T"))
        effects += stream.apply_batch(entries[lo:hi])
    return effects, stream.state(), env


def test_every_database_is_the_same_whatever_the_batching(tmp_path: Path) -> None:
    entries = _log()
    n = len(entries)
    rng = random.Random(3)
    batchings = {
        "one by one": list(range(1, n)),
        "all at once": [],
        "random": sorted(rng.sample(range(1, n), 60)),
        "random, restarted": sorted(rng.sample(range(1, n), 25)),
    }
    ref = Stream(make_cfg(**CFG), MemStore("T", sizer=file_size))
    ref_effects = ref.apply_batch(entries)
    dumps = {}
    for name, cuts in batchings.items():
        restart = cuts[len(cuts) // 2] if "restarted" in name else -1
        effects, state, env = _apply(tmp_path / name.replace(" ", "_"), entries, cuts, restart)
        try:
            assert effects == ref_effects, name
            assert state == ref.state(), name
            dumps[name] = _dump(env)
        finally:
            env.close()
    first = dumps["one by one"]
    assert first["js_msgs"] and first["js_ttl"] and first["js_dedup"]  # the log used them
    for name, dump in dumps.items():
        for db in DB_NAMES:
            assert dump[db] == first[db], f"{name}: {db} differs from one-by-one"


def test_an_aborted_batch_leaves_the_store_as_before(tmp_path: Path) -> None:
    """A batch that fails half-way aborts its transaction: the counters it kept and the index
    floors it moved must not outlive it (a replay on the same store then matches a store that
    never saw the failed batch)."""
    cfg = make_cfg(subjects=["s.>"], duplicate_window=2 * S, allow_msg_ttl=True)
    first = [(1, ops.encode(ops.StreamMsg(T0, "s.a", "r", _hdr([("Nats-Msg-Id", "a"),
                                                                  ("Nats-TTL", "2s")]), b"1"))),
             (2, ops.encode(ops.StreamMsg(T0 + S, "s.b", "r", _hdr([("Nats-Msg-Id", "b")]),
                                          b"2")))]
    # at T0 + 2.5 s: "a" leaves the dedup window and its TTL expires; then a broken entry
    rest = [(3, ops.encode(ops.StreamMsg(T0 + 5 * S // 2, "s.a", "r", b"", b"3"))),
            (4, ops.encode(ops.StreamMsg(T0 + 11 * S // 4, "s.c", "r", b"", b"4")))]
    env_a, env_b = NodeEnv(str(tmp_path / "a")), NodeEnv(str(tmp_path / "b"))
    try:
        store_a = LmdbStore(env_a, "T")
        Stream(cfg, store_a).apply_batch(first)
        with pytest.raises(ops.EntryFormatError):
            Stream(cfg, store_a).apply_batch([rest[0], (4, b"\x01broken")])
        assert store_a.msgs() == 2 and store_a.subject_count("s.a") == 1
        Stream(cfg, store_a).apply_batch(rest)  # the same store object, floors and all
        store_b = LmdbStore(env_b, "T")
        Stream(cfg, store_b).apply_batch(first)
        Stream(cfg, store_b).apply_batch(rest)
        assert _dump(env_a) == _dump(env_b)
        assert store_a.get_dedup("a") is None and store_a.due_ttls(T0 + 10 * S, 10) == []
    finally:
        env_a.close()
        env_b.close()


@pytest.mark.parametrize("kind", ["mem", "lmdb"])
def test_max_age_after_the_first_message_goes(tmp_path: Path, kind: str) -> None:
    """Timestamps need not grow with sequences (a new leader's clock may be behind): when
    the first message is removed, the next one may be older, and max_age must find it."""
    env = NodeEnv(str(tmp_path / "env")) if kind == "lmdb" else None
    store = LmdbStore(env, "T") if env is not None else MemStore("T")
    stream = Stream(make_cfg(subjects=["s.>"], max_age=10 * S), store)
    try:
        stream.apply_batch([(1, ops.encode(ops.StreamMsg(T0 + 5 * S, "s.a", "r", b"", b"1"))),
                            (2, ops.encode(ops.StreamMsg(T0, "s.b", "r", b"", b"2"))),
                            (3, ops.encode(ops.Expire(T0 + 12 * S)))])
        assert list(store.seqs()) == [1, 2]  # the first is young: nothing is looked at
        stream.apply_batch([(4, ops.encode(ops.DeleteMsg(T0 + 12 * S, 1)))])
        stream.apply_batch([(5, ops.encode(ops.Expire(T0 + 12 * S)))])
        assert list(store.seqs()) == []  # seq 2 is 12 s old
    finally:
        if env is not None:
            env.close()


def test_before_commit_sees_the_runs_effects_before_the_store_commits(tmp_path: Path) -> None:
    """`before_commit` (the node's early PubAcks) gets every effect of the run once all its
    entries are applied, while another reader does not see them yet; what it returns is what
    `apply_batch` returns, and the store then holds the run as without it."""
    env = NodeEnv(str(tmp_path / "env"))
    store = LmdbStore(env, "T")
    stream = Stream(make_cfg(subjects=["s.>"]), store)
    seen: list[tuple[list[str], int]] = []

    def early(effects: list[Any]) -> list[Any]:
        with env.env.begin() as outside:  # a reader outside the open write transaction
            committed = outside.stat(env.dbs["js_msgs"])["entries"]
        seen.append(([type(e).__name__ for e in effects], committed))
        return [e for e in effects if type(e).__name__ != "Reply"]

    try:
        run = [(i, ops.encode(ops.StreamMsg(T0 + i, f"s.{i}", f"r{i}", b"", b"x")))
               for i in (1, 2)]
        left = stream.apply_batch(run, before_commit=early)
        assert seen == [(["Stored", "Reply", "Stored", "Reply"], 0)]
        assert [type(e).__name__ for e in left] == ["Stored", "Stored"]
        assert list(store.seqs()) == [1, 2] and stream.applied == 2
    finally:
        env.close()
