"""`sync_interval` is accepted as nats-server accepts it, and /varz and /jsz say what Jetraft
does whatever its value: `sync_always: true` (an acknowledgement only after fsync, the
durability tests show it). Compared with nats-server 2.15's /varz `jetstream.config` and
/jsz `config` for `always`, `5s` and the default (issue 8, `config-sync-interval`)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

CONF = 'jetstream { store_dir: "%s"%s }\n'
MACHINE = {"max_memory", "max_storage", "store_dir"}  # this machine's, and each store's path


def _config(srv: Any, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{srv.http}{path}", timeout=5) as resp:
        body = json.load(resp)
    cfg = body["jetstream"]["config"] if path == "/varz" else body["config"]
    return {k: v for k, v in cfg.items() if k not in MACHINE}


@pytest.mark.parametrize(("extra", "interval_ns"), [
    (", sync_interval: always", 120_000_000_000), (", sync_interval: 5s", 5_000_000_000),
    ("", 120_000_000_000)])
def test_sync_config_as_nats_server_and_always_synced(servers: Any, tmp_path: Path, extra: str,
                                                      interval_ns: int) -> None:
    theirs = servers.nats_server(CONF % (tmp_path / "theirs", extra))
    ours = servers.jetraft(CONF % (tmp_path / "ours", extra))
    for path in ("/varz", "/jsz"):
        want, got = _config(theirs, path), _config(ours, path)
        assert got == {**want, "sync_always": True}, path
        assert want["sync_interval"] == interval_ns
        assert want.get("sync_always", False) is ("always" in extra)
