"""The node's change mark (node/jetstream/changes.py): every event that can change what the
passes over all streams find moves it, on a real LMDB store. The usage report and the
expiry scan skip their O(streams) work while it stands still, so a missed move would leave
a report stale or a stream that can now expire unscanned.

Mutations (docs/notes/scale14.md): dropping the move in `StreamMachine.apply_batch`,
`_restore_from`'s wrapper, `Inflight.reserve` or `Inflight._release_all` fails
`test_every_change_the_passes_look_for_moves_the_mark`."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from node.jetstream import config, ops
from node.jetstream.changes import ChangeMark
from node.jetstream.machines import StreamMachine
from node.jetstream.store.lmdbstore import NodeEnv


def _cfg() -> config.Config:
    cfg, pedantic = config.parse_request(b'{"name":"S","subjects":["s.>"]}')
    return config.check_create("S", cfg, pedantic, {})[0]


def _msg(i: int) -> bytes:
    return ops.encode(ops.StreamMsg(1_000 + i, "s.x", f"_r.{i}", b"", f"m{i}".encode()))


def _machine(env: NodeEnv, mark: ChangeMark) -> StreamMachine:
    sm = StreamMachine("S", "js.S.1", _cfg(), env, lambda _sm, _e: None, 1, "", mark)
    sm.full_images = True
    return sm


def _moves(mark: ChangeMark, action: Any) -> bool:
    before = mark.value
    action()
    return mark.value != before


def test_every_change_the_passes_look_for_moves_the_mark(tmp_path: Path) -> None:
    mark = ChangeMark()
    env, env2 = NodeEnv(str(tmp_path / "a")), NodeEnv(str(tmp_path / "b"))
    sm = _machine(env, mark)
    # a follower's apply: no reservation is released, the stored bytes still change
    assert _moves(mark, lambda: sm.apply_batch([(2, _msg(2)), (3, _msg(3))]))
    key = 0

    def reserve() -> None:
        nonlocal key
        key = sm.inflight.reserve(5_000, 100, 120)

    assert _moves(mark, reserve)  # the leader holds a publish: counted at once
    assert _moves(mark, lambda: sm.inflight.release(key))  # its proposal failed
    assert _moves(mark, lambda: sm.on_leader_change(2, 5))  # nothing held, leader moved
    image = str(tmp_path / "image")
    assert sm.export_to(image) == 3
    other = _machine(env2, mark)
    assert _moves(mark, lambda: other.restore_from(image))  # a replica installs an image
    assert other.store.msgs() == 2
    # a reservation released by the apply that stores it
    assert _moves(mark, lambda: sm.inflight.reserve(1_004, 10, 10))
    held = mark.value
    sm.apply_batch([(4, _msg(4))])
    assert mark.value != held and sm.inflight.msgs == 0
    env.close()
    env2.close()


def test_a_value_read_never_comes_back_while_threads_race() -> None:
    """Two threads move the mark while a reader takes values: a value once read is never
    seen again, although two racing moves may store their values out of order."""
    mark = ChangeMark()
    stop = threading.Event()

    def mover() -> None:
        while not stop.is_set():
            mark.move()

    threads = [threading.Thread(target=mover) for _ in range(2)]
    for t in threads:
        t.start()
    seen: set[int] = set()
    last = None
    try:
        for _ in range(200):
            v = mark.value
            if v != last:
                assert v not in seen
                seen.add(v)
                last = v
            time.sleep(0.0001)  # let the movers run (the GIL)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert len(seen) > 10
