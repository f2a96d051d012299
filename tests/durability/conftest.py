"""Fixtures for the durability tests: real `jetraft serve -js` processes (the `servers`
factory of tests/integration) whose store lives on a power-loss disk (`powerfs`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.durability.disk import PowerDisk, fuse_available
from tests.integration.conftest import Servers


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    s = Servers(tmp_path)
    yield s
    s.stop_all()


@pytest.fixture
def power_disk(tmp_path: Path) -> Iterator[Callable[..., PowerDisk]]:
    """`power_disk(torn=None, seed=0)` -> a mounted PowerDisk, unmounted at the end."""
    why = fuse_available()
    if why is not None:
        pytest.skip(f"no FUSE here: {why}")
    made: list[PowerDisk] = []

    def make(torn: float | None = None, seed: int = 0) -> PowerDisk:
        disk = PowerDisk(tmp_path / f"disk{len(made)}", torn=torn, seed=seed)
        made.append(disk)
        disk.mount()
        return disk

    try:
        yield make
    finally:
        for disk in made:
            disk.close()
