"""node/accountconf.py and node/mapping.py against `nats-server -t`.

Each config below goes through nats-server's config check and through our
loader; both must accept or both refuse, and when both refuse, with the
same message (the `file:line:col` prefix aside: nats-server reports some
of these at the `accounts` key, some at the offending entry).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from node.accountconf import parse_accounts_config
from node.config import ConfigError, apply_config, parse_config

NATS_SERVER = shutil.which("nats-server")
UKEY = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"
AKEY = "ADGF7PXSSAGPGPHYWUADOX3GEW5W7HZ5SB5H2DKG5IM3FLZ3BQ6XMMUA"

_A = "A: { users: [{user: a, password: a}], exports: [{stream: \"foo.>\"}, {service: \"svc.*\"}] }"

CONFIGS: list[str] = [
    # ---- mappings
    'mappings: { "a.*": "b.{{wildcard(1)}}" }',
    'mappings: { "a.*": "b.{{wildcard(2)}}" }',
    'mappings: { "a.*": "b.$2" }',
    'mappings: { "a.>": "b" }',
    'mappings: { "a": "b.*" }',
    'mappings: { "a.*": "{{nope(1)}}" }',
    'mappings: { "a.*": "{{partition(0,1)}}" }',
    'mappings: { "a.*": "{{split(1)}}" }',
    'mappings: { "a.*": "{{split(1,a b)}}" }',
    'mappings: { "a.*": "{{split(1,.)}}" }',
    'mappings: { "a.*": "b.{{wildcard(1)}" }',
    'mappings: { "a.*": "{{wildcard()}}" }',
    'mappings: { "a.*": "{{wildcard(1,2)}}" }',
    'mappings: { "a.*": "{{wildcard(x)}}" }',
    'mappings: { "a.*": "{{splitfromleft(1)}}" }',
    'mappings: { "a.*": "{{splitfromleft(1,2,3)}}" }',
    'mappings: { "a.*": "{{splitfromleft(1,3000000000)}}" }',
    'mappings: { "a.*": "{{partition(3000000000,1)}}" }',
    'mappings: { "a.*": "{{partition()}}" }',
    'mappings: { "a.*": "{{partition(3,1,x)}}" }',
    'mappings: { "a.*": "{{random(3)}}" }',
    'mappings: { "a.*": "{{random()}}" }',
    'mappings: { "a.*": "{{random(1,2)}}" }',
    'mappings: { "a": "{{wildcard(1)}}" }',
    'mappings: { "a": "b.{{partition(3)}}" }',
    'mappings: { "a.>": "{{wildcard(1)}}.>" }',
    'mappings: { "a.*.>": "x.{{partition(3)}}.>" }',
    'mappings: { "a.*": "x.{{SPLIT(1,-)}}" }',
    'mappings: { "a.*": "x..y" }',
    'mappings: { "a.*": "x.>.y" }',
    'mappings: { "a.*": "x y" }',
    'mappings: { "a.*": "{{wildcard(1)}}{{x}}" }',
    'mappings: { "a..b": "c" }',
    'mappings: { "": "x" }',
    'mappings: { w: [{destination: w1, weight: 60%},{destination: w2, weight: 50%}] }',
    'mappings: { w: [{destination: w1, weight: 101}] }',
    'mappings: { w: [{destination: w1, weight: "50%"}] }',
    'mappings: { w: [{destination: w1, weight: 50}] }',
    'mappings: { w: [{destination: w1, weight: 0}] }',
    'mappings: { w: [{destination: w1}] }',
    'mappings: { w: [{destination: w1, weight: 50%, foo: 1}] }',
    'mappings: { w: [] }',
    'mappings: { w: 5 }',
    'mappings: { w: ["x"] }',
    'mappings: { w: {destination: w1, weight: 50%} }',
    'mappings: { w: [{destination: w1, weight: 50%},{destination: w1, weight: 40%}] }',
    'mappings: { w: [{destination: w1, weight: 50%, cluster: a},'
    '{destination: w2, weight: 60%, cluster: b}] }',
    'mappings: { w: [{destination: w1, weight: 50%, cluster: a},'
    '{destination: w2, weight: 60%, cluster: a}] }',
    'mappings: { w: [{destination: w1, weight: 50%, cluster: a},'
    '{destination: w1, weight: 40%, cluster: b}] }',
    'mappings: { w: [{destination: "w.*", weight: 100%}] }',
    'mappings: { w: [{destination: w1, weight: -1}] }',
    'mappings: { w: [{destination: w1, weight: "150%"}] }',
    'mappings: { w: [{destination: w1, weight: 1.5}] }',
    'mappings: { w: [{destination: w1, weight: abc}] }',
    'mappings: { w: [{dest: w1, weight: 50%}] }',
    'accounts { A: { mappings: { "a..": b } } }',
    'accounts { A: { mappings: { "a.*": "b.$1", c: [{destination: d, weight: 40%}] } } }',
    'accounts { A: { maps: { "a.*": "b.$3" } } }',
    # ---- accounts, users
    f"accounts {{ {_A} }}",
    "accounts: [A, B]",
    "accounts: [A, A]",
    "accounts { $G: {} }",
    "accounts { A: 5 }",
    "accounts { A: { foo: 1 } }",
    "accounts { A: { users: [{user: a, password: a}] }, B: { users: [{user: a, password: b}] } }",
    "accounts { A: { users: [{user: a}] } }\nauthorization { users: [{user: a, password: x}] }",
    "accounts { A: { users: [{nkey: UBADKEY}] } }",
    f"accounts {{ A: {{ users: [{{nkey: {UKEY}}}] }} }}",
    f"accounts {{ A: {{ users: [{{nkey: {UKEY}, password: x}}] }} }}",
    f"accounts {{ A: {{ users: [{{nkey: {UKEY}}}] }}, B: {{ users: [{{nkey: {UKEY}}}] }} }}",
    f"accounts {{ A: {{ nkey: {AKEY} }} }}",
    "accounts { A: { nkey: ABAD } }",
    "accounts { A: { users: [{password: x}] } }",
    "accounts { A: { users: [{user: a, password: a, account: B}] } }",
    "accounts { A: { users: [{user: a, password: a, "
    "allowed_connection_types: [STANDARD, WEBSOCKET, BOGUS]}] } }",
    "accounts { A: { users: [{user: a, password: a, allowed_connection_types: [STANDARD]}] } }",
    "accounts { A: { users: [{user: a, password: a, permissions: {publish: {allow: [\"a\"]}, "
    "allow_responses: {max: 2, expires: \"1m\"}}}] } }",
    "accounts { A: { users: [{user: a, password: a, permissions: {publish: a, bogus: 1}}] } }",
    "accounts { A: { default_permissions: { publish: \"x\" }, users: [{user: a, password: b}]} }",
    "accounts { A: {} }\nno_auth_user: nobody",
    "accounts { A: {} }\nsystem_account: A",
    "system_account: NOPE",
    # ---- limits and jetstream
    "accounts { A: { limits: { max_connections: 5, max_subscriptions: 10, max_payload: 100, "
    "max_leafnodes: 1 } } }",
    "accounts { A: { limits: { max_conn: 5, max_subs: 10, max_pay: 100, foo: 2 } } }",
    "accounts { A: { jetstream: { max_mem: 1G, max_file: 2G, max_streams: 10, "
    "max_consumers: 100 } } }",
    "accounts { A: { jetstream: { max_mem: 1G, foo: 1 } } }",
    "accounts { A: { jetstream: enabled } }",
    "accounts { A: { jetstream: disabled } }",
    # ---- exports and imports
    "accounts { A: { exports: [{stream: \"foo.>\"}] }, "
    "B: { imports: [{stream: {account: A, subject: \"foo.>\"}}] } }",
    "accounts { A: { exports: [{stream: \"foo.>\"}] }, "
    "B: { imports: [{stream: {account: A, subject: \"bar.>\"}}] } }",
    "accounts { A: { exports: [{stream: \"foo.bar\"}] }, "
    "B: { imports: [{stream: {account: A, subject: \"foo.>\"}}] } }",
    "accounts { A: { exports: [{stream: \"foo.>\"}] }, "
    "B: { imports: [{stream: {account: A, subject: \"foo.bar\"}, prefix: p}] } }",
    "accounts { A: { exports: [{stream: \"foo.bar\"}] }, "
    "B: { imports: [{stream: {account: A, subject: \"foo.bar.baz\"}}] } }",
    "accounts { A: { exports: [{service: \"foo.*\"}] }, "
    "B: { imports: [{service: {account: A, subject: \"foo\"}}] } }",
    "accounts { A: { exports: [{service: \"foo\"}] }, "
    "B: { imports: [{service: {account: A, subject: \"bar\"}}] } }",
    "accounts { A: { exports: [{service: \"foo\"}] }, "
    "B: { imports: [{service: {account: C, subject: \"foo\"}}] } }",
    "accounts { A: { exports: [{stream: \"foo\", accounts: [C]}] }, "
    "B: { imports: [{stream: {account: A, subject: \"foo\"}}] }, C: {} }",
    "accounts { A: { exports: [{stream: \"foo\", accounts: [B]}] }, "
    "B: { imports: [{stream: {account: A, subject: \"foo\"}}] } }",
    "accounts { A: { exports: [{stream: \"foo\", accounts: [Z]}] } }",
    "accounts { A: { exports: [{service: \"foo\"}], imports: [{service: {account: B, "
    "subject: \"foo\"}}] }, B: { exports: [{service: \"foo\"}], imports: [{service: "
    "{account: A, subject: \"foo\"}}] } }",
    "accounts { A: { exports: [{stream: \"foo\"}], imports: [{stream: {account: B, "
    "subject: \"foo\"}}] }, B: { exports: [{stream: \"foo\"}], imports: [{stream: "
    "{account: A, subject: \"foo\"}}] } }",
    "accounts { A: { exports: [{service: \"foo\"}], imports: [{service: {account: B, "
    "subject: \"bar\"}}] }, B: { exports: [{service: \"bar\"}], imports: [{service: "
    "{account: A, subject: \"foo\"}}] } }",
    "accounts { A: { exports: [{service: \"foo\"}], imports: [{service: {account: B, "
    "subject: \"foo\"}, to: x}] }, B: { exports: [{service: \"foo\"}], imports: [{service: "
    "{account: A, subject: \"foo\"}}] } }",
    "accounts { A: { exports: [{service: \"foo\"}], imports: [{service: {account: A, "
    "subject: \"foo\"}}] } }",
    "accounts { A: { exports: [{stream: \"foo\"}], imports: [{stream: {account: A, "
    "subject: \"foo\"}}] } }",
    "accounts { A: { exports: [{service: \"foo\"}] }, B: { imports: [{service: {account: A, "
    "subject: \"foo\"}, to: bar}] } }",
    "accounts { A: { exports: [{service: \"foo.*\"}] }, B: { imports: [{service: {account: A, "
    "subject: \"foo.*\"}, to: \"bar.{{partition(2,1)}}\"}] } }",
    "accounts { A: { exports: [{service: \"foo.*.*\"}] }, B: { imports: [{service: "
    "{account: A, subject: \"foo.*.*\"}, to: \"bar.$1\"}] } }",
    "accounts { A: { exports: [{service: \"foo.*\"}] }, B: { imports: [{service: {account: A, "
    "subject: \"foo.*\"}, to: \"bar.*\"}] } }",
    "accounts { A: { exports: [{stream: \"foo.>\"}] }, B: { imports: [{stream: {account: A, "
    "subject: \"foo.>\"}, prefix: p, to: \"x.>\"}] } }",
    "accounts { A: { exports: [{stream: \"foo.*\"}] }, B: { imports: [{stream: {account: A, "
    "subject: \"foo.*\"}, to: \"bar.>\"}] } }",
    "accounts { A: { exports: [{stream: \"foo.*\"}] }, B: { imports: [{stream: {account: A, "
    "subject: \"foo.*\"}, to: \"bar.{{partition(3,1)}}\"}] } }",
    "accounts { A: { exports: [{stream: \"foo.*.*\"}] }, B: { imports: [{stream: {account: A, "
    "subject: \"foo.*.*\"}, to: \"bar.$2\"}] } }",
    "accounts { A: { exports: [{stream: \"foo.*.*\"}] }, B: { imports: [{stream: {account: A, "
    "subject: \"foo.*.*\"}, to: \"bar.$2.$1\"}] } }",
    "accounts { A: { exports: [{service: \"foo\"}] }, B: { imports: [{service: {account: A, "
    "subject: \"foo\"}}, {service: {account: A, subject: \"foo\"}}] } }",
    "accounts { A: { exports: [{service: \"b\"}] }, B: { exports: [{service: \"b\"}] }, "
    "C: { imports: [{service: {account: A, subject: \"b\"}}, {service: {account: B, "
    "subject: \"b\"}}] } }",
    "accounts { A: { exports: [{service: \"b\"}, {service: \"c\"}] }, C: { imports: "
    "[{service: {account: A, subject: \"b\"}}, {service: {account: A, subject: \"c\"}, "
    "to: b}] } }",
    "accounts { A: { exports: [{stream: \">\"}] }, C: { imports: [{stream: {account: A, "
    "subject: \"x\"}, prefix: p}, {stream: {account: A, subject: \"x\"}, prefix: q}] } }",
    "accounts { A: { exports: [{stream: \">\"}] }, B: { exports: [{stream: \">\"}] }, "
    "C: { imports: [{stream: {account: A, subject: \"x\"}}, {stream: {account: B, "
    "subject: \"x\"}}] } }",
    "accounts { A: { exports: [{service: \"foo\", response_type: bogus}] } }",
    "accounts { A: { exports: [{service: \"foo\", response_type: chunked}] } }",
    "accounts { A: { exports: [{service: \"foo\", response_type: Stream}] } }",
    "accounts { A: { exports: [{stream: foo, response_type: single}] } }",
    "accounts { A: { exports: [{stream: foo, service: bar}] } }",
    "accounts { A: { exports: [{}] } }",
    "accounts { A: { imports: [{}] } }",
    "accounts { A: { imports: [{stream: {account: A}}] } }",
    "accounts { A: { exports: {stream: foo} } }",
    "accounts { A: { exports: [{service: \"foo.*\", response_threshold: \"1s\", "
    "latency: {subject: lat, sampling: 50%}}] } }",
    "accounts { A: { exports: [{service: \"foo.*\", account_token_position: 2}] } }",
    "accounts { A: { exports: [{service: \"foo.*\", account_token_position: 1}] } }",
    "accounts { A: { exports: [{stream: \"foo.*\", account_token_position: 2}] }, "
    "B: { imports: [{stream: {account: A, subject: \"foo.B\"}}] } }",
    "accounts { A: { exports: [{stream: \"foo.*\", account_token_position: 2}] }, "
    "B: { imports: [{stream: {account: A, subject: \"foo.C\"}}] } }",
    "accounts { A: { exports: [{stream: \"x.>\"}], imports: [{stream: {account: C, "
    "subject: \"x.>\"}}] }, B: { exports: [{stream: \"x.>\"}], imports: [{stream: "
    "{account: A, subject: \"x.>\"}}] }, C: { exports: [{stream: \"x.>\"}], imports: "
    "[{stream: {account: B, subject: \"x.>\"}}] } }",
    "accounts { A: { exports: [{stream: \"foo.>\"}] }, B: { exports: [{stream: \"p.foo.>\"}], "
    "imports: [{stream: {account: A, subject: \"foo.>\"}, prefix: p}] }, "
    "C: { imports: [{stream: {account: B, subject: \"p.foo.>\"}}] } }",
]


# nats-server walks these entries' keys in Go map order, which is random: it
# refuses them on some runs and accepts them on others. We always refuse.
ORDER_DEPENDENT = {
    CONFIGS.index(c) for c in CONFIGS if "prefix: p, to:" in c or "stream: foo, service:" in c
}
# nats-server's cycle check walks accounts in random order, and for this one
# answers "valid" or "import forms a cycle" from run to run.
EITHER = {CONFIGS.index(c) for c in CONFIGS if "subject: \"foo\"}, to: x}" in c}


def _strip_where(msg: str) -> str:
    msg = msg.strip().removeprefix("nats-server: ")
    return re.sub(r"^\S+:\d+:\d+: ", "", msg)


def _theirs(path: Path) -> tuple[bool, str]:
    proc = subprocess.run([NATS_SERVER, "-c", str(path), "-t"], capture_output=True, text=True,
                          timeout=30)
    lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
    return proc.returncode == 0, _strip_where(lines[0] if lines else "")


def _ours(text: str) -> tuple[bool, str]:
    try:
        root = parse_config(text, "t.conf")
        opts = apply_config(root)
        parse_accounts_config(root, opts.users)
    except ConfigError as e:
        return False, _strip_where(str(e))
    return True, ""


@pytest.mark.skipif(NATS_SERVER is None, reason="nats-server not installed")
@pytest.mark.parametrize("text", CONFIGS)
def test_accounts_config_agrees_with_nats_server(text: str, tmp_path: Path) -> None:
    path = tmp_path / "t.conf"
    path.write_text(text + "\n")
    ok, msg = _theirs(path)
    our_ok, our_msg = _ours(text)
    if CONFIGS.index(text) in EITHER:
        assert our_ok or our_msg.endswith("import forms a cycle")
        return
    if CONFIGS.index(text) in ORDER_DEPENDENT:
        # Refused by us every time, with one of the texts nats-server uses.
        assert not our_ok
        assert our_msg in ("Stream import can not have a 'prefix' and a 'to' property",
                           'Detected service "bar" but already saw a stream',
                           'Detected stream "foo" but already saw a service')
        return
    assert our_ok == ok, f"nats-server: {msg!r}; jetraft: {our_msg!r}"
    if not ok:
        assert our_msg == msg


def test_empty_mapping_destination_is_refused_unlike_nats_server() -> None:
    # nats-server 2.15 accepts it and panics on the first matching message.
    ok, msg = _ours('mappings: { "a.*": "" }')
    assert not ok and "empty destination" in msg


# ---- generated: random exports and imports between three accounts

_SUBJECTS = ["a", "a.b", "a.*", "a.>", "b", "b.*", "*.b", ">"]


def _gen_accounts(rnd) -> str:
    names = ["A", "B", "C"]
    exports: dict[str, list[tuple[str, str]]] = {n: [] for n in names}
    parts = []
    for name in names:
        for _ in range(rnd.randint(0, 2)):
            exports[name].append((rnd.choice(["stream", "service"]), rnd.choice(_SUBJECTS)))
    for name in names:
        export_items, import_items = [], []
        for kind, subject in exports[name]:
            entry = f'{kind}: "{subject}"'
            if rnd.random() < 0.15:
                entry += f", accounts: [{rnd.choice(names)}]"
            export_items.append("{" + entry + "}")
        offered = [(n, k, s) for n in names for k, s in exports[n]]
        for _ in range(rnd.randint(0, 2)):
            if offered and rnd.random() < 0.9:  # mostly imports of something exported
                account, kind, subject = rnd.choice(offered)
                if rnd.random() < 0.15:
                    subject = rnd.choice(_SUBJECTS)
            else:
                account = rnd.choice(names)
                kind, subject = rnd.choice(["stream", "service"]), rnd.choice(_SUBJECTS)
            entry = f'{kind}: {{account: {account}, subject: "{subject}"}}'
            if kind == "stream" and rnd.random() < 0.3:
                entry += ", prefix: p"
            elif rnd.random() < 0.1:
                entry += f', to: "{rnd.choice(_SUBJECTS)}"'
            import_items.append("{" + entry + "}")
        parts.append(f"{name}: {{ exports: [{', '.join(export_items)}], "
                     f"imports: [{', '.join(import_items)}] }}")
    return "accounts {\n  " + "\n  ".join(parts) + "\n}\n"


@pytest.mark.skipif(NATS_SERVER is None, reason="nats-server not installed")
def test_generated_accounts_agree_with_nats_server(tmp_path: Path) -> None:
    import random

    rnd = random.Random(20261123)
    path = tmp_path / "g.conf"
    refused = either = 0
    total = 150
    for _ in range(total):
        text = _gen_accounts(rnd)
        path.write_text(text)
        our_ok, our_msg = _ours(text)
        ours = (our_ok, our_msg.split(": ")[-1] if not our_ok else "")
        seen = set()
        # nats-server walks accounts in random order: its answer may vary from run
        # to run. Ours must be one of its answers.
        for _ in range(8):
            ok, msg = _theirs(path)
            seen.add((ok, msg.split(": ")[-1] if not ok else ""))
            if ours in seen:
                break
        assert ours in seen, f"{text}\nnats-server: {seen}; jetraft: {our_msg!r}"
        refused += not our_ok
        either += len(seen) > 1
    assert 20 < refused < total - 20, refused
