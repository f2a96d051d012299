"""The leader's count of publishes proposed and not yet applied (node/jetstream/inflight.py)
and the entry heads it is released from (`ops.msg_clocks`)."""

from __future__ import annotations

import threading

from node.jetstream import ops
from node.jetstream.inflight import Inflight


def _msg(ns: int, data: bytes = b"x") -> bytes:
    return ops.encode(ops.StreamMsg(ns, "s", "r", b"", data))


def test_msg_clocks_of_single_and_merged_publishes_only() -> None:
    assert ops.msg_clocks(_msg(7)) == [7]
    assert ops.msg_clocks(ops.merge_msgs([_msg(5), _msg(9, b"y" * 300), _msg(6)])) == [5, 9, 6]
    assert ops.msg_clocks(ops.encode(ops.DeleteMsg(3, 1))) == []
    assert ops.msg_clocks(b"") == []
    merged = ops.merge_msgs([_msg(5), _msg(9)])
    assert ops.msg_clocks(merged[:-len(_msg(9)) + 3]) == [5]  # a torn tail yields no more


def test_reserve_release_on_apply_failure_and_leader_change() -> None:
    f = Inflight()
    # the same clock three times: each publish gets its own key
    keys = [f.reserve(100, 10, 4) for _ in range(3)]
    assert keys == [100, 101, 102] and (f.msgs, f.bytes, f.buffered) == (3, 30, 12)
    f.release_entries([(1, ops.merge_msgs([_msg(100), _msg(555)]))])  # 555 not held here
    assert (f.msgs, f.bytes) == (2, 20)
    f.release(101)
    f.release(101)  # a failure reported after the apply: nothing more
    assert (f.msgs, f.bytes, f.buffered) == (1, 10, 4)
    f.clear()  # the leader changed
    assert (f.msgs, f.bytes, f.buffered) == (0, 0, 0)
    f.release_entries([(2, _msg(102))])
    assert f.msgs == 0


def test_the_bound_lets_in_what_the_streams_own_limits_let_in() -> None:
    f = Inflight()
    for i in range(10):
        f.reserve(i, 100 + i, 0)
    plain = {"discard": "old", "max_msgs": -1, "max_bytes": -1}
    assert f.bound(1000, 5, plain) == 1000 + f.bytes
    assert f.bound(1000, 5, {**plain, "max_bytes": 1500}) == 1500
    assert f.bound(2000, 5, {**plain, "max_bytes": 1500}) == 2000  # never below stored
    # discard new + max_msgs: only the first `room` in proposal order get stored
    assert f.bound(1000, 7, {**plain, "discard": "new", "max_msgs": 10}) == 1000 + 100 + 101 + 102
    assert f.bound(1000, 12, {**plain, "discard": "new", "max_msgs": 10}) == 1000
    assert f.bound(1000, 7, {**plain, "max_msgs": 10}) == 1000 + f.bytes  # discard old


def test_an_apply_thread_releasing_while_the_loop_reserves_keeps_the_totals() -> None:
    f = Inflight()
    n = 20000
    for k in range(n):
        f.reserve(k, 3, 1)
    done = threading.Event()

    def apply_worker() -> None:
        for k in range(0, n, 50):
            f.release_entries([(k, ops.merge_msgs([_msg(j) for j in range(k, k + 50)]))])
        done.set()

    t = threading.Thread(target=apply_worker)
    t.start()
    for k in range(n, 2 * n):
        f.reserve(k, 3, 1)
    t.join()
    assert done.is_set() and (f.msgs, f.bytes, f.buffered) == (n, 3 * n, n)


def test_a_stream_machine_releases_on_apply_and_forgets_all_at_a_leader_change() -> None:
    from node.jetstream import config
    from node.jetstream.machines import StreamMachine
    from node.jetstream.store.base import memory_size

    cfg, pedantic = config.parse_request(b'{"name":"S","subjects":["s"],"storage":"memory"}')
    sm = StreamMachine("S", "js.S.1", config.check_create("S", cfg, pedantic, {})[0], None,
                       lambda _sm, _e: None, 1)
    size = memory_size("s", b"", b"x")
    for ns in (10, 11, 12):
        sm.inflight.reserve(ns, size, 1)
    assert sm.counted_bytes() == 3 * size
    sm.apply_batch([(1, ops.merge_msgs([_msg(10), _msg(11)]))])
    # stored or held, each publish once
    assert (sm.store.msgs(), sm.inflight.msgs, sm.counted_bytes()) == (2, 1, 3 * size)
    sm.on_leader_change(2, 7)  # deposed: the proposal of clock 12 is not ours to count
    assert (sm.inflight.msgs, sm.counted_bytes()) == (0, 2 * size)


def test_a_batch_or_a_copied_entry_is_one_reservation_of_several_messages() -> None:
    f = Inflight()
    batch = ops.StreamBatch(50, "b1", tuple(ops.StreamMsg(50, "s", "", b"", b"x")
                                            for _ in range(3)))
    copied = ops.SourceMsgs(60, "", "ident", tuple(ops.SourcedMsg(i, 1, "s", b"", b"y")
                                                   for i in range(1, 5)))
    assert ops.msg_clocks(ops.encode(batch)) == [50]
    assert ops.msg_clocks(ops.encode(copied)) == [60]
    f.reserve(50, 300, 30, 3)
    f.reserve(60, 400, 40, 4)
    f.reserve(70, 100, 10)
    assert (f.msgs, f.bytes, f.buffered) == (8, 800, 80)
    # discard new, room for 5: the batch (3) fits, the copy (4) does not fit whole
    plain = {"discard": "new", "max_msgs": 10, "max_bytes": -1}
    assert f.bound(0, 5, plain) == 300
    f.release_entries([(1, ops.encode(batch)), (2, ops.encode(copied))])
    assert (f.msgs, f.bytes, f.buffered) == (1, 100, 10)


def test_the_apply_takes_a_held_op_only_for_its_exact_bytes() -> None:
    """`Inflight.own`: a leader's publish held with its entry is applied from its op (no
    decode) only where the committed part is byte for byte that entry; a part with the same
    clock but other bytes (another proposer's entry) is decoded and stored as it is.
    Mutation: `own` without its byte comparison -> the held op's data is stored: FAILS."""
    from node.jetstream import config
    from node.jetstream.machines import StreamMachine
    from node.jetstream.store.base import memory_size

    cfg, pedantic = config.parse_request(b'{"name":"S","subjects":["s"],"storage":"memory"}')
    sm = StreamMachine("S", "js.S.1", config.check_create("S", cfg, pedantic, {})[0], None,
                       lambda _sm, _e: None, 1)
    held = {}
    for ns, data in ((10, b"mine"), (11, b"also mine")):
        op = ops.StreamMsg(ns, "s", "r", b"", data)
        held[ns] = op
        assert sm.inflight.reserve(ns, memory_size("s", b"", data), 1, entry=ops.encode(op),
                                   op=op) == ns
    entry = ops.merge_msgs([_msg(10, b"mine"), _msg(11, b"theirs")])
    assert sm.inflight.own(10, entry, 4 + 9 + 4, len(_msg(10, b"mine"))) is held[10]
    assert sm.inflight.own(11, entry, 4 + 9 + 4 + len(_msg(10, b"mine")) + 4,
                           len(_msg(11, b"theirs"))) is None
    assert sm.inflight.own(12, entry, 0, 1) is None  # not held
    decoded = ops.decode(entry, sm.inflight.own)
    assert decoded.msgs[0] is held[10] and decoded.msgs[1] == ops.decode(_msg(11, b"theirs"))
    sm.apply_batch([(1, entry)])
    assert [sm.store.load(s).data for s in (1, 2)] == [b"mine", b"theirs"]
    assert sm.inflight.msgs == 0
    # a clock bumped by `reserve` keeps no entry: that publish is decoded
    op = ops.StreamMsg(20, "s", "r", b"", b"z")
    sm.inflight.reserve(20, 1, 1)
    assert sm.inflight.reserve(20, 1, 1, entry=ops.encode(op), op=op) == 21
    assert sm.inflight.own(21, ops.encode(op), 0, len(ops.encode(op))) is None
