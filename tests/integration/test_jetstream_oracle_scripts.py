"""The pure tests' nats-server scripts (tests/jetstream/test_*_differential.py), replayed over
TCP against `jetraft serve -js` and against `nats-server -js`: the same requests, the whole
results compared. The pure tests compare nats-server with the pure functions; these compare it
with the node, wiring included.

ALLOWED_TO_DIFFER: times and names the servers make up.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.integration.conftest import ServerProc, Servers
from tests.jetstream import (
    test_config_differential,
    test_consumer_config_differential,
    test_consumer_differential,
    test_consumer_start_differential,
    test_get_differential,
    test_info_differential,
    test_pull_differential,
    test_requests_differential,
    test_stream_differential,
)

ALLOWED_TO_DIFFER = {"created", "ts", "first_ts", "last_ts", "last_active", "time", "leader",
                     "Nats-Time-Stamp"}


def _strip(obj: Any) -> Any:
    if isinstance(obj, bytes):
        try:
            return _strip(json.loads(obj))
        except ValueError:
            return obj
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in ALLOWED_TO_DIFFER}
    if isinstance(obj, list | tuple):
        return [_strip(v) for v in obj]
    return obj


Script = Callable[[int], Awaitable[Any]]


async def _each(strip: Callable[[Any], Any], replies: Awaitable[list[Any]]) -> list[Any]:
    """A script's replies through its own test's strip rules (generated names, ...)."""
    return [strip(r) for r in await replies]
SCRIPTS: dict[str, Script] = {
    "stream_config": lambda port: _each(test_config_differential._strip,
                                        test_config_differential._oracle_replies(port)),
    "consumer_config": lambda port: _each(test_consumer_config_differential._strip,
                                          test_consumer_config_differential._oracle(port)),
    "get": test_get_differential._oracle,
    "info": test_info_differential._oracle,
    "pull": test_pull_differential._oracle,
    "requests": test_requests_differential._oracle,
}
for _name, (_scfg, _ccfg, _steps) in test_consumer_differential.SCRIPTS.items():
    SCRIPTS[f"consumer_{_name}"] = (
        lambda port, n=_name, s=_scfg, c=_ccfg, st=_steps:
        test_consumer_differential._oracle(port, "C_" + n.upper(), s, c, st))
for _policy, _ccfg in test_consumer_start_differential.POLICIES.items():
    SCRIPTS[f"start_{_policy}"] = (
        lambda port, p=_policy, c=_ccfg:
        test_consumer_start_differential._oracle(port, "ST_" + p.upper(), c))
for _name, (_cfg, _steps) in test_stream_differential.SCRIPTS.items():
    SCRIPTS[f"stream_{_name}"] = (
        lambda port, n=_name, c=_cfg, st=_steps:
        test_stream_differential._run_oracle(port, "S_" + n.upper(), c, st))


@pytest.fixture(scope="module")
def both(module_servers: Servers, tmp_path_factory: pytest.TempPathFactory
         ) -> dict[str, ServerProc]:
    store = tmp_path_factory.mktemp("js")
    return {"jetraft": module_servers.jetraft(args=["-js", "-sd", str(store / "ours")]),
            "nats-server": module_servers.nats_server(args=["-js", "-sd",
                                                            str(store / "theirs")])}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
async def test_pure_scripts_give_the_same_results_over_tcp(both: dict[str, ServerProc],
                                                           script: str) -> None:
    ours = await SCRIPTS[script](both["jetraft"].port)
    # nats-server applies acks on another goroutine: under load a delivery right after an
    # ack can still count it pending. Its settled answer is the one compared (three runs).
    for _ in range(3):
        theirs = await SCRIPTS[script](both["nats-server"].port)
        if _strip(ours) == _strip(theirs):
            break
    assert _strip(ours) == _strip(theirs)
