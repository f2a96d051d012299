"""Fixtures for the JetStream tests: a nats-server with JetStream on, the oracle."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_nats_server


@pytest.fixture(scope="module")
def js_oracle_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A standalone `nats-server -js` on loopback with its own store dir."""
    store: Path = tmp_path_factory.mktemp("js-oracle")
    yield from run_nats_server("-js", "-sd", str(store))
