"""`external` mirrors and sources (an origin behind another JetStream API prefix), next to
nats-server 2.15.1 on ONE server: the same nats-py script against both.

Probed (docs/notes/clsrc.md): nats-server copies nothing for an external origin reached
through the server's own domain prefix (`jetstream { domain: hub }` and
`external.api: "$JS.hub.API"`) nor through an account mapping of that prefix; the blocks show
`external` (a source's `deliver` as "" when not given), `lag` 0 and `active` -1; an api
prefix overlapping `$JS.API` is refused (10021). Jetraft does the same (its sourcing
requests skip account mappings, as nats-server's do). Origins in another account, reached
through imports: test_jetstream_external_sources.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
import pytest

from tests.integration.conftest import ServerProc, Servers

DIFFER = {"created", "ts", "leader", "metadata"}


def _strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: "*" if k in DIFFER else _strip(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


async def _api(nc: Any, subject: str, body: Any = b"") -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return json.loads((await nc.request("$JS.API." + subject, data, timeout=10)).data)


async def _script(server: ServerProc) -> list[Any]:
    nc = await nats.connect(server.url)
    out: list[Any] = []
    try:
        out.append(await _api(nc, "STREAM.CREATE.O", {"name": "O", "subjects": ["o.>"]}))
        for i in range(3):
            await nc.request(f"o.{i}", b"x", timeout=5)
        ext = {"api": "$JS.hub.API", "deliver": "dlv"}
        out.append(await _api(nc, "STREAM.CREATE.M", {"name": "M", "mirror": {
            "name": "O", "external": ext}}))
        out.append(await _api(nc, "STREAM.CREATE.S", {"name": "S", "sources": [
            {"name": "O", "external": {"api": "$JS.hub.API"}}]}))
        out.append(await _api(nc, "STREAM.CREATE.X", {"name": "X", "mirror": {
            "name": "O", "external": {"api": "$JS.API"}}}))
        await asyncio.sleep(3)
        for name in ("M", "S"):
            out.append(await _api(nc, f"STREAM.INFO.{name}"))
        return out
    finally:
        await nc.close()


@pytest.mark.parametrize("domain", ["", "hub"])
async def test_external_origins_on_one_server_as_nats_server(servers: Servers, tmp_path: Path,
                                                             domain: str) -> None:
    """With `domain: hub` the server answers `$JS.hub.API` itself (docs/notes/domain.md):
    nats-server still copies nothing through it onto the same server."""
    conf = 'jetstream { store_dir: "%s"' + (f", domain: {domain}" if domain else "") + " }"
    theirs = servers.nats_server(config=conf % (tmp_path / "theirs"))
    ours = servers.jetraft(config=conf % (tmp_path / "ours"))
    their_out = await _script(theirs)
    our_out = await _script(ours)
    assert their_out[3]["error"]["err_code"] == 10021
    assert their_out[-1]["state"]["messages"] == their_out[-2]["state"]["messages"] == 0
    diffs = [f"step {i}:\n ours:   {_strip(a)}\n theirs: {_strip(b)}"
             for i, (a, b) in enumerate(zip(our_out, their_out, strict=True))
             if _strip(a) != _strip(b)]
    assert not diffs, "\n".join(diffs)
