"""Spawned JetStream tasks that meet a Raft group removed under them (service.py)."""

from __future__ import annotations

import asyncio
import gc
import threading
from types import SimpleNamespace
from typing import Any

from node.jetstream import api, service
from node.jetstream.service import JetStreamService
from node.jetstream.store.memstore import MemStore
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


def _held_forever_service() -> tuple[JetStreamService, list[asyncio.Future[None]]]:
    """A service whose stream group "g" holds committed entries and whose driver never
    applies them (it failed or is stopping): every `apply_held` future stays pending."""
    svc = JetStreamService.__new__(JetStreamService)
    pending: list[asyncio.Future[None]] = []

    def apply_held(_group: str) -> asyncio.Future[None]:
        pending.append(asyncio.get_running_loop().create_future())
        return pending[-1]

    svc.mr = SimpleNamespace(apply_held=apply_held)  # type: ignore[assignment]
    sm = SimpleNamespace(group="g", name="S", lock=threading.Lock(), store=MemStore("g"),
                         stream=SimpleNamespace(cfg={"allow_direct": True}, consumers={}))
    svc.streams = {"S": sm}  # type: ignore[dict-item]
    return svc, pending


async def test_a_direct_get_on_a_failed_driver_is_answered_within_the_bound(monkeypatch) -> None:
    """DIRECT.GET on a follower waits for what it holds (`apply_held_in`), but not for good:
    a group whose driver failed is read as it stands after HELD_WAIT_S (the wait had no
    bound: the request hung, and the client got no reply at all)."""
    monkeypatch.setattr(service, "HELD_WAIT_S", 0.2, raising=False)
    svc, pending = _held_forever_service()
    call = api.route("$JS.API.DIRECT.GET.S")
    assert call is not None
    frames = await asyncio.wait_for(svc._h_direct_get(call, "", "r", b'{"seq": 1}'), 5)
    assert pending and not pending[0].done()  # it did wait for the held entries
    assert frames and frames[0][0].startswith(b"NATS/1.0 404"), frames


async def test_counting_what_is_held_here_is_bounded_too(monkeypatch) -> None:
    """`apply_held_here` (max_ha_assets' count) shares the bound."""
    monkeypatch.setattr(service, "HELD_WAIT_S", 0.2, raising=False)
    svc, pending = _held_forever_service()
    await asyncio.wait_for(svc.apply_held_here(), 5)
    assert len(pending) == 1


async def test_a_held_wait_that_fails_after_the_bound_logs_nothing(monkeypatch) -> None:
    """The read went on after HELD_WAIT_S; the group is removed later and its future fails
    with ProposalDropped. Nobody awaits it any more: without a retriever asyncio logs
    'Future exception was never retrieved' when it is collected."""
    monkeypatch.setattr(service, "HELD_WAIT_S", 0.05, raising=False)
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    monkeypatch.setattr(loop, "call_exception_handler", reported.append)
    svc, pending = _held_forever_service()
    await asyncio.wait_for(svc.apply_held_here(), 5)
    pending[0].set_exception(ProposalDropped("group removed"))
    await asyncio.sleep(0)  # the done callbacks
    pending.clear()
    gc.collect()
    assert reported == []
