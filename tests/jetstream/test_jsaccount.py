"""The pure per-account pieces: registry keys, which accounts get JetStream, limit checks,
and the meta entries / catalogue with accounts (also as the audit replays them)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from audit.hook_jsmeta import Catalogue as AuditCatalogue
from node.accountconf import AccountConfig, AccountsConfig, JetStreamLimits
from node.jetstream import cluster_meta, jsaccount
from node.jetstream.errors import ApiError

_STREAM = st.text(st.characters(blacklist_characters="/\\. *>\t\r\n\x00",
                                blacklist_categories=("Cs",)), min_size=1, max_size=20)


@given(st.text(min_size=1, max_size=20), _STREAM)
def test_key_split_roundtrip(account: str, name: str) -> None:
    # an account name may hold '/', a stream name never does: split is exact
    assert jsaccount.split(jsaccount.key(account, name)) == (account, name)


def test_global_account_key_is_the_bare_name() -> None:
    # the layout written before accounts (catalogue, groups, LMDB) opens unchanged
    assert jsaccount.key("$G", "ORDERS") == "ORDERS"
    assert jsaccount.split("ORDERS") == ("$G", "ORDERS")
    assert jsaccount.key("A", "ORDERS") != jsaccount.key("B", "ORDERS")


def _conf(**accounts: JetStreamLimits) -> AccountsConfig:
    conf = AccountsConfig()
    for name, js in accounts.items():
        conf.accounts[name] = AccountConfig(name, jetstream=js)
    return conf


def test_which_accounts_have_jetstream() -> None:
    assert jsaccount.limits_for(_conf(), "$G", False) == jsaccount.UNLIMITED_TIERS
    assert jsaccount.limits_for(_conf(), "$G", True) is None  # operator mode: no $G
    conf = _conf(A=JetStreamLimits(enabled=True, max_streams=2), C=JetStreamLimits())
    assert jsaccount.limits_for(conf, "$G", False) is None  # accounts exist: $G has none
    assert jsaccount.limits_for(conf, "A", False).flat().max_streams == 2  # type: ignore[union-attr]
    assert jsaccount.limits_for(conf, "C", False) is None
    assert jsaccount.limits_for(conf, "nope", False) is None
    # the system account alone does not count as configured accounts
    assert jsaccount.limits_for(_conf(**{"$SYS": JetStreamLimits()}), "$G", False) is not None


def _err(fn: object, *args: object) -> int:
    with pytest.raises(ApiError) as info:
        fn(*args)  # type: ignore[operator]
    return info.value.err_code


def _flat(**kw: object) -> jsaccount.Tiers:
    return jsaccount.Tiers({jsaccount.FLAT: jsaccount.Limits(**kw)})  # type: ignore[arg-type]


def test_stream_checks() -> None:
    lim = _flat(max_memory=1000, max_storage=10_000, max_streams=2, max_consumers=3)
    file_s = {"name": "F", "storage": "file", "max_bytes": 6000}
    jsaccount.check_stream(lim, file_s, {}, creating=True)
    others = {"X": {"storage": "file", "max_bytes": 5000}}
    assert _err(jsaccount.check_stream, lim, file_s, others, True) == 10047
    assert _err(jsaccount.check_stream, lim, {"storage": "memory", "max_bytes": 1001}, {},
                True) == 10028
    assert _err(jsaccount.check_stream, lim, {"storage": "file"}, {"X": {}, "Y": {}},
                True) == 10027
    jsaccount.check_stream(lim, {"storage": "file"}, {"X": {}, "Y": {}}, False)  # update
    assert _err(jsaccount.check_stream, lim, {"storage": "file", "max_consumers": 4}, {},
                True) == 10026
    req = _flat(max_bytes_required=True, storage_max_stream_bytes=100)
    assert _err(jsaccount.check_stream, req, {"storage": "file"}, {}, True) == 10113
    assert _err(jsaccount.check_stream, req, {"max_bytes": 101}, {}, True) == 10122


def test_consumer_cap_and_publish_limit() -> None:
    lim = jsaccount.Limits(max_consumers=2, max_memory=100)
    assert jsaccount.consumer_cap(lim, -1) == 2
    assert jsaccount.consumer_cap(lim, 5) == 2
    assert jsaccount.consumer_cap(lim, 1) == 1
    assert jsaccount.consumer_cap(jsaccount.Limits(), 4) == 4
    assert not jsaccount.publish_exceeds(lim, True, 50, 50)
    assert jsaccount.publish_exceeds(lim, True, 50, 51)
    assert not jsaccount.publish_exceeds(lim, False, 10**12, 1)  # file: no limit
    # nats-server holds the tier's total to its per-stream maximum too
    assert jsaccount.publish_exceeds(jsaccount.Limits(storage_max_stream_bytes=10), False, 5, 6)


def test_tiers_pick_by_replicas_and_count_apart() -> None:
    r1 = jsaccount.Limits(max_memory=1000, max_storage=1000, max_streams=1)
    r3 = jsaccount.Limits(max_streams=2, max_bytes_required=True)
    tiers = jsaccount.Tiers({"R1": r1, "R3": r3})
    assert tiers.select(0) == ("R1", r1) and tiers.select(3) == ("R3", r3)
    assert _err(tiers.select, 5) == 10120  # no R5 tier, no flat limits
    one = {"S": {"storage": "file", "num_replicas": 1, "max_bytes": 600}}
    three = {"T": {"storage": "file", "num_replicas": 3, "max_bytes": 10}}
    # R1 holds one stream: another R1 is refused, an R3 is not (its tier is apart)
    assert _err(jsaccount.check_stream, tiers, {"storage": "file"}, one, True) == 10027
    jsaccount.check_stream(tiers, {"num_replicas": 3, "max_bytes": 5}, one, True)
    assert _err(jsaccount.check_stream, tiers, {"num_replicas": 3}, one, True) == 10113
    # reservations are per tier: R3's 10 bytes do not count against R1's 1000
    jsaccount.check_stream(tiers, {"storage": "file", "max_bytes": 1000}, three, True)
    assert tiers.tier_of({"num_replicas": 3}) == "R3" and not tiers.flat().max_streams
    assert _flat().tier_of({"num_replicas": 3}) == jsaccount.FLAT


def _entries() -> list[dict[str, object]]:
    return [cluster_meta.create("S", {"name": "S"}, 1, [7]),
            cluster_meta.create(jsaccount.key("A", "S"), {"name": "S"}, 2, [7]),
            cluster_meta.update(jsaccount.key("A", "S"), {"name": "S", "max_msgs": 1}, [7]),
            cluster_meta.delete("S")]


def test_meta_entries_carry_the_account() -> None:
    create_g, create_a, update_a, delete_g = _entries()
    assert "account" not in create_g and "account" not in delete_g  # the old format
    assert create_a["account"] == update_a["account"] == "A"
    assert create_a["group"] != create_g["group"]
    cat = cluster_meta.Catalogue()
    for index, entry in enumerate(_entries(), 1):
        cat.apply(entry, 7, index)
    assert list(cat.streams) == ["A/S"]  # $G's S deleted, A's S kept and updated
    assert cat.streams["A/S"]["config"]["max_msgs"] == 1
    # the audit's own fold agrees
    audit = AuditCatalogue()
    for index, entry in enumerate(_entries(), 1):
        audit.apply(index, json.dumps(entry).encode())
    assert list(audit.streams) == ["A/S"]
