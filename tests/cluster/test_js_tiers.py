"""JWT tiered JetStream limits on three nodes (operator mode).

Account T's JWT has only tiers: R1 (2 streams, 3000 bytes of file storage) and R3 (1
stream). A stream's replicas pick its tier, so the R1 and R3 stream counts are apart, and
the meta leader refuses whichever tier is full wherever the request came in. The R1 byte
limit holds across the cluster: two R1 streams led by two different nodes (placement tags)
share it, because every node reports the bytes of the streams it leads (usage.py) and the
leader of the stream published to counts the others' too.

Mutations (docs/notes/tiered.md): `check_stream` counting every tier's streams (not only
the stream's own) refuses the R3 create; `_over_account_limit` counting only the streams
hosted on the leader's node (the behaviour before) accepts B's publish past the R1 limit;
`UsageBook.bytes_of` ignoring reports leaves INFO's R1 storage short of A's bytes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import jwt_issuer as ji
from tests.cluster.jshelp import JsCluster, api, connect, until

_BASE = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
         "wildcards": True, "conn": -1, "leaf": -1}
_TIERS = {"R1": {"disk_storage": 3000, "mem_storage": -1, "streams": 2, "consumer": -1},
          "R3": {"disk_storage": -1, "mem_storage": -1, "streams": 1, "consumer": -1}}


@pytest.fixture
def tiered3(tmp_path: Path) -> Iterator[tuple[JsCluster, Path]]:
    op, sys_, acc = ji.operator_key(), ji.account_key(), ji.account_key()
    (tmp_path / "op.jwt").write_text(ji.operator_jwt(op, system_account=sys_.public))
    user = ji.user_key()
    creds = tmp_path / "t.creds"
    creds.write_text(ji.creds(ji.user_jwt(user, acc), user))
    preload = (f"  {sys_.public}: {ji.account_jwt(sys_, op, name='SYS')}\n"
               f"  {acc.public}: "
               f"{ji.account_jwt(acc, op, name='T', limits={**_BASE, 'tiered_limits': _TIERS})}")
    c = JsCluster(tmp_path / "c", 3, tags=[["az:a"], ["az:b"], ["az:c"]])
    c.extra_config = (f"operator: {tmp_path / 'op.jwt'}\nsystem_account: {sys_.public}\n"
                      f"resolver: MEMORY\nresolver_preload: {{\n{preload}\n}}\n")
    try:
        c.start()
        c.wait_js()
        yield c, creds
    finally:
        c.stop()


def _r1(name: str, az: str) -> dict[str, object]:
    return {"name": name, "subjects": [f"{name.lower()}.>"], "num_replicas": 1,
            "placement": {"tags": [f"az:{az}"]}}


async def test_tiers_count_apart_and_bytes_across_nodes(tiered3: tuple[JsCluster, Path]
                                                        ) -> None:
    c, creds = tiered3
    n0, n1, _n2 = c.nodes
    t0 = await connect(n0, user_credentials=str(creds))
    t1 = await connect(n1, user_credentials=str(creds))
    try:
        assert "error" not in (made := await api(t0, "STREAM.CREATE.A", _r1("A", "a"))), made
        assert "error" not in (made := await api(t1, "STREAM.CREATE.B", _r1("B", "b"))), made
        # R1 is full (2 streams); R3 is another tier with its own count of 1
        assert (await api(t1, "STREAM.CREATE.C", _r1("C", "c")))["error"]["err_code"] == 10027
        made = await api(t0, "STREAM.CREATE.D", {"name": "D", "subjects": ["d.>"],
                                                 "num_replicas": 3})
        assert "error" not in made, made
        over = await api(t1, "STREAM.CREATE.E", {"name": "E", "subjects": ["e.>"],
                                                 "num_replicas": 3})
        assert over["error"]["err_code"] == 10027
        # no R2 tier, no flat limits: 10120
        r2 = await api(t0, "STREAM.CREATE.F", {"name": "F", "subjects": ["f.>"],
                                               "num_replicas": 2})
        assert r2["error"] == {"code": 400, "err_code": 10120, "description":
                               "no JetStream default or applicable tiered limit present"}
        info = await api(t1, "INFO")
        assert info["tiers"]["R1"]["streams"] == 2 and info["tiers"]["R3"]["streams"] == 1
        assert info["tiers"]["R1"]["limits"]["max_storage"] == 3000
        # A (led by n0) takes about half of R1's 3000 bytes
        ack = await t0.request("a.x", b"x" * 1400, timeout=10)
        assert b'"seq":1' in ack.data, ack.data
        # once n1 (B's leader) has heard of it, B may not take the other half and more
        await until(lambda: _r1_storage(t1), timeout=15)
        ack = await t1.request("b.x", b"y" * 1400, timeout=10)
        assert b'"seq":1' in ack.data, ack.data  # ~2900 of 3000
        await until(lambda: _r1_storage(t1, 2800), timeout=15)
        ack = await t1.request("b.x", b"z" * 200, timeout=10)
        assert b'"err_code":10002' in ack.data, ack.data
        # R3's D is not limited by R1's bytes
        ack = await t1.request("d.x", b"w" * 2000, timeout=10)
        assert b'"seq":1' in ack.data, ack.data
    finally:
        await t0.close()
        await t1.close()


async def _r1_storage(nc: object, at_least: int = 1400) -> bool:
    info = await api(nc, "INFO")  # type: ignore[arg-type]
    return bool(info["tiers"]["R1"]["storage"] >= at_least)
