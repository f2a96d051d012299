"""node/config.py: the nats-server config format, checked against nats-server itself."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from node.config import (
    ConfigError,
    apply_config,
    load_options,
    parse_config,
    parse_duration,
    parse_size,
    validate_options,
)
from node.options import Options

DATA = Path(__file__).resolve().parent.parent / "data" / "config"
VALID = sorted((DATA / "valid").glob("*.conf"))
INVALID = sorted((DATA / "invalid").glob("*.conf"))
ENV = {"JETRAFT_TEST_PORT": "4999"}
NATS_SERVER = shutil.which("nats-server")


def parse(text: str, env: dict[str, str] | None = None) -> dict:
    return parse_config(text, "t.conf", env=env or {})


def options(text: str, env: dict[str, str] | None = None) -> Options:
    return apply_config(parse(text, env))


# ---- values


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("4222", 4222),
        ("-1", -1),
        ("1.5", 1.5),
        ("1K", 1000),
        ("1k", 1000),
        ("1KB", 1024),
        ("1kb", 1024),
        ("1Ki", 1024),
        ("1KiB", 1024),
        ("1M", 1_000_000),
        ("1MB", 1024**2),
        ("1mib", 1024**2),
        ("1G", 1_000_000_000),
        ("1GB", 1024**3),
        ("2T", 2 * 1000**4),
        ("true", True),
        ("Yes", True),
        ("on", True),
        ("FALSE", False),
        ("no", False),
        ("off", False),
        ("10s", "10s"),
        ("500ms", "500ms"),
        ("1.2.3.4", "1.2.3.4"),
        ("127.0.0.1:4222", "127.0.0.1:4222"),
        ("nats://a:1", "nats://a:1"),
        ("a#b", "a#b"),
        ("+5", "+5"),
    ],
)
def test_bare_words_are_typed_like_nats_server(word: str, expected: object) -> None:
    value = parse(f"v: {word}\n")["v"]
    assert value == expected and type(value) is type(expected)


def test_separators_comments_and_terminators() -> None:
    d = parse("a: 1\nb = 2\nc 3 # hash\nd: 4 // slashes\ne: 5; f: 6, g: 7\n// whole line\n")
    assert d == {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7}


def test_nested_blocks_and_arrays() -> None:
    d = parse("x {\n a: [1, 2,\n 3\n {b: c}, [d]]\n y = { z: 1 }\n}\n")
    assert d == {"x": {"a": [1, 2, 3, {"b": "c"}, ["d"]], "y": {"z": 1}}}


def test_quoted_strings() -> None:
    d = parse('a: "t\\tn\\n\\"q\\" \\x41"\nb: \'raw\\n $X\'\nc: "$X"\n')
    assert d == {"a": 't\tn\n"q" A', "b": "raw\\n $X", "c": "$X"}


def test_block_string() -> None:
    assert parse("s: (\nline one\n  line two\n)\nport: 1\n") == {
        "s": "line one\n  line two", "port": 1,
    }


def test_json_form() -> None:
    d = parse('{"port": 4222, "a": {"b": [true, "x"]}, "c": 1.5}')
    assert d == {"port": 4222, "a": {"b": [True, "x"]}, "c": 1.5}


def test_variables_scope_and_environment() -> None:
    text = "A: top\nB: $A\nblk { A: inner\n c: $A\n d: $B }\ne: $FROM_ENV\n"
    d = parse(text, env={"FROM_ENV": "4222", "A": "env-loses"})
    assert d["B"] == "top"
    assert d["blk"]["c"] == "inner" and d["blk"]["d"] == "top"
    assert d["e"] == 4222  # environment values are parsed as config values
    assert d.used_as_var == {"A", "B"} and d["blk"].used_as_var == {"A"}


def test_include_is_relative_to_the_including_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "auth.conf").write_text("user: u\npassword: p\nV: 7\n")
    main = "authorization {\n include sub/auth.conf\n timeout: $V\n}\n"
    (tmp_path / "main.conf").write_text(main)
    opts = load_options(str(tmp_path / "main.conf"))
    assert (opts.user, opts.password, opts.auth_timeout) == ("u", "p", 7.0)


def test_self_include_is_bounded(tmp_path: Path) -> None:
    (tmp_path / "loop.conf").write_text("include loop.conf\n")
    with pytest.raises(ConfigError, match="nested deeper"):
        load_options(str(tmp_path / "loop.conf"))


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("port: 4222\nbogus: 1\n", "t.conf:2:1:"),
        ("a {\n  b: [x y]\n}\n", "t.conf:2:9:"),
        ("port:\n", "t.conf:1:6:"),
        ('x: "abc\n', "t.conf:1:4:"),
        ("jetstream {\n  store_dir: /x\n  bogus: 1\n}\n", "t.conf:3:3:"),
        ("a {\n b: 1\n", "t.conf:3:1:"),
        ("x: $NOPE\n", "t.conf:1:4:"),
    ],
)
def test_errors_name_file_line_and_column(text: str, where: str) -> None:
    with pytest.raises(ConfigError) as e:
        options(text)
    assert str(e.value).startswith(where), str(e.value)


def test_durations_and_sizes() -> None:
    assert parse_duration("1h30m") == 5400.0
    assert parse_duration("500ms") == 0.5
    assert parse_duration("2.5s") == 2.5
    assert parse_size("10G") == 10 * 1024**3
    assert parse_size("512MB") == 512 * 1024**2
    for bad in ("", "10", "abc", "1x"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    with pytest.raises(ValueError):
        parse_size("lots")


# ---- mapping onto Options


def test_top_level_mapping() -> None:
    opts = options(
        "listen: 127.0.0.1:4333\nhttp: 127.0.0.1:8333\nserver_name: n1\nmax_payload: 2MB\n"
        "max_pending: 100MB\nmax_control_line: 8KB\nmax_connections: 10\nping_interval: \"30s\"\n"
        "ping_max: 5\nwrite_deadline: \"2s\"\nlame_duck_duration: \"1m\"\n"
        "lame_duck_grace_period: 5\ndebug: true\ntrace: yes\nlog_file: /tmp/x.log\n"
        "pid_file: /tmp/x.pid\nports_file_dir: /tmp\nserver_tags: \"a, b\"\n"
    )
    assert (opts.host, opts.port, opts.http_host, opts.http_port) == ("127.0.0.1", 4333,
                                                                      "127.0.0.1", 8333)
    assert (opts.max_payload, opts.max_pending, opts.max_control_line) == (2 * 1024**2,
                                                                           100 * 1024**2, 8192)
    assert (opts.ping_interval, opts.ping_max, opts.write_deadline) == (30.0, 5, 2.0)
    assert (opts.lame_duck_duration, opts.lame_duck_grace_period) == (60.0, 5.0)
    assert opts.debug and opts.trace and opts.server_tags == ["a", "b"]
    assert (opts.log_file, opts.pid_file, opts.ports_file_dir) == ("/tmp/x.log", "/tmp/x.pid",
                                                                   "/tmp")


def test_keys_are_case_insensitive_and_last_wins() -> None:
    opts = options("PORT: 1\nPort: 2\nNet: 10.0.0.1\nmonitor_port: 8\n")
    assert (opts.port, opts.host, opts.http_port) == (2, "10.0.0.1", 8)


def test_authorization_users_and_permissions() -> None:
    opts = load_options(str(DATA / "valid" / "auth_users.conf"))
    alice, bob, nk = opts.users
    assert alice.user == "alice" and alice.password.startswith("$2a$11$")
    p = alice.permissions
    assert p.publish_allow == ["orders.>"] and p.publish_deny is None
    assert p.subscribe_allow == ["orders.>", "_INBOX.>"] and p.subscribe_deny == ["orders.secret"]
    assert p.allow_responses is True
    assert (bob.user, bob.password, bob.permissions) == ("bob", "s3cret", None)
    assert nk.nkey.startswith("UDXU") and nk.user is None
    assert opts.no_auth_user == "bob" and opts.auth_timeout == 3.0


def test_tls_and_websocket() -> None:
    opts = options(
        "tls { cert_file: c.pem, key_file: k.pem, ca_file: ca.pem, verify: true, timeout: 3,"
        " handshake_first: true, curve_preferences: [x] }\n"
        "websocket { listen: 127.0.0.1:8080, compression: true,"
        " tls { cert_file: c, key_file: k } }\n"
    )
    assert opts.tls.cert_file == "c.pem" and opts.tls.key_file == "k.pem"
    assert opts.tls.ca_file == "ca.pem" and opts.tls.verify and opts.tls.timeout == 3.0
    assert opts.tls.handshake_first
    assert "tls.curve_preferences" in opts.unenforced  # would let other curves in
    ws = opts.websocket
    assert (ws.host, ws.port, ws.compression, ws.no_tls) == ("127.0.0.1", 8080, True, False)
    assert ws.tls.cert_file == "c"


@pytest.mark.parametrize(
    ("text", "enabled"),
    [("jetstream: true", True), ("jetstream: enabled", True), ("jetstream: disabled", False),
     ("jetstream: {}", True), ("jetstream { enabled: false }", False), ("jetstream: off", False)],
)
def test_jetstream_switch(text: str, enabled: bool) -> None:
    assert options(text + "\n").jetstream.enabled is enabled


def test_jetstream_block() -> None:
    js = options(
        "jetstream { store_dir: /data, max_mem: 1G, max_file: \"10G\", sync_interval: \"2m\","
        " unique_tag: az, domain: hub }\n"
    ).jetstream
    assert (js.store_dir, js.max_mem, js.max_file) == ("/data", 10**9, 10 * 1024**3)
    assert (js.sync_interval, js.unique_tag, js.domain) == ("2m", "az", "hub")
    assert not options("jetstream { domain: hub }\n").unsupported  # served, not warned about
    assert not js.audit_archive
    assert options("jetstream { audit_archive: true }\n").jetstream.audit_archive


def test_cluster_block() -> None:
    c = options("cluster { name: c1, host: 127.0.0.1, port: 6222, routes: [nats://a:1, "
                "nats://b:2], pool_size: 3 }\n").cluster
    assert (c.name, c.host, c.port, c.routes) == ("c1", "127.0.0.1", 6222,
                                                  ["nats://a:1", "nats://b:2"])


def test_raft_lane_defaults_to_the_direct_lane_and_is_checked() -> None:
    c = options("cluster { name: c1 }\n").cluster
    assert (c.raft_port, c.raft_lane) == (0, "auto")
    for lane in ("auto", "direct", "grpc"):
        assert options(f"cluster {{ raft_lane: {lane} }}\n").cluster.raft_lane == lane
    with pytest.raises(ConfigError, match="raft_lane must be one of auto, direct, grpc"):
        options("cluster { raft_lane: fast }\n")


def test_raft_lane_a_node_cannot_honour_fails_at_start() -> None:
    # `raft_lane: direct` promises Raft on the lane only; with the lane off (raft_port -1)
    # the node would quietly run Raft over gRPC instead: refused at start.
    with pytest.raises(ConfigError, match="raft_lane: direct needs"):
        validate_options(options("cluster { port: 6222, raft_lane: direct, raft_port: -1 }\n"))
    for port in (-2, 65536):
        with pytest.raises(ConfigError, match="raft_port .* is out of range"):
            validate_options(options(f"cluster {{ port: 6222, raft_port: {port} }}\n"))
    for text in ("raft_lane: direct", "raft_lane: grpc, raft_port: -1", "raft_port: 7001"):
        validate_options(options(f"cluster {{ port: 6222, {text} }}\n"))


def test_unsupported_blocks_are_recorded_not_dropped() -> None:
    opts = load_options(str(DATA / "valid" / "unsupported.conf"))
    assert opts.port == 4555
    assert set(opts.unsupported) == {"leafnodes", "logtime"}
    assert opts.unenforced == []  # accounts are enforced (node/crossaccount.py)
    assert set(opts.accounts.accounts) == {"A"}
    assert opts.extra["leafnodes"] == {"port": 7422}


def test_variables_used_as_keys_are_not_unknown_fields() -> None:
    opts = options("P: 4333\nport: $P\n")
    assert opts.port == 4333 and opts.unsupported == []
    with pytest.raises(ConfigError, match='unknown field "P"'):
        options("P: 4333\nport: 1\n")


def test_apply_config_does_not_mutate_its_input() -> None:
    base = Options()
    out = apply_config({"port": 1, "jetstream": {"store_dir": "/x"}}, base)
    assert out.port == 1 and out.jetstream.store_dir == "/x"
    assert base.port == 4222 and base.jetstream.store_dir != "/x"


def test_integer_durations_are_seconds() -> None:
    # nats-server -t flags these, but a running nats-server takes them as seconds.
    assert options("ping_interval: 5\nwrite_deadline: 1.5\n").ping_interval == 5.0


def test_validate_options() -> None:
    with pytest.raises(ConfigError, match="max_payload"):
        validate_options(options("max_payload: 100\nmax_pending: 50\n"))
    with pytest.raises(ConfigError, match="no_auth_user"):
        validate_options(options("no_auth_user: x\nauthorization { users: [{user: a}] }\n"))
    with pytest.raises(ConfigError, match="websocket"):
        validate_options(options("websocket { port: 8080 }\n"))
    validate_options(options("websocket { port: 8080, no_tls: true }\n"))


def test_a_system_account_that_does_not_exist_stops_the_node() -> None:
    """As nats-server: "error resolving system account: account missing" (fail closed)."""
    for text in ("system_account: NOPE\n",
                 "accounts { A { users: [{user: a, password: p}] } }\nsystem_account: NOPE\n"):
        with pytest.raises(ConfigError, match="account missing"):
            validate_options(options(text))
    validate_options(options("accounts { S {} }\nsystem_account: S\n"))
    validate_options(options("accounts { A {} }\n"))  # the default $SYS is made


def test_validate_options_checks_tls_files_exist(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    text = f"tls {{ cert_file: {cert}, key_file: {key} }}\n"
    with pytest.raises(ConfigError, match="key_file"):
        validate_options(options(text))
    key.write_text("x")
    validate_options(options(text))


# ---- differential: the same files through nats-server -t


def _nats_accepts(path: Path) -> tuple[bool, str]:
    proc = subprocess.run(
        [NATS_SERVER, "-c", path.name, "-t"], cwd=path.parent, capture_output=True, text=True,
        timeout=60, env={**os.environ, **ENV},
    )
    return proc.returncode == 0, proc.stdout + proc.stderr


def _we_accept(path: Path) -> tuple[bool, str]:
    try:
        load_options(str(path), env={**os.environ, **ENV})
    except ConfigError as e:
        return False, str(e)
    return True, ""


@pytest.mark.skipif(NATS_SERVER is None, reason="nats-server not installed")
@pytest.mark.parametrize("path", VALID + INVALID, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_differential_against_nats_server(path: Path) -> None:
    theirs, their_msg = _nats_accepts(path)
    ours, our_msg = _we_accept(path)
    assert theirs == (path.parent.name == "valid"), their_msg  # the sample is filed right
    assert ours == theirs, f"nats-server: {their_msg.strip()!r}; jetraft: {our_msg!r}"
    if not ours:
        assert our_msg.startswith(str(path)) or "include" in our_msg, our_msg


def test_sample_values() -> None:
    env = {**os.environ, **ENV}
    v = DATA / "valid"
    basic = load_options(str(v / "basic.conf"))
    assert (basic.port, basic.host, basic.server_name, basic.max_connections, basic.ping_max) == (
        4333, "127.0.0.1", "jetraft-1", 100, 3)
    sizes = load_options(str(v / "sizes.conf"))
    assert (sizes.max_payload, sizes.max_pending) == (2 * 1024**2, 100_000_000)
    variables = load_options(str(v / "variables.conf"), env=env)
    assert (variables.server_name, variables.password, variables.port) == ("from-file", "inner",
                                                                           4999)
    inc = load_options(str(v / "include.conf"))
    assert (inc.max_payload, inc.debug, inc.user) == (512 * 1024, True, "included")
    js = load_options(str(v / "json.conf"))
    assert (js.port, js.server_name, js.jetstream.max_mem, js.users[0].user) == (
        4444, "json-node", 1048576, "a")
    strings = load_options(str(v / "strings.conf"))
    assert strings.server_name == "single\\quoted"
    assert strings.extra["http_base_path"] == "/monitor"
    assert load_options(str(v / "jetstream_flag.conf")).jetstream.enabled


@pytest.mark.skipif(NATS_SERVER is None, reason="nats-server not installed")
def test_size_units_match_a_running_nats_server(tmp_path: Path) -> None:
    """max_payload from INFO, for the binary and the decimal suffix."""
    import socket

    for word, expected in (("1MB", 1024**2), ("900K", 900_000)):
        conf = tmp_path / "s.conf"
        conf.write_text(f"port: -1\nmax_payload: {word}\nports_file_dir: {tmp_path}\n")
        assert options(f"max_payload: {word}\n").max_payload == expected
        proc = subprocess.Popen([NATS_SERVER, "-c", str(conf)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            port = _wait_for_port(tmp_path, proc.pid)
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                info = s.makefile("rb").readline()
            assert f'"max_payload":{expected}'.encode() in info
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _wait_for_port(directory: Path, pid: int) -> int:
    import json
    import time

    deadline = time.monotonic() + 30
    ports = directory / f"nats-server_{pid}.ports"
    while time.monotonic() < deadline:
        if ports.exists():
            try:
                url = json.loads(ports.read_text())["nats"][0]
                return int(url.rsplit(":", 1)[1])
            except (ValueError, KeyError, IndexError):
                pass
        time.sleep(0.05)
    raise AssertionError("nats-server did not write its ports file")


# ---- differential fuzzing: generated configs, accepted or rejected alike


_SEPARATORS = [": ", " = ", " ", ":", "=", " : ", "\t", "\n  "]
_TERMINATORS = ["\n", ", ", "; ", " # c\n", " // c\n", "\n\n", ",\n", ";"]
_VALUES = {
    "int": ["4222", "-1", "1K", "1MB", "0", "12", "$V"],
    "bool": ["true", "false", "yes", "no", "on", "off", "TRUE"],
    "str": ["abc", '"abc"', "'abc'", "a.b.c", "'a b'", '"a\\tb"', "x-1", "nats://a:1"],
}
_KEYS = [("port", "int"), ("debug", "bool"), ("trace", "bool"), ("server_name", "str"),
         ("server_tags", "list"), ("max_payload", "int"), ("ping_max", "int")]
_NOISE = list("{}[],;:=\"'#/ \n$")


def _gen_value(rnd, kind: str) -> str:
    if kind != "list":
        return rnd.choice(_VALUES[kind])
    items = [rnd.choice(_VALUES["str"]) for _ in range(rnd.randint(0, 3))]
    body = "".join(i + rnd.choice([", ", ",", "\n", ",\n", " ,"]) for i in items)
    if body and rnd.random() < 0.5:
        body = body.rstrip(",\n ")
    return "[" + rnd.choice(["", " ", "\n"]) + body + rnd.choice(["", " ", "\n"]) + "]"


def _gen_entry(rnd) -> str:
    if rnd.random() < 0.2:
        inner = "".join(rnd.choice(["user", "password"]) + rnd.choice(_SEPARATORS[:6])
                        + _gen_value(rnd, "str") + rnd.choice(_TERMINATORS)
                        for _ in range(rnd.randint(0, 2)))
        return "authorization" + rnd.choice([" ", " = ", ": ", ""]) + "{" + inner + "}"
    key, kind = rnd.choice(_KEYS)
    return key + rnd.choice(_SEPARATORS) + _gen_value(rnd, kind)


def _gen_config(rnd) -> str:
    text = "V: 7\nmax_connections: $V\n" if rnd.random() < 0.3 else ""
    text += "".join(_gen_entry(rnd) + rnd.choice(_TERMINATORS) for _ in range(rnd.randint(1, 5)))
    if rnd.random() < 0.3:  # one stray character anywhere
        i = rnd.randrange(len(text) + 1)
        text = text[:i] + rnd.choice(_NOISE) + text[i:]
    return text


@pytest.mark.skipif(NATS_SERVER is None, reason="nats-server not installed")
def test_generated_configs_agree_with_nats_server(tmp_path: Path) -> None:
    import random

    rnd = random.Random(20261121)
    disagreements = []
    for n in range(150):
        text = _gen_config(rnd)
        path = tmp_path / f"g{n}.conf"
        path.write_text(text)
        theirs, their_msg = _nats_accepts(path)
        ours, our_msg = _we_accept(path)
        if theirs != ours:
            disagreements.append((text, their_msg.strip(), our_msg))
    assert disagreements == []
