"""node/mapping.py against a running nats-server: the same mappings block,
the same published subjects, the same landing subjects.

A subscriber on ">" sees where nats-server delivers each message; our
`MappingTable` must compute exactly that subject (partition hashing included).
Weighted mappings are compared statistically.
"""

from __future__ import annotations

import asyncio
import random
import string

import nats
import pytest

from node.accountconf import mapping_table_from_config
from node.config import parse_config

# (source, destination, published subjects). Each source starts with its own
# token so that no two mappings overlap (nats-server's pick between
# overlapping mappings follows Go map order, which is random).
CASES: list[tuple[str, str, list[str]]] = [
    ("plain", "plain.out", ["plain", "plain.x"]),
    ("wc.*.*", "wc.{{wildcard(2)}}.{{wildcard(1)}}", ["wc.a.b", "wc.one.two", "wc.a"]),
    ("dollar.*.*", "dollar.$2.$1.$1", ["dollar.a.b"]),
    ("fwc.>", "out.fwc.>", ["fwc.a", "fwc.a.b.c"]),
    ("mix.*.>", "mix.x.{{wildcard(1)}}.>", ["mix.a.b", "mix.a.b.c.d"]),
    ("part.*", "part.{{wildcard(1)}}.{{partition(3,1)}}",
     [f"part.customerid{i}" for i in range(1, 12)]),
    ("part2.*.*", "part2.{{partition(10,1,2)}}.{{wildcard(1)}}",
     ["part2.1.a", "part2.1.b", "part2.2.b", "part2.2.a", "part2.üñí.çø"]),
    ("part3.*.>", "part3.{{partition(7)}}.>", ["part3.a.b", "part3.a.c", "part3.zz.y.x"]),
    ("part4", "part4.{{partition(5)}}", ["part4"]),
    ("split.*", "split.{{split(1,-)}}", ["split.-abc-def--ghij-", "split.abc", "split.a-b"]),
    ("split2.*", "split2.{{split(1,--)}}", ["split2.foo--bar", "split2.a---b"]),
    ("sfl.*", "sfl.{{splitfromleft(1,4)}}", ["sfl.1234567", "sfl.1234", "sfl.12"]),
    ("sfr.*", "sfr.{{SplitFromRight(1,4)}}", ["sfr.1234567", "sfr.12"]),
    ("slfl.*", "slfl.{{slicefromleft(1,2)}}", ["slfl.1234567", "slfl.123456", "slfl.1"]),
    ("slfr.*", "slfr.{{SliceFromRight(1,3)}}", ["slfr.1234567890", "slfr.123456", "slfr.12"]),
    ("lr.*", "lr.{{left(1,2)}}.{{right(1,3)}}", ["lr.abcdef", "lr.a", "lr.abc"]),
    ("zero.*", "zero.{{wildcard(0)}}", ["zero.aa"]),
    ("spaced.*", "spaced.{{ wildcard ( 1 ) }}", ["spaced.q"]),
    ("drop.*.*", "drop.{{wildcard(2)}}", ["drop.a.b"]),
    ("lit.*", "lit.{{wildcard(1)}", ["lit.a"]),
]


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _config(cases: list[tuple[str, str, list[str]]], extra: str = "") -> str:
    body = "\n".join(f"  {_quote(src)}: {_quote(dest)}" for src, dest, _ in cases)
    return f"mappings {{\n{body}\n{extra}\n}}\n"


async def _landings(url: str, subjects: list[str]) -> list[list[str]]:
    """For each published subject, the subjects a '>' subscriber saw."""
    nc = await nats.connect(url)
    got: list[str] = []

    async def cb(msg: nats.aio.msg.Msg) -> None:
        got.append(msg.subject)

    await nc.subscribe(">", cb=cb)
    out: list[list[str]] = []
    for subject in subjects:
        got.clear()
        await nc.publish(subject, b"x")
        await nc.publish("zz.marker", b"")  # delivered after the mapped one, in order
        await nc.flush()
        for _ in range(200):
            if "zz.marker" in got:
                break
            await asyncio.sleep(0.005)
        out.append([s for s in got if s != "zz.marker"])
    await nc.close()
    return out


def _ours(config: str, subjects: list[str], rng: random.Random | None = None) -> list[list[str]]:
    table = mapping_table_from_config(parse_config(config))
    out = []
    for s in subjects:
        mapped = table.apply(s, rng)
        landed = s if mapped is None else mapped
        # A mapped subject with an empty token reaches no subscriber.
        out.append([] if "" in landed.split(".") else [landed])
    return out


@pytest.mark.timeout(120)
async def test_mappings_land_where_nats_server_puts_them(servers) -> None:
    config = _config(CASES)
    subjects = [s for _, _, subs in CASES for s in subs]
    theirs = await _landings(servers.nats_server(config).url, subjects)
    assert theirs == _ours(config, subjects)


@pytest.mark.timeout(120)
async def test_partition_hash_matches_on_random_subjects(servers) -> None:
    rnd = random.Random(7)
    alphabet = string.ascii_letters + string.digits + "-_é"
    subjects = []
    for _ in range(300):
        a = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 12)))
        b = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 12)))
        subjects.append(f"h.{a}.{b}")
    cases = [("h.*.*", "h.{{partition(13,2,1)}}.{{partition(1000)}}.{{partition(7,1)}}", [])]
    config = _config(cases)
    theirs = await _landings(servers.nats_server(config).url, subjects)
    ours = _ours(config, subjects)
    assert theirs == ours
    assert len({s[0].split(".")[1] for s in ours}) == 13  # every partition used


@pytest.mark.timeout(120)
async def test_weighted_and_cluster_scoped_mappings_agree_statistically(servers) -> None:
    extra = """
  w: [{destination: w.a, weight: 60%}, {destination: w.b, weight: 25%}]
  c: [{destination: c.west, weight: 100%, cluster: west}, {destination: c.any, weight: 50%}]
"""
    config = _config([], extra) + "cluster { name: east, listen: 127.0.0.1:-1 }\n"
    n = 2000
    subjects = ["w"] * n + ["c"] * n
    theirs = await _landings(servers.nats_server(config).url, subjects)
    table = mapping_table_from_config(parse_config(config))
    rng = random.Random(11)
    ours = [[table.apply(s, rng, cluster="east") or s] for s in subjects]
    for result in (theirs, ours):
        counts: dict[str, int] = {}
        for landed in result:
            assert len(landed) == 1
            counts[landed[0]] = counts.get(landed[0], 0) + 1
        # Expected 1200/500/300 and 1000/1000: 5 sigma is about 110 and 112.
        assert abs(counts.get("w.a", 0) - 1200) < 110, counts
        assert abs(counts.get("w.b", 0) - 500) < 100, counts
        assert abs(counts.get("w", 0) - 300) < 85, counts
        assert abs(counts.get("c.any", 0) - 1000) < 112, counts
        assert "c.west" not in counts


async def test_account_mappings_apply_in_their_account_only(servers) -> None:
    from node.accountconf import GLOBAL_ACCOUNT, parse_accounts_config

    config = """
mappings { "g.*": "g.global.$1" }
accounts {
  A: { users: [{user: a, password: a}], mappings: { "g.*": "g.in_a.$1", "x": "x.a" } }
  B: { users: [{user: b, password: b}] }
}
authorization { users: [{user: g, password: g}] }
"""
    srv = servers.nats_server(config)
    conf = parse_accounts_config(parse_config(config))
    subjects = ["g.1", "x", "y"]
    for user, account in (("a", "A"), ("b", "B"), ("g", GLOBAL_ACCOUNT)):
        theirs = await _landings(f"nats://{user}:{user}@127.0.0.1:{srv.port}", subjects)
        table = conf.mappings_for(account)
        ours = [[table.apply(s) or s] for s in subjects]
        assert theirs == ours, account


MAPPED_PERMS = """
accounts {
  A: { users: [{user: a, password: a},
               {user: p, password: p, permissions: {publish: {deny: "old.>"}}},
               {user: q, password: q, permissions: {publish: {allow: "old.>"}}},
               {user: r, password: r, permissions: {publish: {deny: "ev.>"}}}],
       mappings: { "old.y": "ev.mapped" } }
}
"""


def test_publish_permissions_apply_to_the_mapped_subject(servers, raw) -> None:
    """nats-server maps first and checks the publisher's permissions on the result:
    a user allowed only old.> may not reach ev.mapped through a mapping, one denied
    old.> may, one denied ev.> may not; the -ERR names the mapped subject."""
    seen = {}
    for impl in ("nats-server", "jetraft"):
        proc = servers.nats_server(MAPPED_PERMS) if impl == "nats-server" \
            else servers.jetraft(MAPPED_PERMS)
        conns = {}
        for user in "apqr":
            conns[user] = raw(proc.port)
            conns[user].send(b'CONNECT {"verbose":false,"user":"%s","pass":"%s"}\r\nPING\r\n'
                             % (user.encode(), user.encode()))
            assert conns[user].read_until(b"PONG\r\n").endswith(b"PONG\r\n")
        assert conns["a"].exchange(b"SUB ev.mapped 1\r\nSUB old.y 2\r\nSUB old.z 3\r\n") == b""
        out = {}
        for user in "pqr":
            conns[user].send(b"PUB old.y 2\r\n%s1\r\nPUB old.z 2\r\n%s2\r\nPING\r\n"
                             % (user.encode(), user.encode()))
            out[user] = conns[user].read_until(b"PONG\r\n")
        out["a"] = conns["a"].read_close_or_wait(1.0).replace(b"PING\r\n", b"")
        seen[impl] = out
        proc.stop()
    assert seen["jetraft"] == seen["nats-server"]
    assert b'Publish to "ev.mapped"' in seen["nats-server"]["q"]
    assert b"MSG ev.mapped 1 2\r\np1\r\n" in seen["nats-server"]["a"]
