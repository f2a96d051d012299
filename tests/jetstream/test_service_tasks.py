"""Spawned JetStream tasks that meet a Raft group removed under them (service.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from node.jetstream.service import JetStreamService
from raft.multigroup import ProposalDropped


async def test_an_expiry_whose_group_was_removed_under_it_is_not_a_task_failure() -> None:
    """Two nodes expire the same inactive consumer (its stream's leader and its own group's
    leader): the second's ConsumerDelete meets 'group removed'. That is no task failure
    (an [ERR] line: the test_js_cluster module-teardown check), and its pull goes."""
    svc = JetStreamService.__new__(JetStreamService)
    errors: list[str] = []
    svc.log = SimpleNamespace(error=errors.append, warn=lambda _m: None)
    svc._tasks = set()
    svc.pulls = {("S", "c"): object()}

    async def dropped(_sm: Any, _op: Any) -> int:
        raise ProposalDropped("group removed")

    svc._propose = dropped  # type: ignore[method-assign]
    task = svc._spawn(svc._expire_consumer(SimpleNamespace(name="S"), "c"))
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(0)  # the done callback
    assert errors == []
    assert ("S", "c") not in svc.pulls
