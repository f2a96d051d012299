"""`jetstream { strict: false }` against nats-server 2.15: unknown request fields are logged
and ignored, while type and syntax errors still refuse; with the default (strict) the same
requests are refused. The same nats-py script on both, replies compared (issue 8, the
`jetstream {}` block), and the /jsz config says which mode runs."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import nats

CONF = 'jetstream { store_dir: "%s"%s }\n'
_VOLATILE = {"created", "ts"}


async def _script(url: str) -> list[Any]:
    nc = await nats.connect(url)

    async def api(op: str, body: Any) -> Any:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        reply = json.loads((await nc.request(f"$JS.API.{op}", data, timeout=5)).data)
        return reply.get("error") or sorted(k for k in reply if k not in _VOLATILE)

    try:
        return [
            await api("STREAM.CREATE.A", {"name": "A", "subjects": ["a"], "bogus": 1}),
            await api("STREAM.CREATE.A", {"name": "A", "subjects": ["a"]}),
            await api("STREAM.CREATE.B", {"name": "B", "subjects": ["b"], "max_msgs": "x"}),
            await api("CONSUMER.CREATE.A.c", {"stream_name": "A",
                                              "config": {"durable_name": "c", "zzz": 2}}),
            await api("STREAM.INFO.A", {"nope": True}),
            await api("STREAM.CREATE.C", b'{"name":"C", bad'),
            await api("STREAM.CREATE.C", b'{"name":"C"'),
        ]
    finally:
        await nc.close()


def _jsz_strict(http: str) -> bool:
    with urllib.request.urlopen(f"{http}/jsz", timeout=5) as resp:
        return json.load(resp)["config"]["strict"]


def test_strict_false_and_default_as_nats_server(servers: Any, tmp_path: Path) -> None:
    for extra, strict in (("", True), (", strict: false", False)):
        theirs = servers.nats_server(CONF % (tmp_path / f"theirs{strict}", extra))
        ours = servers.jetraft(CONF % (tmp_path / f"ours{strict}", extra))
        want = asyncio.run(_script(theirs.url))
        got = asyncio.run(_script(ours.url))
        assert got == want
        unknown = [r for r in want[:1] + want[3:5] if isinstance(r, dict)]
        assert len(unknown) == (3 if strict else 0)  # unknown fields refused only when strict
        assert want[2]["err_code"] == want[5]["err_code"] == 10025
        assert _jsz_strict(ours.http) is strict
        if not strict:
            assert 'json: unknown field "bogus"' in ours.log_text()
