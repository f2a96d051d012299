"""The plain-publish apply path (`Stream._apply_plain`) gives what the full one gives.

A STREAM_MSGS entry's headerless parts on a stream without sealing, counters, discard new,
transforms, republish or non-limits retention skip the checks that cannot refuse them
(async R3 applies every message on 3 nodes, so this is CPU per message times three). These
tests apply one log twice, once with the plain path and once with it turned off, and compare
every effect, the stream's state and every LMDB database, for configs where the skipped
work would matter: limits that remove messages, per-subject limits, max_age and TTL expiry
with subject delete markers, a consumer, oversize messages, subjects too long for a key,
dedup ids and headers mixed in, and an UPDATE_CONFIG that seals the stream mid-way.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from node.jetstream import config, ops
from node.jetstream.machines import StreamMachine
from node.jetstream.store.lmdbstore import DB_NAMES, LmdbStore, NodeEnv
from node.jetstream.stream import Reply, Stream
from tests.jetstream.test_apply_batching import T0, S, _hdr, make_cfg

CONFIGS: dict[str, dict[str, Any]] = {
    "limits": {"subjects": ["s.>"], "max_msgs": 50, "max_bytes": 9000, "max_msg_size": 200},
    "per_subject": {"subjects": ["s.>"], "max_msgs_per_subject": 3, "duplicate_window": S},
    "expiry": {"subjects": ["s.>"], "max_age": 2 * S, "allow_msg_ttl": True,
               "subject_delete_marker_ttl": 2 * S, "allow_rollup_hdrs": True},
    "discard_new": {"subjects": ["s.>"], "max_msgs": 30, "discard": "new"},
    "no_ack": {"subjects": ["s.>"], "no_ack": True, "max_msgs": 20},
}


def _log(name: str, seed: int) -> list[ops.Op]:
    """Runs of publishes (merged as the leader merges them), mostly headerless, with
    headered ones, oversize ones and subjects too long for a key in between; a consumer
    is created early and the stream is sealed near the end."""
    rng = random.Random(seed)
    cfg = CONFIGS[name]
    out: list[ops.Op] = []
    now = T0
    run: list[ops.StreamMsg] = []
    for i in range(700):
        now += rng.choice((S // 100, S // 20, S // 4))
        roll = rng.random()
        pairs: list[tuple[str, str]] = []
        if roll < 0.06:
            pairs.append(("Nats-Msg-Id", f"id{rng.randint(0, 20)}"))
        elif roll < 0.09 and cfg.get("allow_msg_ttl"):
            pairs.append(("Nats-TTL", "1s"))
        elif roll < 0.11 and cfg.get("allow_rollup_hdrs"):
            pairs.append(("Nats-Rollup", "sub"))
        subject = f"s.{rng.randint(0, 6)}"
        if rng.random() < 0.02:
            subject = "s." + "k" * 600  # longer than any key may be
        data = bytes(rng.choice((0, 10, 100, 250)))  # 250 > max_msg_size where set
        run.append(ops.StreamMsg(now, subject, f"r{i}" if rng.random() < 0.9 else "",
                                 _hdr(pairs), data))
        if len(run) >= rng.randint(1, 30):
            out.append(run[0] if len(run) == 1 else ops.StreamMsgs(run[0].now_ns, tuple(run)))
            run = []
        if i == 40:
            out.append(ops.ConsumerUpsert(now, "C", json.dumps(
                {"durable_name": "C", "ack_policy": "explicit"}).encode()))
        if i == 640:
            wire = {**config.to_wire(make_cfg(**cfg)), "sealed": True}
            out.append(ops.UpdateConfig(now, json.dumps(wire).encode()))
    return out


def _dump(env: NodeEnv) -> dict[str, list[tuple[bytes, bytes]]]:
    with env.env.begin() as txn:
        return {db: [(bytes(k), bytes(v)) for k, v in txn.cursor(db=env.dbs[db])]
                for db in DB_NAMES}


def _apply(path: Path, name: str, log: list[ops.Op]) -> tuple[list[Any], dict, dict]:
    env = NodeEnv(str(path))
    try:
        stream = Stream(make_cfg(**CONFIGS[name]), LmdbStore(env, "T"))
        entries = [(i, ops.encode(op)) for i, op in enumerate(log, start=1)]
        effects: list[Any] = []
        for lo in range(0, len(entries), 5):
            effects += stream.apply_batch(entries[lo:lo + 5])
        return effects, stream.state(), _dump(env)
    finally:
        env.close()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_plain_path_stores_and_answers_as_the_full_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    log = _log(name, seed=len(name))
    taken: list[int] = []
    plain = Stream._apply_plain

    def counting(self: Stream, op: ops.StreamMsg, effects: list[Any]) -> None:
        taken.append(1)
        plain(self, op, effects)

    monkeypatch.setattr(Stream, "_apply_plain", counting)
    effects, state, dump = _apply(tmp_path / "plain", name, log)
    monkeypatch.setattr(Stream, "_plain_room", lambda self: -1)  # the full path only
    ref_effects, ref_state, ref_dump = _apply(tmp_path / "full", name, log)
    assert effects == ref_effects
    assert state == ref_state
    for db in DB_NAMES:
        assert dump[db] == ref_dump[db], db
    publishes = sum(len(op.msgs) if isinstance(op, ops.StreamMsgs) else 1
                    for op in log if isinstance(op, ops.StreamMsg | ops.StreamMsgs))
    if name == "discard_new":
        assert not taken  # discard new can refuse any message: never the plain path
    else:
        assert len(taken) > publishes // 2  # the plain path did the bulk of the work
    replies = [json.loads(e.payload) for e in effects if isinstance(e, Reply)]
    if name == "no_ack":
        assert all("error" in r for r in replies)
    else:
        errors = {r["error"]["err_code"] for r in replies if "error" in r}
        assert 10039 not in errors and errors, errors  # refusals happened (size, key, sealed)
        acked = sum("error" not in r for r in replies)
        assert acked > (20 if name == "discard_new" else publishes // 3), acked


def test_a_follower_builds_no_pubacks_and_stores_the_same(tmp_path: Path) -> None:
    """A cluster follower's StreamMachine (`leads` says no) applies without building
    PubAcks (nobody sends them); its store and every other effect, publish errors
    included, are what the leader's apply gives."""
    log = _log("limits", seed=3)
    entries = [(i, ops.encode(op)) for i, op in enumerate(log, start=1)]
    got: dict[str, list[Any]] = {"leader": [], "follower": []}
    dumps = {}
    for role in got:
        env = NodeEnv(str(tmp_path / role))
        sm = StreamMachine("T", "js.T.1", make_cfg(**CONFIGS["limits"]), env,
                           lambda _sm, effects, role=role: got[role].extend(effects), 1)
        sm.leads = lambda role=role: role == "leader"
        for lo in range(0, len(entries), 5):
            sm.apply_batch(entries[lo:lo + 5])
        dumps[role] = _dump(env)
        env.close()
    assert dumps["follower"] == dumps["leader"]
    acks = [e for e in got["leader"] if isinstance(e, Reply) and b'"error"' not in e.payload]
    assert len(acks) > 100
    assert got["follower"] == [e for e in got["leader"] if e not in acks]
