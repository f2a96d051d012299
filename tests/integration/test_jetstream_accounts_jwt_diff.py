"""JetStream limits from account JWTs (operator mode), against nats-server 2.15.

An account JWT's `mem_storage`, `disk_storage`, `streams` and `consumer` limits are the
account's JetStream limits; an account JWT without storage has no JetStream (10039). The same
nats-py script runs against both servers with the same operator config; every reply's whole
JSON is compared (times masked)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nats

from tests import jwt_issuer as ji
from tests.integration.conftest import ServerProc, Servers
from tests.integration.jsdiff import assert_same_steps
from tests.integration.test_jetstream_accounts_diff import ALLOWED, _req, _stream

_BASE = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
         "wildcards": True, "conn": -1, "leaf": -1}


def _config(tmp: Path) -> tuple[str, Path, Path]:
    op, sys_, js_acc, plain = ji.operator_key(), ji.account_key(), ji.account_key(), \
        ji.account_key()
    preload = {
        sys_.public: ji.account_jwt(sys_, op, name="SYS"),
        js_acc.public: ji.account_jwt(js_acc, op, name="J", limits={
            **_BASE, "mem_storage": 1000, "disk_storage": 1_000_000, "streams": 2,
            "consumer": 1}),
        plain.public: ji.account_jwt(plain, op, name="N"),
    }
    config, creds = ji.preload_config(tmp, op, sys_, preload, [(js_acc, "j"), (plain, "n")])
    return config, creds[0], creds[1]


async def _script(srv: ServerProc, j_creds: Path, n_creds: Path) -> list[Any]:
    j = await nats.connect(srv.url, user_credentials=str(j_creds))
    n = await nats.connect(srv.url, user_credentials=str(n_creds))
    steps: list[Any] = []
    try:
        steps.append(await _req(j, "$JS.API.INFO"))
        steps.append(await _req(j, "$JS.API.STREAM.CREATE.M",
                                _stream("M", ["m.>"], storage="memory")))
        steps.append(await _req(j, "$JS.API.STREAM.CREATE.F", _stream("F", ["f.>"])))
        steps.append(await _req(j, "$JS.API.STREAM.CREATE.X", _stream("X", ["x.>"])))
        for name in ("c1", "c2"):
            steps.append(await _req(j, f"$JS.API.CONSUMER.CREATE.M.{name}",
                                    {"stream_name": "M", "config": {"durable_name": name}}))
        steps.append(await _req(j, "m.x", b"x" * 600))
        steps.append(await _req(j, "m.x", b"x" * 600))
        steps.append(await _req(j, "$JS.API.STREAM.DELETE.F"))
        steps.append(await _req(j, "$JS.API.STREAM.CREATE.R",
                                _stream("R", ["r.>"], max_bytes=2_000_000)))
        steps.append(await _req(j, "$JS.API.INFO"))
        steps.append(await _req(n, "$JS.API.INFO"))
        steps.append(await _req(n, "$JS.API.STREAM.CREATE.S", _stream("S", ["s.>"])))
    finally:
        await j.close()
        await n.close()
    return steps


async def test_jwt_account_limits_like_nats_server(servers: Servers, tmp_path: Path) -> None:
    config, j_creds, n_creds = _config(tmp_path)
    theirs = await _script(servers.nats_server(config % (tmp_path / "theirs")), j_creds,
                           n_creds)
    ours = await _script(servers.jetraft(config % (tmp_path / "ours")), j_creds, n_creds)
    assert_same_steps(ours, theirs, ALLOWED)
    # not vacuous: the limits and the disabled account were met
    assert ours[0]["limits"]["max_streams"] == 2 and ours[3]["error"]["err_code"] == 10027
    assert ours[5]["error"]["err_code"] == 10026 and ours[7]["error"]["err_code"] == 10002
    assert ours[-1]["error"]["err_code"] == 10039
