"""Power loss under acked publishing with encryption at rest (`jetstream { key, cipher }`):
the same cycles as tests/durability/test_power_loss.py, on the power-loss disk, with a store
whose WAL, LMDB values and snapshot files are sealed. Besides "nothing acknowledged is lost",
this checks the key file's durability: it is created on a fresh store and rewritten (nonce
epoch) at every start, and after each cut the node must open the store with the key again
(a lost or torn key file would stop it: `_start` raises)."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from node.jetstream import crypt
from tests.durability import test_power_loss as power
from tests.durability.disk import PowerDisk
from tests.integration.conftest import ServerProc, Servers

KEY = "power-loss-at-rest-key-4b8e1d07c2a95f36"


def _start_encrypted(servers: Servers, disk: PowerDisk) -> ServerProc:
    store = json.dumps(str(disk.path / "store"))
    return servers.jetraft(config=f"jetstream {{ store_dir: {store}, key: {json.dumps(KEY)}, "
                                  "cipher: chacha }\n")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("model", ["strict", "torn"])
async def test_power_cuts_with_encryption_lose_nothing_acknowledged(
        power_disk: Callable[..., PowerDisk], servers: Servers, model: str,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JETRAFT_JS_SNAPSHOT_EVERY", "200")
    monkeypatch.setattr(power, "_start", _start_encrypted)
    seed = int(os.environ.get("JETRAFT_POWER_SEED", str(random.randrange(1 << 30))))
    disk = power_disk(torn=0.5 if model == "torn" else None, seed=seed)
    cuts = int(os.environ.get("JETRAFT_POWER_CUTS", "3"))
    figures = await power.power_cut_run(servers, disk, cuts, seed)
    assert figures["acked"] > 0, f"seed {seed}: nothing was acknowledged"
    assert figures["dropped_pages"] > 0, figures
    assert (disk.path / "store" / crypt.KEY_FILE).exists()
    print(f"encrypted power cuts ({model}, seed {seed}): {figures}")
