"""Mutation check for the JetStream safety guards: each mutant must make a test fail.

    python -m tests.jetstream.mutants        (from the worktree root)

Copies the tree to a temp dir, applies one mutant at a time (an exact text replacement that
must match once), runs the tests that guard it there, and reports killed/survived. Exit 1 when
a mutant survives or no longer applies.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
J = "node/jetstream/"
T = "tests/jetstream/"
PUSH_FC = "tests/integration/test_jetstream_push.py::test_flow_control_matches_nats_server"
PRIO = "tests/integration/test_jetstream_priority.py"
PUSH_HB = "tests/integration/test_jetstream_push.py::test_idle_heartbeats_match_nats_server"
MK9 = "tests/integration/test_jetstream_mirrors.py::test_kill_9_while_sourcing_then_exactly_once"
MKV = "tests/integration/test_jetstream_mirrors.py::test_kv_mirror_direct_matches_nats_server"
MDIFF = "tests/integration/test_jetstream_mirrors.py::test_mirrors_and_sources_match_nats_server"

# (name, file, original text, mutated text, tests that must catch it[, original2, mutated2])
MUTANTS: list[tuple[str, ...]] = [
    ("re-applied index not skipped", J + "stream.py", "if index <= self.applied:",
     "if index < self.applied:", T + "test_stream.py"),
    ("progress not saved with the batch", J + "stream.py",
     "            progress = self._save_progress(saved)\n",
     "            progress = None\n", T + "test_stream.py"),
    ("record CRC not checked", J + "store/base.py",
     "if zlib.crc32(raw[4:], zlib.crc32(_SEQ.pack(seq))) != crc:", "if False:",
     T + "test_store.py"),
    ("record CRC ignores the sequence", J + "store/base.py",
     "if zlib.crc32(raw[4:], zlib.crc32(_SEQ.pack(seq))) != crc:",
     "if zlib.crc32(raw[4:], zlib.crc32(_SEQ.pack(msg_seq_unused := 0))) != crc and "
     "zlib.crc32(raw[4:]) != crc:", T + "test_store.py"),
    # The window is enforced twice (pruning, and the check on lookup), so the mutant breaks
    # both: either alone is covered by the other.
    ("dedup window ignored", J + "stream.py",
     'op.now_ns - seen[1] <= cfg["duplicate_window"]', "True", T + "test_stream.py",
     'self.store.prune_dedup(now_ns - self.cfg["duplicate_window"], EXPIRE_BATCH)', "None"),
    ("dedup ignored", J + "stream.py", "            if seen is not None and",
     "            if False and", T + "test_stream_differential.py"),
    ("max_age never expires", J + "stream.py",
     "if msg is None or msg.ts_ns > now_ns - max_age:", "if True:", T + "test_stream.py"),
    ("discard new off by one", J + "stream.py",
     'if 0 < cfg["max_msgs"] <= self.store.msgs():',
     'if 0 < cfg["max_msgs"] < self.store.msgs():', T + "test_stream_differential.py"),
    ("expected last sequence unchecked", J + "stream.py",
     "if expected_last is not None and _as_seq(expected_last) != self.last_seq:",
     "if False:", T + "test_stream_differential.py"),
    ("max msg size unchecked", J + "stream.py",
     'if 0 <= cfg["max_msg_size"] < len(op.hdr) + len(op.data):', "if False:",
     T + "test_stream_differential.py"),
    ("entry trailing bytes accepted", J + "ops.py", "if used != len(body):",
     "if used > len(body):", T + "test_ops.py", "    if end != stop:",
     "    if end > stop:"),
    ("stream msgs entry trailing bytes accepted", J + "ops.py", "    if at != len(entry):",
     "    if at > len(entry):", T + "test_ops.py"),
    ("ttl index not consulted", J + "stream.py",
     "for _expires, seq in self.store.due_ttls(now_ns, EXPIRE_BATCH):",
     "for _expires, seq in []:", T + "test_stream.py"),
    ("subject overlap with other streams unchecked", J + "config.py",
     "            if any(subjects_collide(mine, theirs) for theirs in other[\"subjects\"]):",
     "            if False:", T + "test_config_differential.py"),
    ("redelivery before the ack deadline", J + "consumer.py",
     "if p.deadline_ns <= now_ns)", "if p.deadline_ns <= now_ns + 1)",
     T + "test_consumer.py"),
    ("max_deliver not enforced", J + "consumer.py", "if 0 < self.max_deliver <= count:",
     "if 0 < self.max_deliver < count:", T + "test_consumer.py"),
    ("ack floor jumps over an unacked message", J + "consumer.py",
     "            st.floor_sseq = first - 1", "            st.floor_sseq = first",
     T + "test_consumer.py"),
    ("redelivery forgets the first consumer sequence", J + "consumer.py",
     "Pending(first.cseq if first else cseq,", "Pending(cseq,",
     T + "test_consumer_differential.py"),
    ("max_ack_pending not enforced", J + "consumer.py",
     "        if self.max_ack_pending > 0:  # each new delivery pends, unless acks are off",
     "        if False:",
     T + "test_consumer.py"),
    ("workqueue keeps acked messages", J + "stream.py",
     "if self.cfg[\"retention\"] == \"limits\":\n            return []",
     "if True:\n            return []", T + "test_consumer.py"),
    ("consumer deliver subject cycle unchecked", J + "consumer_config.py",
     'if any(subjects_collide(deliver, s) for s in stream["subjects"]):', "if False:",
     T + "test_consumer_config_differential.py"),
    ("consumer update may change the ack policy", J + "consumer_config.py",
     '        ("ack_policy", "ack policy can not be updated"),\n', "",
     T + "test_consumer_config_differential.py"),
    ("corrupt record served by MSG.GET", J + "get.py",
     "        return {\"type\": kind, **ApiError.of(\"JSStreamGeneralErrorF\", err=str(exc))"
     ".to_dict()}",
     "        return {\"type\": kind, \"message\": {\"subject\": str(exc)}}",
     T + "test_get_differential.py"),
    ("pull request batch limit unchecked", J + "pull.py",
     "if self.max_batch > 0 and batch > self.max_batch:", "if False:",
     T + "test_pull_differential.py"),
    ("pull request expiry never ends a request", J + "pull.py",
     "if req.deadline_ns and now_ns >= req.deadline_ns:", "if False:",
     T + "test_pull_differential.py"),
    ("counter keeps no running total", J + "stream.py",
     'return int(json.loads(msg.data)["val"]) + incr if msg else incr', "return incr",
     T + "test_stream_differential.py"),
    ("delete markers left for subjects that still have messages", J + "stream.py",
     "            if self.store.last_for_subject(subject):\n                continue\n", "",
     T + "test_stream_differential.py"),
    ("an expiring KV purge leaves a delete marker", J + "headers.py",
     ' or get(hdr, KV_OPERATION) == "PURGE"', "", T + "test_stream_differential.py"),
    ("atomic batch applied partly", J + "stream.py",
     "            checked = self._check_batch(op)\n",
     "            checked = [(\"\", 0)] * len(op.msgs)\n",
     T + "test_batch_differential.py"),
    ("num_pending cache misses removals", J + "stream.py",
     "            consumer.on_removed(seq, msg.subject)\n", "            pass\n",
     T + "test_consumer.py"),
    # -- the apply's caches (test_apply_batching.py) --
    ("max_age cache kept when the first message goes", J + "stream.py",
     "        if self._head is not None and seq <= self._head[0]:\n            self._head = None",
     "        pass", T + "test_apply_batching.py"),
    ("batch counts not written before a subject walk", J + "store/lmdbstore.py",
     "            self._write_counts(b)  # the walk below", "            pass  # the walk below",
     T + "test_apply_batching.py"),
    ("TTL floor not lowered by a new TTL", J + "store/lmdbstore.py",
     "            self._ttl_floor = min(self._ttl_floor, max(expires_ns, 0))", "            pass",
     T + "test_apply_batching.py"),
    ("an aborted batch keeps its index floors", J + "store/lmdbstore.py",
     "            self._forget_floors()  # the aborted batch",
     "            pass  # the aborted batch", T + "test_apply_batching.py"),
    ("a touched counter left unwritten when its net change is zero", J + "store/lmdbstore.py",
     "        if b.msgs is not None:\n            assert",
     "        if b.msgs is not None and b.msgs:\n            assert", T + "test_apply_batching.py"),
    ("lmdb per-subject last wrong", J + "store/lmdbstore.py",
     'if cur.set_range(head + b"\\xff" * 8):', "if cur.set_range(head):",
     T + "test_store.py"),
    # -- the wiring (jetraft serve -js) --
    ("wire: image names the in-memory applied index (compaction outruns LMDB)", J + "machines.py",
     "            index = _committed_applied(self.store)\n            self.env.sync()",
     "            index = self.stream.applied\n            self.env.sync()",
     T + "test_machines.py"),
    ("wire: clustered catch-up gets a marker, no exported image", J + "machines.py",
     "        return self.full_images and self.env is not None", "        return False",
     T + "test_machines.py"),
    ("wire: clustered compaction dumps the whole stream again", J + "machines.py",
     "        if self.env is None and self.full_images:",
     "        if self.env is not None and self.full_images:\n"
     "            return self.export_to(path)\n"
     "        if self.env is None and self.full_images:",
     T + "test_machines.py"),
    ("wire: restore accepts a store that lost the snapshot", J + "machines.py",
     "    if held < want:", "    if False:", T + "test_machines.py"),
    ("wire: catalogue re-applies entries LMDB holds", J + "machines.py",
     "                if index <= applied:\n                    continue  # already in LMDB",
     "                if False:\n                    continue  # already in LMDB",
     T + "test_machines.py"),
    ("wire: orphan sweep drops live streams", J + "service.py",
     "    return ([g for g in wal_groups if g not in live],",
     "    return ([g for g in wal_groups if g in live],", T + "test_machines.py"),
    ("wire: ack subject pending ignores the rest of the round", J + "service.py",
     ".{msg.ts_ns}.{left + new_after}\"", ".{msg.ts_ns}.{left}\"",
     "tests/integration/test_jetstream_serve.py::test_script_matches_nats_server"),
    ("push: no flow control request", J + "push.py",
     "if not self.fc_reply and self.in_flight > self.window // 2:", "if False:", PUSH_FC),
    ("push: window not enforced", J + "push.py",
     "return self.window > 0 and self.in_flight > self.window", "return False", PUSH_FC,
     "            if flight > self.window:\n                break", "            pass"),
    ("push: flow control answer ignored", J + "push.py",
     "if not self.fc_reply or subject != self.fc_reply:", "if True:", PUSH_FC),
    ("push: stalled flag missing from heartbeats", J + "push.py",
     "return heartbeat_header(last_cseq, last_sseq, self.fc_reply)",
     "return heartbeat_header(last_cseq, last_sseq)", PUSH_FC),
    ("push: no idle heartbeats", J + "push.py",
     "        if not listening:\n            return None",
     "        if True:\n            return None", PUSH_HB),
    ("push: heartbeat sequences swapped", J + "service.py",
     "pull.flow.heartbeat(now, st.delivered_cseq, st.delivered_sseq, True)",
     "pull.flow.heartbeat(now, st.delivered_sseq, st.delivered_cseq, True)", PUSH_HB),
    ("push: deliveries do not restart the heartbeat wait", J + "push.py",
     "        if self.heartbeat_ns:\n"
     "            self.next_heartbeat_ns = now_ns + self.heartbeat_ns\n"
     "        if not self.window:",
     "        if not self.window:", PUSH_HB),
    ("gaps: consumer created time not read from the store", J + "service.py",
     "created = sm.stream.consumer_created.get(name) or", "created = None or",
     "tests/integration/test_jetstream_pause.py::test_consumer_created_time_survives_restart"),
    ("gaps: +NXT answered as a plain ack", J + "service.py",
     "        if reply and wants_next:", "        if False:",
     "tests/integration/test_jetstream_acks.py"),
    ("gaps: paused consumer still delivers", J + "service.py",
     "                pull.paused = True  # the ticker pumps again once the pause is over\n"
     "                return False",
     "                pull.paused = True  # the ticker pumps again once the pause is over",
     "tests/integration/test_jetstream_pause.py::test_pause_and_unpin_match_nats_server"),
    # two paths resume delivery when a pause runs out (the ticker's pump of a paused
    # consumer, and the pause-end advisory's pump): the mutant removes both
    ("gaps: pause never ends", J + "service.py",
     "if pull.push or pull.paused or (due is not None and due <= now):",
     "if pull.push or (due is not None and due <= now):",
     "tests/integration/test_jetstream_pause.py::test_pause_and_unpin_match_nats_server",
     "                                                   *self._stamp()), _acc(sm.name))\n"
     "            self._pump(sm.name, name)\n\n    def _timer_drops",
     "                                                   *self._stamp()), _acc(sm.name))\n\n"
     "    def _timer_drops"),
    ("gaps: unknown ack bodies ack", J + "consumer.py",
     "    return None, 0, False\n", "    return AckKind.ACK, 0, False\n",
     "tests/integration/test_jetstream_acks.py"),
    ("gaps: ack metrics not sampled", J + "service.py",
     "            self._ack_sample(sm, info)\n            if not wants_next:",
     "            if not wants_next:",
     "tests/integration/test_jetstream_audit.py"),
    ("gaps: pinned group serves any client", J + "priority.py",
     "        return pin is None or req.pin_id == pin.pin_id", "        return True", PRIO),
    ("gaps: overflow thresholds ignored", J + "priority.py",
     "            if req.min_pending and num_pending < req.min_pending:\n"
     "                return False",
     "            if False:\n                return False", PRIO),
    ("gaps: pins never time out", J + "priority.py",
     "if now_ns - p.seen_ns >= self.timeout_ns]", "if False]", PRIO),
    ("gaps: restore renumbers messages", J + "stream.py",
     "            self._put(StoredMsg(m.seq, m.subject, m.hdr, m.data, m.ts_ns))\n"
     "            self.last_seq, self.last_ts = m.seq, m.ts_ns",
     "            seq = self._next_seq()\n"
     "            self._put(StoredMsg(seq, m.subject, m.hdr, m.data, m.ts_ns))\n"
     "            self.last_seq, self.last_ts = seq, m.ts_ns",
     "tests/integration/test_jetstream_snapshot.py"),
    ("gaps: restored consumer state dropped", J + "stream.py",
     "            consumer.state = ConsumerState.decode(op.state)\n", "",
     "tests/integration/test_jetstream_snapshot.py"),
    ("gaps: damaged snapshot accepted", J + "snapshot.py",
     "                if crc != want:", "                if False:",
     "tests/jetstream/test_snapshot.py"),
    ("push: ordered consumer kept alive without heartbeats", J + "push.py",
     "        if not listening:\n            return None",
     "        if True:\n            return None",
     "tests/integration/test_jetstream_push.py::test_ordered_consumer_matches_nats_server"),
    # Mirrors and sources (sourcing.py): resume after a restart without gaps or duplicates.
    ("source resume off by one (skips)", J + "sourcing.py",
     "opt_start_seq=done + 1)", "opt_start_seq=done + 2)",
     MK9),
    ("source resume off by one (repeats, guard off)", J + "sourcing.py",
     "opt_start_seq=done + 1)", "opt_start_seq=max(done, 1))",
     MK9,
     "        if m.origin_seq <= done:\n", "        if m.origin_seq < done:\n"),
    ("source progress not saved with the messages", J + "sourcing.py",
     "    stream.store.put_meta(_progress_key(op.key), _U64.pack(done) + op.ident.encode())",
     "    pass", MK9),
    ("source re-delivery guard off", J + "sourcing.py",
     "        if m.origin_seq <= done:\n", "        if m.origin_seq < done:\n",
     T + "test_sourcing.py"),
    ("source keeps progress across a re-created origin", J + "sourcing.py",
     "    if key != MIRROR_KEY and seen and ident and seen != ident:",
     "    if False:", MDIFF),
    ("sourced and mirrored messages keep their Nats-Expected-* headers", J + "sourcing.py",
     "    if EXPECTED_PREFIX not in hdr:\n        return hdr\n",
     "    return hdr\n", T + "test_sourcing.py"),
    ("mirror_direct mirror does not answer for its origin", J + "sourcing_wire.py",
     'if cfg.get("mirror_direct") and (cfg.get("mirror") or {}).get("name") == name \\',
     'if False and (cfg.get("mirror") or {}).get("name") == name \\', MKV),
    ("source ignores a full discard-new target", J + "sourcing.py",
     "            stream._check_discard_new(ops.StreamMsg(ts, subject, \"\", hdr, m.data))",
     "            pass", T + "test_sourcing.py"),
    ("sealed target still sourced", J + "sourcing.py",
     '    if src is None or stream.cfg["sealed"]:', "    if src is None:", T + "test_sourcing.py"),
]


def main() -> int:
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "tree"
        shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(
            ".git", "node_modules", "__pycache__", ".pytest_cache", ".hypothesis"))
        ran = 0
        only = sys.argv[1] if len(sys.argv) > 1 else ""  # run the mutants whose name has it
        for name, rel, original, mutated, tests, *more in MUTANTS:
            if only not in name:
                continue
            ran += 1
            path = copy / rel
            text = path.read_text()
            pairs = [(original, mutated)] + list(zip(more[::2], more[1::2], strict=True))
            stale = [o for o, _ in pairs if text.count(o) != 1]
            if stale:
                print(f"STALE     {name}: {stale[0]!r} does not match exactly once")
                failures += 1
                continue
            mutant_text = text
            for o, m in pairs:
                mutant_text = mutant_text.replace(o, m)
            path.write_text(mutant_text)
            try:
                result = subprocess.run(
                    [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                     tests], cwd=copy, env={"PYTHONPATH": str(copy), "PATH": _path()},
                    capture_output=True, text=True, timeout=600)
            finally:
                path.write_text(text)
            killed = result.returncode != 0
            failures += not killed
            by = next((ln.split(" - ")[0].split(" ", 1)[1] for ln in result.stdout.splitlines()
                       if ln.startswith(("FAILED ", "ERROR ")) and "::" in ln), "")
            print(f"{'killed  ' if killed else 'SURVIVED'}  {name}  ({tests})  {by}", flush=True)
    print(f"{ran - failures}/{ran} mutants killed")
    return 1 if failures else 0


def _path() -> str:
    import os
    return os.environ.get("PATH", "")


if __name__ == "__main__":
    sys.exit(main())
