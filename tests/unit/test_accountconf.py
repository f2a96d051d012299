"""node/accountconf.py: what an `accounts {}` block becomes.

Accept/reject and error texts are compared with `nats-server -t` in
tests/integration/test_accounts_config_diff.py; this file checks the
content of what we load, which nats-server cannot show us.
"""

from __future__ import annotations

import pytest

from node.accountconf import (
    DEFAULT_SYSTEM_ACCOUNT,
    GLOBAL_ACCOUNT,
    ResponseType,
    parse_accounts_config,
    validate_accounts_at_start,
)
from node.config import ConfigError, apply_config, parse_config

CONFIG = """
mappings { "g.*": "gg.$1" }
no_auth_user: anon
system_account: SYS
accounts {
  SYS: { users: [{user: sys, password: s}] }
  A: {
    users: [
      {user: anon, password: ""}
      {user: alice, password: "$2a$11$abcdefghijklmnopqrstuv", permissions: {
         publish: {allow: ["a.>"], deny: ["a.secret"]}, subscribe: "in.>", allow_responses: true}}
      {nkey: UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4,
       allowed_connection_types: [STANDARD, websocket]}
    ]
    default_permissions: { publish: "dflt.>" }
    exports: [
      {stream: "news.>"}
      {stream: "private.>", accounts: [B]}
      {service: "help.*", response_type: stream, response_threshold: "2s"}
      {service: "chunk", response: chunked}
    ]
    mappings: { "old.*": "new.{{wildcard(1)}}" }
    limits: { max_connections: 5, max_subs: 100, max_payload: 4KB }
    jetstream: { max_mem: 1G, max_file: "2G", max_streams: 10, max_consumers: 20 }
  }
  B: {
    users: [{user: bob, password: b}]
    imports: [
      {stream: {account: A, subject: "news.>"}, prefix: "from_a"}
      {stream: {account: A, subject: "private.*"}, to: "mine.$1"}
      {service: {account: A, subject: "help.*"}, to: "ask.*"}
      {service: {account: A, subject: "chunk"}}
    ]
  }
}
"""


@pytest.fixture(scope="module")
def conf():
    root = parse_config(CONFIG)
    return parse_accounts_config(root, apply_config(root).users)


def test_accounts_and_users(conf) -> None:
    assert set(conf.accounts) == {"SYS", "A", "B"}
    assert conf.system_account == "SYS" and conf.no_auth_user == "anon"
    alice = conf.find_user("alice")
    assert alice is not None and alice.account == "A"
    assert alice.password.startswith("$2a$")
    p = alice.permissions
    assert p.publish_allow == ["a.>"] and p.publish_deny == ["a.secret"]
    assert p.subscribe_allow == ["in.>"] and p.allow_responses
    responder = parse_accounts_config(parse_config(
        "accounts { R: { users: [{user: r, password: r, permissions: {allow_responses: true}}] } }"
    )).find_user("r")
    assert responder.permissions.publish_allow == []  # replies only, as nats-server
    nk = conf.find_user("UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4")
    assert nk is not None and nk.allowed_connection_types == {"STANDARD", "WEBSOCKET"}
    # Users without permissions take the account's default_permissions.
    assert nk.permissions.publish_allow == ["dflt.>"]
    assert conf.find_user("bob").permissions is None
    assert conf.find_user("nobody") is None


def test_exports_imports_and_their_subjects(conf) -> None:
    a, b = conf.accounts["A"], conf.accounts["B"]
    assert [e.subject for e in a.stream_exports] == ["news.>", "private.>"]
    assert a.stream_exports[0].accounts is None and a.stream_exports[1].accounts == {"B"}
    help_, chunk = a.service_exports
    assert help_.response_type is ResponseType.STREAM and help_.response_threshold == 2.0
    assert chunk.response_type is ResponseType.CHUNKED
    news, private = b.stream_imports
    assert news.local_subject == "from_a.news.>"
    assert private.transform is not None and private.transform.apply("private.x") == "mine.x"
    ask, plain = b.service_imports
    assert ask.local_subject == "ask.*" and plain.local_subject == "chunk"
    # A service import's transform runs from the importer's subject to the exporter's.
    assert ask.transform is not None and ask.transform.apply("ask.q") == "help.q"
    assert plain.transform is None
    assert a.stream_export_for("B", "private.x") is not None
    assert a.stream_export_for("C", "private.x") is None
    assert a.service_export_for("B", "help.me") is help_


def test_mappings_limits_and_jetstream(conf) -> None:
    assert conf.mappings_for(GLOBAL_ACCOUNT).apply("g.1") == "gg.1"
    assert conf.mappings_for("A").apply("old.x") == "new.x"
    assert conf.mappings_for("B").apply("old.x") is None
    a = conf.accounts["A"]
    assert (a.limits.max_connections, a.limits.max_subscriptions, a.limits.max_payload) == (
        5, 100, 4096)
    js = a.jetstream
    assert js.enabled and js.max_mem == 1_000_000_000 and js.max_file == 2 * 1024**3
    assert (js.max_streams, js.max_consumers) == (10, 20)
    assert conf.accounts["B"].limits.max_connections == -1
    assert not conf.accounts["B"].jetstream.enabled


def test_defaults_without_accounts() -> None:
    conf = parse_accounts_config(parse_config("port: 4222"))
    assert conf.accounts == {} and conf.system_account == DEFAULT_SYSTEM_ACCOUNT
    assert not conf.global_mappings


def test_no_auth_user_must_exist_at_start(conf) -> None:
    validate_accounts_at_start(conf, set())
    bad = parse_accounts_config(parse_config("accounts { A: {} }\nno_auth_user: ghost"))
    with pytest.raises(ConfigError, match='no_auth_user: "ghost" not present'):
        validate_accounts_at_start(bad, set())
    validate_accounts_at_start(bad, {"ghost"})  # an authorization-block user counts


def test_stream_import_cycle_through_three_accounts_is_refused() -> None:
    text = """accounts {
      A: { exports: [{stream: "x.>"}], imports: [{stream: {account: C, subject: "x.>"}}] }
      B: { exports: [{stream: "x.>"}], imports: [{stream: {account: A, subject: "x.>"}}] }
      C: { exports: [{stream: "x.>"}], imports: [{stream: {account: B, subject: "x.>"}}] }
    }"""
    with pytest.raises(ConfigError, match="import forms a cycle"):
        parse_accounts_config(parse_config(text))
    # The same chain without the closing edge is fine.
    ok = text.replace('imports: [{stream: {account: C, subject: "x.>"}}]', "")
    parse_accounts_config(parse_config(ok))


def test_account_jwt_in_the_same_shapes() -> None:
    from node.jwt import decode_account
    from node.resolver import account_config_from_claims
    from tests import jwt_issuer as ji

    op, acc, other = ji.operator_key(), ji.account_key(), ji.account_key()
    token = ji.account_jwt(
        acc, op,
        exports=[{"name": "s", "subject": "news.>", "type": "stream"},
                 {"name": "v", "subject": "help.*", "type": "service",
                  "response_type": "Chunked"},
                 {"name": "t", "subject": "tok.>", "type": "stream", "token_req": True},
                 {"name": "bad", "subject": "a..b", "type": "stream"}],
        imports=[{"name": "i", "subject": "their.>", "account": other.public, "type": "stream",
                  "local_subject": "mine.>"},
                 {"name": "q", "subject": "ask", "account": other.public, "type": "service"}],
        mappings={"m.*": [{"subject": "mm.$1", "weight": 100}], "n": [{"subject": "nn"}]},
        limits={"conn": 3, "subs": 7, "payload": 1024, "leaf": 0, "mem_storage": -1,
                "disk_storage": 1000, "streams": 2, "consumer": 5})
    conf = account_config_from_claims(decode_account(token))
    assert conf.name == acc.public
    assert [e.subject for e in conf.stream_exports] == ["news.>", "tok.>"]
    assert conf.stream_export_for(other.public, "tok.x") is None  # token required: fail closed
    assert conf.stream_export_for(other.public, "news.x") is not None
    assert conf.service_exports[0].response_type is ResponseType.CHUNKED
    assert conf.stream_imports[0].local_subject == "mine.>"
    assert conf.service_imports[0].local_subject == "ask"
    assert conf.mappings.apply("m.1") == "mm.1" and conf.mappings.apply("n") == "nn"
    assert (conf.limits.max_connections, conf.limits.max_subscriptions,
            conf.limits.max_payload) == (3, 7, 1024)
    js = conf.jetstream
    assert js.enabled and (js.max_mem, js.max_file, js.max_streams, js.max_consumers) == (
        -1, 1000, 2, 5)


def test_import_index_checks_exports_for_jwt_accounts() -> None:
    # Account JWTs are not linked at load: the index itself refuses imports
    # of subjects the exporter does not export to the importer.
    from node.accountconf import (
        AccountConfig,
        AccountsConfig,
        ImportIndex,
        ServiceExport,
        ServiceImport,
        StreamExport,
        StreamImport,
    )

    exporter = AccountConfig("AX", stream_exports=[StreamExport("pub.>"),
                                                   StreamExport("priv.>", frozenset({"AZ"}))],
                             service_exports=[ServiceExport("svc")])
    importer = AccountConfig("AY", stream_imports=[StreamImport("AX", "pub.>"),
                                                   StreamImport("AX", "priv.>"),
                                                   StreamImport("AX", "other.>")],
                             service_imports=[ServiceImport("AX", "svc"),
                                              ServiceImport("AX", "nope")])
    index = ImportIndex(AccountsConfig(accounts={"AX": exporter, "AY": importer}))
    assert [d.subject for d in index.stream_deliveries("AX", "pub.1")] == ["pub.1"]
    assert index.stream_deliveries("AX", "priv.1") == []
    assert index.stream_deliveries("AX", "other.1") == []
    route = index.service_route("AY", "svc")
    assert route is not None and route.account == "AX" and route.subject == "svc"
    assert index.service_route("AY", "nope") is None
    assert index.service_route("AX", "svc") is None


def test_config_hook_fills_options_and_accounts_are_enforced() -> None:
    opts = apply_config(parse_config(CONFIG))
    assert set(opts.accounts.accounts) == {"SYS", "A", "B"}
    assert opts.mappings is opts.accounts.global_mappings and opts.mappings.apply("g.1") == "gg.1"
    assert opts.operator is None
    # Enforced by node/crossaccount.py: neither warned about nor refused at start.
    assert not {"accounts", "mappings"} & set(opts.unsupported + opts.unenforced)
    with pytest.raises(ConfigError, match="stream import not authorized"):
        apply_config(parse_config("accounts { A: {}, B: { imports: [{stream: "
                                  "{account: A, subject: x}}] } }"))


# ---- any shape of input: a ConfigError, never another exception

_KEYS = ["users", "user", "password", "nkey", "permissions", "publish", "subscribe", "allow",
         "deny", "allow_responses", "exports", "imports", "stream", "service", "account",
         "subject", "accounts", "prefix", "to", "response_type", "limits", "max_connections",
         "jetstream", "max_mem", "mappings", "destination", "weight", "cluster",
         "default_permissions", "allowed_connection_types", "latency", "share", "A", "B"]


def _config_values():
    from hypothesis import strategies as st

    scalars = (st.none() | st.booleans() | st.integers(-5, 300) | st.floats(allow_nan=False)
               | st.sampled_from(["A", "B", "foo", "foo.*", "foo.>", ">", "a..b", "", "50%",
                                  "{{wildcard(1)}}", "$1", "chunked", "STANDARD", "1G"]))
    return st.recursive(scalars, lambda c: st.lists(c, max_size=3)
                        | st.dictionaries(st.sampled_from(_KEYS), c, max_size=4),
                        max_leaves=20)


def test_fuzz_accounts_blocks_only_raise_config_errors() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=600, deadline=None)
    @given(st.dictionaries(st.sampled_from(["accounts", "mappings", "system_account",
                                            "no_auth_user"]), _config_values(), max_size=3))
    def check(root: dict) -> None:
        try:
            parse_accounts_config(root)
        except ConfigError:
            pass

    check()
