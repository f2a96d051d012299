"""The cluster-wide stream usage book (node/jetstream/usage.py), pure."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from node.jetstream import usage


@given(st.dictionaries(st.text(max_size=10), st.integers(0, 2**62)))
def test_reports_round_trip(streams: dict[str, int]) -> None:
    assert usage.decode(usage.encode(streams)) == streams


def test_malformed_reports_read_as_empty_or_filtered() -> None:
    assert usage.decode(b"not json") == {} and usage.decode(b"[1]") == {}
    assert usage.decode(b'{"A/S": -1, "B": true, "C": "x", "D": 5}') == {"D": 5}


def test_leader_first_then_fresh_report_then_own_replica() -> None:
    book = usage.UsageBook()
    book.receive({"A/S": 100}, now=10.0)
    assert book.bytes_of("A/S", 10.1, led_here=7, hosted_here=3) == 7
    assert book.bytes_of("A/S", 10.1, led_here=None, hosted_here=3) == 100
    book.receive({"A/S": 150}, now=11.0)  # the newest report wins
    assert book.bytes_of("A/S", 11.0, None, None) == 150
    # a stale report no longer stands for the stream: this node's replica does, or 0
    assert book.bytes_of("A/S", 11.0 + usage.STALE + 1, None, 3) == 3
    assert book.bytes_of("A/S", 11.0 + usage.STALE + 1, None, None) == 0
    book.forget({"A/S"})
    assert book.bytes_of("A/S", 11.0, None, None) == 0


def test_a_report_carries_the_nodes_replicated_consumers_apart() -> None:
    book = usage.UsageBook()
    book.receive(usage.decode(usage.encode({"A/S": 7}, ha_consumers=3)), now=1.0, peer=2)
    assert book.ha == {2: 3} and set(book.reports) == {"A/S"}
