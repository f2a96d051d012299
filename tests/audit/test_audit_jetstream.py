"""The audit's JetStream hooks on real data directories of a real `jetraft serve -js` run,
in Spark local mode.

Healthy: the stream groups and the meta group replay to exactly what the node's LMDB holds
(zero findings). Damaged: copies of the node's directory, each with one fault in its LMDB
store, give exactly the expected violation naming that copy (node), the group and the
applied index: a message deleted, a message altered, a consumer's ack floor moved, a stream
missing from the catalogue, a stream's config changed in the catalogue.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("pyspark")  # the Java check is in the `spark` fixture

from audit import model  # noqa: E402
from audit.job import run  # noqa: E402
from audit.jsstore import META_STORE, NodeStore, find_lmdb, prefix  # noqa: E402
from audit.report import build  # noqa: E402
from node.jetstream.consumer import ConsumerState  # noqa: E402

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def js_logs(tmp_path_factory) -> Path:
    from tests.audit.jslogs import make_js_logs

    root = tmp_path_factory.mktemp("audit-js")
    return asyncio.run(make_js_logs(root))["dirs"][0]


def _groups(node_dir: Path) -> dict[str, str]:
    store = NodeStore(find_lmdb(str(node_dir)))
    try:
        return {name: e["group"] for name, e in store.catalogue().items()}
    finally:
        store.close()


def _applied(node_dir: Path, group: str) -> int:
    store = NodeStore(find_lmdb(str(node_dir)))
    try:
        return store.applied(group)
    finally:
        store.close()


def _edit(node_dir: Path, db: str, key: bytes, change) -> None:
    """Rewrite one LMDB value in place (`change(old) -> new`, None deletes it)."""
    import lmdb

    env = lmdb.open(str(node_dir / "lmdb"), max_dbs=16)
    try:
        with env.begin(write=True) as txn:
            handle = env.open_db(db.encode(), txn=txn, create=False)
            old = txn.get(key, db=handle)
            assert old is not None, (db, key)
            new = change(bytes(old))
            if new is None:
                txn.delete(key, db=handle)
            else:
                txn.put(key, new, db=handle)
    finally:
        env.close()


def _edit_streams(node_dir: Path, change) -> None:
    """Change the streams of a node's catalogue (`change(streams)` edits the dict), in the
    node's layout: `catalogue` = {"streams": {...}, ...}, or the single-node `streams` key."""

    def edit(old: bytes) -> bytes:
        doc = json.loads(old)
        change(doc["streams"] if "streams" in doc else doc)
        return json.dumps(doc).encode()

    import lmdb

    env = lmdb.open(str(node_dir / "lmdb"), max_dbs=16, readonly=True)
    try:
        with env.begin() as txn:
            handle = env.open_db(b"js_meta", txn=txn, create=False)
            key = prefix(META_STORE) + b"catalogue"
            if txn.get(key, db=handle) is None:
                key = prefix(META_STORE) + b"streams"
    finally:
        env.close()
    _edit(node_dir, "js_meta", key, edit)


def _audit(spark, dirs: list[Path]) -> dict:
    return build(run(spark, [str(d) for d in dirs]))


def _violations(report: dict) -> list[tuple]:
    return sorted((f["kind"], f.get("node"), f.get("group"), f.get("index"), f["detail"])
                  for f in report["findings"] if f["severity"] == model.VIOLATION)


def test_healthy_jetstream_store_replays_to_the_same_state(spark, js_logs, tmp_path):
    n1, n2 = tmp_path / "n1", tmp_path / "n2"
    shutil.copytree(js_logs, n1)
    shutil.copytree(js_logs, n2)
    report = _audit(spark, [n1, n2])
    assert report["findings"] == [], report["findings"]
    groups = _groups(n1)
    assert set(groups) == {"ORDERS", "EVENTS"}  # GONE was created and deleted
    replayed = set(report["stats"]["replayed_groups"])
    assert {"$js", groups["ORDERS"], groups["EVENTS"]} <= replayed


def test_damaged_stores_are_reported_per_node(spark, js_logs, tmp_path):
    # "aconfig" sorts first: a hook that took the stream's config from the first node's
    # catalogue instead of the meta log would replay with the damaged config.
    dirs = {n: tmp_path / n for n in ("ok", "lost", "altered", "floor", "meta", "aconfig")}
    for d in dirs.values():
        shutil.copytree(js_logs, d)
    groups = _groups(dirs["ok"])
    orders, events = groups["ORDERS"], groups["EVENTS"]
    # A message deleted from one store (only its record: the index still names it).
    _edit(dirs["lost"], "js_msgs", prefix(orders) + (5).to_bytes(8, "big"), lambda old: None)
    # A stored message altered: one payload byte (its CRC no longer matches).
    store = NodeStore(find_lmdb(str(dirs["ok"])))
    last_events = int.from_bytes(list(store.items("js_msgs", events))[-1][0], "big")
    store.close()
    _edit(dirs["altered"], "js_msgs", prefix(events) + last_events.to_bytes(8, "big"),
          lambda old: old[:-1] + bytes([old[-1] ^ 1]))
    # A consumer's ack floor moved forward.

    def move_floor(old: bytes) -> bytes:
        state = ConsumerState.decode(old)
        state.floor_sseq, state.floor_cseq = state.floor_sseq + 3, state.floor_cseq + 3
        return state.encode()

    _edit(dirs["floor"], "js_consumers", prefix(orders) + b"worker", move_floor)
    # The healthy node's record rewritten in the JSON format older nodes wrote: the same
    # state, so no finding (a store written before the binary record was audited).
    _edit(dirs["ok"], "js_consumers", prefix(orders) + b"worker",
          lambda old: ConsumerState.decode(old).to_json())
    # A stream missing from one node's catalogue.

    _edit_streams(dirs["meta"], lambda streams: streams.pop("EVENTS"))
    # A stream's config changed in one node's catalogue: a meta finding only (the stream
    # replay takes the config from the meta log's create entry, not from the catalogue).

    _edit_streams(dirs["aconfig"],
                  lambda streams: streams["ORDERS"]["config"].update(max_msgs=7))

    report = _audit(spark, list(dirs.values()))
    at = {g: _applied(dirs["ok"], g) for g in (orders, events)}
    at["$js"] = _applied(dirs["ok"], META_STORE)
    assert _violations(report) == sorted([
        (model.STORE_MISMATCH, "lost", orders, at[orders],
         "message seq 5 missing from the store"),
        (model.STORE_MISMATCH, "altered", events, at[events],
         f"message seq {last_events} differs from the replay (stream 'store' message "
         f"{last_events}: corrupt record (crc mismatch))"),
        (model.STORE_MISMATCH, "floor", orders, at[orders],
         "consumer 'worker' state differs from the replay (ack floor: store "
         + _floor_text(dirs["ok"], orders, 3) + ")"),
        (model.META_MISMATCH, "meta", "$js", at["$js"],
         "stream 'EVENTS' missing from the node's catalogue"),
        (model.META_MISMATCH, "aconfig", "$js", at["$js"],
         "stream 'ORDERS' differs from the replayed meta log in config"),
    ]), report["findings"]
    assert not report["verdict"]["ok"]


def _floor_text(node_dir: Path, group: str, moved: int) -> str:
    store = NodeStore(find_lmdb(str(node_dir)))
    try:
        state = json.loads(ConsumerState.decode(
            store.get("js_consumers", prefix(group) + b"worker")).to_json())
    finally:
        store.close()
    floor = state["f"]
    return (f"[{state['d']}, {[floor[0] + moved, floor[1] + moved]}], "
            f"replay [{state['d']}, {floor}]")
