"""HTTP monitoring endpoints, checked against nats-server's field names."""

from __future__ import annotations

import json
import urllib.request

import pytest

CORE_VARZ = {"server_id", "server_name", "version", "proto", "host", "port", "max_payload",
             "connections", "total_connections", "in_msgs", "out_msgs", "in_bytes",
             "out_bytes", "subscriptions", "uptime", "start", "now", "mem", "slow_consumers"}
CORE_CONNZ = {"server_id", "now", "num_connections", "total", "offset", "limit", "connections"}
CORE_SUBSZ = {"server_id", "num_subscriptions", "num_cache", "num_inserts", "num_removes",
              "num_matches"}
CONN_FIELDS = {"cid", "kind", "type", "ip", "port", "start", "last_activity", "uptime", "idle",
               "pending_bytes", "in_msgs", "out_msgs", "in_bytes", "out_bytes",
               "subscriptions", "name", "lang", "version", "subscriptions_list"}


def get(proc, path: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(proc.http + path, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, "", e.read().decode()


def get_json(proc, path: str) -> dict:
    status, _, body = get(proc, path)
    assert status == 200, body
    return json.loads(body)


@pytest.fixture(scope="module")
def pair(module_servers):
    return module_servers.both()


@pytest.fixture
def named_client(pair, raw):
    """One connection with a name and two subscriptions on each server."""
    for proc in pair.values():
        c = raw(proc.port)
        c.exchange(b'CONNECT {"verbose":false,"name":"mon","lang":"python","version":"9"}\r\n'
                   b"SUB mon.a 1\r\nSUB mon.b grp 2\r\nPUB mon.a 5\r\nhello\r\n")
    return pair


@pytest.mark.parametrize("path,core", [("/varz", CORE_VARZ), ("/connz", CORE_CONNZ),
                                       ("/subsz", CORE_SUBSZ)])
def test_keys_are_a_subset_of_nats_server(named_client, path, core):
    ours = get_json(named_client["jetraft"], path)
    theirs = get_json(named_client["nats-server"], path)
    assert core <= set(ours), core - set(ours)
    assert set(ours) <= set(theirs), set(ours) - set(theirs)


def test_connz_connection_entry(named_client):
    ours = get_json(named_client["jetraft"], "/connz?subs=1")
    theirs = get_json(named_client["nats-server"], "/connz?subs=1")
    mine = [c for c in ours["connections"] if c.get("name") == "mon"]
    ref = [c for c in theirs["connections"] if c.get("name") == "mon"]
    assert mine and ref
    assert CONN_FIELDS <= set(mine[0])
    assert set(mine[0]) <= set(ref[0]) | {"rtt"}
    assert sorted(mine[0]["subscriptions_list"]) == ["mon.a", "mon.b"]
    assert mine[0]["in_msgs"] == 1 and mine[0]["out_msgs"] == 1
    assert mine[0]["lang"] == "python" and mine[0]["ip"] == "127.0.0.1"


def test_connz_subs_detail_and_paging(named_client, raw):
    jet = named_client["jetraft"]
    extra = [raw(jet.port) for _ in range(3)]
    for c in extra:
        c.exchange(b'CONNECT {"verbose":false}\r\n')
    full = get_json(jet, "/connz")
    assert full["total"] >= 4
    page = get_json(jet, "/connz?limit=2&offset=1")
    assert page["limit"] == 2 and page["offset"] == 1
    assert [c["cid"] for c in page["connections"]] == [c["cid"] for c in full["connections"]][1:3]
    detail = get_json(jet, "/connz?subs=detail")
    subs = [s for c in detail["connections"] for s in c.get("subscriptions_list_detail", [])]
    assert {"subject": "mon.b", "qgroup": "grp", "sid": "2", "msgs": 0} .items() <= \
        next(s for s in subs if s["subject"] == "mon.b").items()


def test_varz_counts_messages(named_client):
    v = get_json(named_client["jetraft"], "/varz")
    assert v["in_msgs"] >= 1 and v["out_msgs"] >= 1
    assert v["connections"] >= 1 and v["subscriptions"] >= 2
    assert v["port"] == named_client["jetraft"].port


def test_healthz_and_404(pair):
    jet = pair["jetraft"]
    assert get_json(jet, "/healthz") == {"status": "ok"}
    assert get(jet, "/nope")[0] == 404


def test_metrics_prometheus_text(named_client):
    status, ctype, body = get(named_client["jetraft"], "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    values = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    assert values["jetraft_connections"] >= 1
    assert values["jetraft_in_msgs_total"] >= 1
    assert any(k.startswith("gnatsd_varz_connections") for k in values)
