"""`jetraft cluster status` shows each stream's Raft leader and its replicas' lag."""

from __future__ import annotations

import io
import time

from node.cluster.local import cluster_status, status_report, stream_rows
from tests.cluster.jshelp import JsCluster, api, connect


def _page(peer: str, others: list[tuple[str, str]], state: str, commit: int, applied: int,
          leader: str) -> dict:
    return {"meta_cluster": {"peer": peer, "replicas": [{"name": n, "peer": p}
                                                        for n, p in others]},
            "raft": {"$js": {"state": "follower", "commit": 9, "applied": 9},
                     "js.ORDERS.17": {"state": state, "term": 2, "commit": commit,
                                      "applied": applied, "leader": leader}}}


def test_stream_rows_name_the_leader_and_count_unapplied_entries() -> None:
    peers = {"n1": "aaaa1111", "n2": "bbbb2222", "n3": "cccc3333"}
    lead = peers["n2"] + "00000000"

    def others(me: str) -> list[tuple[str, str]]:
        return [(n, p) for n, p in peers.items() if n != me]

    pages = [("n1", _page(peers["n1"], others("n1"), "follower", 40, 37, lead)),
             ("n2", _page(peers["n2"], others("n2"), "leader", 42, 42, lead)),
             ("n3", _page(peers["n3"], others("n3"), "follower", 42, 42, lead))]
    assert stream_rows(pages) == [{"stream": "ORDERS", "leader": "n2", "lag": "n1=5,n3=0",
                                   "group": "js.ORDERS.17"}]
    # Without the leader's page the followers still name it, and lag is against the
    # highest commit they know of.
    assert stream_rows([pages[0], pages[2], ("n2", None)]) == [
        {"stream": "ORDERS", "leader": "n2", "lag": "n1=5,n3=0", "group": "js.ORDERS.17"}]


async def test_status_shows_stream_leader_and_lag_of_a_real_cluster(js3: JsCluster) -> None:
    nc = await connect(js3.nodes[0])
    try:
        info = await api(nc, "STREAM.CREATE.ST", {"name": "ST", "subjects": ["st"],
                                                  "num_replicas": 3})
        for i in range(20):
            await nc.request("st", str(i).encode(), timeout=5)
        # the leader now (the create's reply may name none yet, or one a loaded cluster
        # replaced since)
        info = await api(nc, "STREAM.INFO.ST")
    finally:
        await nc.close()
    leader = info["cluster"]["leader"]
    monitors = [(n.name, n.http) for n in js3.nodes]
    deadline = time.monotonic() + 10
    while True:  # followers apply shortly after the leader's commit
        _, streams = status_report(monitors)
        row = streams[0] if streams else {}
        if row.get("lag", "").count("=0") == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    followers = sorted(n.name for n in js3.nodes if n.name != leader)
    assert row == {"stream": "ST", "leader": leader, "group": info["cluster"]["raft_group"],
                   "lag": f"{followers[0]}=0,{followers[1]}=0"}
    out = io.StringIO()
    assert cluster_status(["--monitor", ",".join(m for _, m in monitors)], out, out) == 0
    text = out.getvalue()
    assert "STREAM  LEADER" in text and f"ST      {leader}" in text, text
