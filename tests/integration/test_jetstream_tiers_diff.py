"""JWT tiered JetStream limits (`tiered_limits` R1/R3), against nats-server 2.15.

Account T's JWT has no flat JetStream limits, only tiers: R1 (small) and R3. A stream's
replicas pick its tier: the limits, stream count, reservations and stored bytes of one tier
never count against another. Account U has only an R3 tier, so an R1 stream has no
applicable limits (10120). The same nats-py script runs against both servers with the same
operator config; every reply's whole JSON is compared (times masked), `$JS.API.INFO` with
its `tiers` included."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import nats

from tests import jwt_issuer as ji
from tests.integration.conftest import ServerProc, Servers
from tests.integration.jsdiff import assert_same_steps
from tests.integration.test_jetstream_accounts_diff import ALLOWED, _req, _stream

_BASE = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
         "wildcards": True, "conn": -1, "leaf": -1}
# as `nsc edit account --js-tier 1 ...` writes them (fields left at 0 are omitted)
_R1 = {"mem_storage": 1000, "disk_storage": 100_000, "streams": 2, "consumer": 1,
       "max_ack_pending": 50, "disk_max_stream_bytes": 60_000}
_R3 = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
       "max_bytes_required": True}


def _config(tmp: Path) -> tuple[str, Path, Path]:
    op, sys_, tiered, r3only = (ji.operator_key(), ji.account_key(), ji.account_key(),
                                ji.account_key())
    preload = {
        sys_.public: ji.account_jwt(sys_, op, name="SYS"),
        tiered.public: ji.account_jwt(tiered, op, name="T", limits={
            **_BASE, "tiered_limits": {"R1": _R1, "R3": _R3}}),
        r3only.public: ji.account_jwt(r3only, op, name="U", limits={
            **_BASE, "tiered_limits": {"R3": _R3, "R5": {"disk_storage": 1000}}}),
    }
    config, creds = ji.preload_config(tmp, op, sys_, preload, [(tiered, "t"), (r3only, "u")])
    return config, creds[0], creds[1]


async def _script(srv: ServerProc, t_creds: Path, u_creds: Path) -> list[Any]:
    t = await nats.connect(srv.url, user_credentials=str(t_creds))
    u = await nats.connect(srv.url, user_credentials=str(u_creds))
    steps: list[Any] = []

    async def req(nc: Any, subject: str, body: Any = b"") -> None:
        steps.append(await _req(nc, subject, body))

    try:
        await req(t, "$JS.API.INFO")
        await req(t, "$JS.API.STREAM.CREATE.M", _stream("M", ["m.>"], storage="memory"))
        await req(t, "$JS.API.STREAM.CREATE.F", _stream("F", ["f.>"], max_bytes=50_000))
        await req(t, "$JS.API.STREAM.CREATE.X", _stream("X", ["x.>"]))  # R1: 2 streams
        await req(t, "$JS.API.STREAM.CREATE.B", _stream("B", ["b.>"], max_bytes=70_000))
        await req(t, "$JS.API.STREAM.UPDATE.F", _stream("F", ["f.>"], max_bytes=200_000))
        for name in ("c1", "c2"):  # R1: 1 consumer per stream
            await req(t, f"$JS.API.CONSUMER.CREATE.M.{name}",
                      {"stream_name": "M", "config": {"durable_name": name}})
        await req(t, "m.x", b"x" * 600)
        await req(t, "m.x", b"x" * 600)  # past R1's mem_storage
        await req(t, "$JS.API.INFO")
        await req(t, "$JS.API.STREAM.DELETE.F")
        await req(t, "$JS.API.STREAM.CREATE.G", _stream("G", ["g.>"], max_consumers=5))
        await req(t, "$JS.API.INFO")
        await req(u, "$JS.API.INFO")
        await req(u, "$JS.API.STREAM.CREATE.S", _stream("S", ["s.>"]))  # no R1 tier
        await req(u, "$JS.API.STREAM.CREATE.S", _stream("S", ["s.>"], num_replicas=3,
                                                        max_bytes=1000))
        await req(u, "$JS.API.INFO")
        # /jsz: the tiered accounts' reservations
        with urllib.request.urlopen(f"{srv.http}/jsz?accounts=true", timeout=5) as resp:
            steps.append(json.loads(resp.read()))
    finally:
        await t.close()
        await u.close()
    return steps


async def test_tiered_limits_like_nats_server(servers: Servers, tmp_path: Path) -> None:
    config, t_creds, u_creds = _config(tmp_path)
    theirs = await _script(servers.nats_server(config % (tmp_path / "theirs")), t_creds,
                           u_creds)
    ours = await _script(servers.jetraft(config % (tmp_path / "ours")), t_creds, u_creds)
    assert_same_steps(ours, theirs, ALLOWED)
    # not vacuous: the tiers were shown and each limit was met
    assert ours[0]["tiers"]["R1"]["limits"]["max_streams"] == 2
    assert [ours[i]["error"]["err_code"] for i in (3, 4, 5, 7, 12, 15)] == \
        [10027, 10027, 10122, 10026, 10026, 10120]
    assert ours[9]["error"]["err_code"] == 10002 and ours[10]["tiers"]["R1"]["streams"] == 2
