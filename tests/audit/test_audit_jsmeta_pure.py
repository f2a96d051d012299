"""The meta hook's fold and comparison, without Spark: both catalogue layouts a node may keep
(single-node `streams`, clustered `catalogue` with peers and revisions)."""

from __future__ import annotations

import json

from audit.hook_jsmeta import BadEntry, Catalogue, UnknownOp, compare


def _fold(entries: list[dict]) -> Catalogue:
    cat = Catalogue()
    for index, entry in enumerate(entries, start=2):
        cat.apply(index, json.dumps(entry).encode())
    return cat


CFG = {"name": "S", "subjects": ["s"], "num_replicas": 3}
LOG = [
    {"op": "create", "name": "S", "config": CFG, "created_ns": 5, "group": "js.S.5",
     "peers": [11, 22, 33]},
    {"op": "create", "name": "T", "config": {"name": "T"}, "created_ns": 6, "group": "js.T.6",
     "peers": [22]},
    {"op": "create", "name": "S", "config": {"name": "S", "x": 1}, "created_ns": 7,
     "group": "js.S.7", "peers": [11]},  # a retried create: the first one stays
    {"op": "update", "name": "S", "config": {**CFG, "max_msgs": 9}, "peers": [11, 22, 44]},
    {"op": "delete", "name": "T"},
    {"op": "remove_server", "peer": 33},
]


def _clustered_belief() -> tuple[dict, list[int]]:
    streams = {"S": {**LOG[0], "config": {**CFG, "max_msgs": 9}, "peers": [11, 22, 44],
                     "scaled": True, "rev": 5}}
    return streams, [33]


def test_clustered_catalogue_matches_its_log() -> None:
    assert compare(*_clustered_belief(), _fold(LOG)) == []


def test_clustered_catalogue_differences_are_named() -> None:
    streams, removed = _clustered_belief()
    streams["S"]["peers"] = [11, 22, 55]
    assert compare(streams, removed, _fold(LOG)) == [
        "stream 'S' differs from the replayed meta log in peers"]
    assert compare({}, [], _fold(LOG)) == [
        "stream 'S' missing from the node's catalogue",
        "removed peers [] differ from the replayed meta log [33]"]


def test_single_node_layout_keeps_create_entries_without_peers() -> None:
    entry = {"op": "create", "name": "S", "config": CFG, "created_ns": 5, "group": "js.S.5"}
    cat = _fold([entry])
    assert compare({"S": entry}, None, cat) == []
    # A node that filled in its own peer id is fine too (the log does not name it).
    assert compare({"S": {**entry, "peers": [77], "rev": 2}}, [], cat) == []
    assert compare({"S": {**entry, "group": "js.S.6"}}, None, cat) == [
        "stream 'S' differs from the replayed meta log in group"]


def test_unreadable_entries_are_refused() -> None:
    cat = Catalogue()
    for bad in (b"{", b"[]", b'{"name": "S"}', b'{"op": "create"}'):
        try:
            cat.apply(2, bad)
        except BadEntry:
            continue
        raise AssertionError(bad)
    try:
        cat.apply(2, b'{"op": "teleport"}')
    except UnknownOp:
        pass
    else:
        raise AssertionError("unknown op accepted")


def test_seen_peers_are_folded_and_compared() -> None:
    cat = _fold([*LOG, {"op": "seen", "peer": 22}, {"op": "seen", "peer": 11},
                 {"op": "seen", "peer": 22}])
    streams, removed = _clustered_belief()
    assert compare(streams, removed, cat, [11, 22]) == []
    assert compare(streams, removed, cat, None) == []  # a layout without `seen`
    assert compare(streams, removed, cat, [22]) == [
        "seen peers [22] differ from the replayed meta log [11, 22]"]
    try:
        Catalogue().apply(2, b'{"op": "seen"}')
    except BadEntry:
        pass
    else:
        raise AssertionError("seen without a peer accepted")


def test_consumer_groups_replay_as_the_node_folds_them() -> None:
    """The audit's own fold of `consumer` / `consumer_delete` gives the node's catalogue
    (node/jetstream/cluster_meta.py) at every prefix of a log, and a node missing a consumer
    group is named."""
    from node.jetstream import cluster_meta as cm
    log = [cm.create("S", {"name": "S"}, 5, [1, 2, 3]),
           cm.consumer("S", "c", "jc.S.c.9", [2], {"durable_name": "c"}, 4, 0, 9),
           cm.consumer("S", "c", "jc.S.c.10", [3], {}, 1, 0, 10),
           cm.consumer("S", "d", "jc.S.d.11", [1, 3], {}, 1, 0, 11),
           cm.update("S", {"name": "S", "max_msgs": 9}, [1, 2, 3]),
           cm.consumer_update("S", "c", [2], {"num_replicas": 1}),  # config only
           cm.consumer_update("S", "c", [2, 1, 3], {"num_replicas": 3}),  # grown: scaled
           cm.consumer_update("S", "x", [1], {}),  # no such consumer group
           cm.consumer("S", "m", "jc.S.m.12", [1], {}, 0, 0, 12, "AgU="),  # moved, with state
           cm.consumer_delete("S", "d"), cm.consumer_delete("S", "c")]
    for n in range(1, len(log) + 1):
        node = cm.Catalogue()
        for i, e in enumerate(log[:n], start=2):
            node.apply(json.loads(cm.encode(e)), 7, i)
        assert compare(node.streams, [], _fold(log[:n]), []) == []
    node = cm.Catalogue()
    for i, e in enumerate(log[:4], start=2):
        node.apply(json.loads(cm.encode(e)), 7, i)
    node.apply(cm.consumer_delete("S", "c"), 7, 6)  # the node lost a group the log has
    assert compare(node.streams, [], _fold(log[:4]), [])
