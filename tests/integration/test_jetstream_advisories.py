"""Advisories over TCP: the pure test's scenario (tests/jetstream/test_advisories_differential.py)
against `jetraft serve -js` and `nats-server -js`: the same advisories, in the same order."""

from __future__ import annotations

from pathlib import Path

from tests.integration.conftest import Servers
from tests.jetstream import test_advisories_differential as scenario


async def test_advisories_match_nats_server(servers: Servers, tmp_path: Path) -> None:
    ours = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    their = await scenario._oracle(theirs.port)
    mine = await scenario._oracle(ours.port)
    assert mine == their
