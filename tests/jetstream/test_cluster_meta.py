"""The meta group's entries and their fold (node/jetstream/cluster_meta.py), pure."""

from __future__ import annotations

import json

from node.jetstream import cluster_meta as cm


def fold(entries: list[dict], self_peer: int = 7) -> cm.Catalogue:
    cat = cm.Catalogue()
    for i, e in enumerate(entries, start=2):
        cat.apply(json.loads(cm.encode(e)), self_peer, i)
    return cat


def test_create_update_delete_and_revisions() -> None:
    cat = fold([cm.create("S", {"name": "S"}, 5, [1, 2, 3]),
                cm.create("S", {"name": "other"}, 6, [4]),  # a retried create keeps the first
                cm.update("S", {"name": "S", "max_msgs": 9}, [1, 2, 3])])
    a = cat.streams["S"]
    assert a["group"] == "js.S.5" and a["peers"] == [1, 2, 3] and a["rev"] == 4
    assert a["config"]["max_msgs"] == 9 and "scaled" not in a  # same peers: not scaled
    cat.apply(cm.update("S", a["config"], [1, 2, 4]), 7, 5)
    assert cat.streams["S"]["scaled"] is True and cat.streams["S"]["rev"] == 5
    assert cat.load() == {1: 1, 2: 1, 4: 1} and cat.assigned_to(4) == ["S"]
    assert cat.apply(cm.delete("S"), 7, 6) == "S" and cat.streams == {}
    assert cat.apply(cm.delete("S"), 7, 7) is None


def test_single_node_create_means_the_node_itself_and_unknown_ops_are_ignored() -> None:
    cat = fold([{"op": "create", "name": "S", "config": {}, "created_ns": 1, "group": "js.S.1"},
                {"op": "future-op", "x": 1}])
    assert cat.peers("S", 7) == [7]


def test_removed_and_seen_peers_survive_the_json_image() -> None:
    cat = fold([cm.remove_server(9), cm.remove_server(9), cm.seen(3), cm.seen(3),
                cm.create("T", {}, 2, [3])])
    again = cm.Catalogue.from_json(json.loads(json.dumps(cat.to_json())))
    assert again.removed == [9] and again.seen == [3] and list(again.streams) == ["T"]
    old = cm.Catalogue.from_json({"T": {"op": "create", "name": "T"}})  # single-node layout
    assert list(old.streams) == ["T"] and old.removed == []


def test_consumer_groups_fold_under_their_stream() -> None:
    cat = fold([cm.create("S", {"name": "S"}, 5, [1, 2, 3]),
                cm.consumer("S", "c", "jc.S.c.9", [2], {"durable_name": "c"}, 4, 0, 9),
                cm.consumer("S", "c", "jc.S.c.10", [3], {}, 1, 0, 10),  # retry: first kept
                cm.consumer("gone", "c", "jc.gone.c.1", [1], {}, 1, 0, 1),  # no such stream
                cm.consumer("S", "d", "jc.S.d.11", [1, 3], {}, 1, 0, 11),
                cm.update("S", {"name": "S", "max_msgs": 9}, [1, 2, 3])])
    groups = cat.consumer_groups()
    assert set(groups) == {("S", "c"), ("S", "d")}
    assert groups[("S", "c")] == {"group": "jc.S.c.9", "peers": [2], "config": {
        "durable_name": "c"}, "start": 4, "lps": 0, "created_ns": 9, "rev": 3}
    assert cat.consumer_load() == {2: 1, 1: 1, 3: 1}
    again = cm.Catalogue.from_json(json.loads(json.dumps(cat.to_json())))
    assert again.consumer_groups() == groups
    cat.apply(cm.consumer_delete("S", "c"), 7, 8)
    assert set(cat.consumer_groups()) == {("S", "d")}
    cat.apply(cm.delete("S"), 7, 9)  # the stream's consumers go with it
    assert cat.consumer_groups() == {} and cat.consumer_load() == {}
    acc = cm.consumer("A/S", "c", "jc.A/S.c.1", [1], {}, 1, 0, 1)
    assert acc["account"] == "A" and cm.consumer_delete("A/S", "c")["account"] == "A"


def test_consumer_update_re_places_a_group_and_marks_it_scaled() -> None:
    """A consumer group's re-placement (replicas or stream peers changed): new peers and
    config; `scaled` once the peers changed (a peer added later joins empty); a consumer
    that moved out of its stream's group keeps its starting state in the assignment."""
    cat = fold([cm.create("S", {"name": "S"}, 5, [1, 2, 3]),
                cm.consumer("S", "c", "jc.S.c.9", [2], {"num_replicas": 1}, 0, 0, 9, "AgU=")])
    g = cat.consumer_group("S", "c")
    assert g["state"] == "AgU=" and "scaled" not in g
    cat.apply(cm.consumer_update("S", "c", [2], {"num_replicas": 0}), 7, 4)
    g = cat.consumer_group("S", "c")
    assert g["config"] == {"num_replicas": 0} and g["rev"] == 4 and "scaled" not in g
    cat.apply(cm.consumer_update("S", "c", [2, 3, 1], {"num_replicas": 3}), 7, 5)
    g = cat.consumer_group("S", "c")
    assert g["peers"] == [2, 3, 1] and g["scaled"] is True and g["group"] == "jc.S.c.9"
    assert cat.apply(cm.consumer_update("S", "nope", [1], {}), 7, 6) is None
    assert cat.consumer_groups().keys() == {("S", "c")}
