"""node/cli.py: nats-server-compatible flags, config override, signals, exit codes."""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.cli import UsageError, main, options_from_flags, parse_flags
from tests.ports import free_port

REPO = Path(__file__).resolve().parent.parent.parent
LOG_LINE = re.compile(r"^\[\d+\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} \[FTL\] ")


def opts_for(*argv: str):
    values, rest = parse_flags(list(argv))
    assert rest == []
    return options_from_flags(values)


def run_main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def run_cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "node.cli", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


# ---- flag parsing -> Options


@pytest.mark.parametrize(
    ("argv", "attr", "expected"),
    [
        (["-p", "4333"], "port", 4333),
        (["--port", "4333"], "port", 4333),
        (["--port=4333"], "port", 4333),
        (["-port", "4333"], "port", 4333),
        (["-port=4333"], "port", 4333),
        (["-p", "-1"], "port", -1),
        (["-a", "127.0.0.1"], "host", "127.0.0.1"),
        (["--addr=127.0.0.1"], "host", "127.0.0.1"),
        (["-net", "127.0.0.1"], "host", "127.0.0.1"),
        (["-m", "8222"], "http_port", 8222),
        (["--http_port=8222"], "http_port", 8222),
        (["-n", "n1"], "server_name", "n1"),
        (["--name", "n1"], "server_name", "n1"),
        (["--server_name=n1"], "server_name", "n1"),
        (["-D"], "debug", True),
        (["--debug"], "debug", True),
        (["-V"], "trace", True),
        (["-VV"], "trace", True),
        (["-l", "/tmp/j.log"], "log_file", "/tmp/j.log"),
        (["--log=/tmp/j.log"], "log_file", "/tmp/j.log"),
        (["-P", "/tmp/j.pid"], "pid_file", "/tmp/j.pid"),
        (["--pid", "/tmp/j.pid"], "pid_file", "/tmp/j.pid"),
        (["--ports_file_dir", "/tmp"], "ports_file_dir", "/tmp"),
        (["--user", "u"], "user", "u"),
        (["--pass", "p"], "password", "p"),
        (["--auth", "t0k"], "token", "t0k"),
    ],
)
def test_flag_sets_option(argv: list[str], attr: str, expected: object) -> None:
    assert getattr(opts_for(*argv), attr) == expected


@pytest.mark.parametrize("argv", [["-js"], ["--jetstream"], ["-js=true"], ["-jetstream=1"]])
def test_jetstream_on(argv: list[str]) -> None:
    assert opts_for(*argv).jetstream.enabled is True


def test_jetstream_off_and_bool_flags_do_not_eat_the_next_argument() -> None:
    assert opts_for("-js=false").jetstream.enabled is False
    opts = opts_for("-js", "-p", "5")
    assert opts.jetstream.enabled and opts.port == 5


@pytest.mark.parametrize("argv", [["-sd=/tmp/sd"], ["-sd", "/tmp/sd"], ["--store_dir=/tmp/sd"],
                                  ["--store_dir", "/tmp/sd"]])
def test_store_dir_both_forms(argv: list[str]) -> None:
    assert opts_for(*argv).jetstream.store_dir == "/tmp/sd"


@pytest.mark.parametrize("flag", ["-DV", "-DVV"])
def test_debug_and_trace_together(flag: str) -> None:
    opts = opts_for(flag)
    assert opts.debug and opts.trace


def test_tls_flags() -> None:
    tls = opts_for("--tlscert", "c.pem", "--tlskey=k.pem", "--tlscacert", "ca.pem",
                   "--tlsverify").tls
    assert (tls.cert_file, tls.key_file, tls.ca_file, tls.verify) == ("c.pem", "k.pem",
                                                                     "ca.pem", True)
    assert opts_for("--tls", "--tlscert", "c", "--tlskey", "k").tls.verify is False
    assert opts_for("-p", "1").tls is None


def test_cluster_flags() -> None:
    c = opts_for("--cluster", "nats://127.0.0.1:6222", "--cluster_name", "c1",
                 "--routes", "nats://127.0.0.1:6223, nats://127.0.0.1:6224").cluster
    assert (c.host, c.port, c.name) == ("127.0.0.1", 6222, "c1")
    assert c.routes == ["nats://127.0.0.1:6223", "nats://127.0.0.1:6224"]
    assert opts_for("--cluster_listen=nats://0.0.0.0:7000").cluster.port == 7000
    with pytest.raises(UsageError, match="could not parse URL"):
        opts_for("--cluster", "nats://127.0.0.1")


def test_ignored_nats_server_flags_are_recorded() -> None:
    opts = opts_for("-T=false", "--client_advertise", "x:1")
    assert opts.unsupported == ["--logtime", "--client_advertise"]
    assert opts.extra["--logtime"] is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus"], "flag provided but not defined: -bogus"),
        (["-bogus=1"], "flag provided but not defined: -bogus"),
        (["-p"], "flag needs an argument: -p"),
        (["-p", "abc"], 'invalid value "abc" for flag -p: parse error'),
        (["-js=maybe"], 'invalid value "maybe" for flag -js'),
        (["---port", "1"], "flag provided but not defined"),
    ],
)
def test_bad_flags(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        parse_flags(argv)


def test_parsing_stops_at_the_first_non_flag() -> None:
    assert parse_flags(["-p", "1", "extra", "-D"]) == ({"p": 1}, ["extra", "-D"])
    assert parse_flags(["-D", "--", "-p"]) == ({"D": True}, ["-p"])


# ---- config file + flags


def test_flags_override_the_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "j.conf"
    conf.write_text("port: 4333\nserver_name: from-file\ndebug: true\n"
                    "jetstream { store_dir: /from/file }\n")
    opts = opts_for("-c", str(conf), "-p", "5555", "-sd=/from/flag")
    assert opts.port == 5555 and opts.jetstream.store_dir == "/from/flag"
    assert opts.server_name == "from-file" and opts.debug and opts.jetstream.enabled
    assert opts.config_file == str(conf)
    # Order does not matter: the file is read first, then every flag applied.
    assert opts_for("-p", "5555", "--config", str(conf)).port == 5555


def test_config_error_is_a_fatal_log_line(tmp_path: Path) -> None:
    conf = tmp_path / "bad.conf"
    conf.write_text("port: 4222\nbogus: 1\n")
    code, out, err = run_main("serve", "-c", str(conf))
    assert code == 1 and out == ""
    assert LOG_LINE.match(err), err
    assert f'{conf}:2:1: unknown field "bogus"' in err


def test_start_time_checks_are_fatal(tmp_path: Path) -> None:
    conf = tmp_path / "limits.conf"
    conf.write_text("max_payload: 2MB\nmax_pending: 1MB\n")
    code, _, err = run_main("-c", str(conf))
    assert code == 1 and LOG_LINE.match(err) and "max_pending" in err


def test_missing_config_file() -> None:
    code, _, err = run_main("serve", "-c", "/nonexistent/jetraft.conf")
    assert code == 1 and "/nonexistent/jetraft.conf" in err


def test_check_config_flag(tmp_path: Path) -> None:
    conf = tmp_path / "ok.conf"
    conf.write_text("port: 4333\n")
    code, out, _ = run_main("serve", "-c", str(conf), "-t")
    assert code == 0 and "is valid" in out
    code, _, err = run_main("-t")
    assert code == 2 and "must specify" in err


# ---- the command as a process


def test_unknown_flag_exit_code_and_message() -> None:
    proc = run_cli("serve", "--bogus")
    assert proc.returncode == 2
    assert "flag provided but not defined: -bogus" in proc.stderr
    assert "--help" in proc.stderr


def test_unknown_command() -> None:
    proc = run_cli("frobnicate")
    assert proc.returncode == 2 and "frobnicate" in proc.stderr


@pytest.mark.parametrize("flag", ["--version", "-v", "-version"])
def test_version(flag: str) -> None:
    proc = run_cli(flag)
    assert proc.returncode == 0
    assert re.fullmatch(r"jetraft: v\d+\.\d+\.\d+\S*\n", proc.stdout), proc.stdout


def test_help_lists_flags() -> None:
    code, out, _ = run_main("--help")
    assert code == 0 and "--store_dir" in out and "-js" in out and "ldm" in out


# ---- signal


CATCHER = """
import signal, sys, time
got = []
for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGTERM):
    signal.signal(s, lambda n, f: got.append(n))
open(sys.argv[1], "w").write("ready")
deadline = time.monotonic() + 60
while not got and time.monotonic() < deadline:
    time.sleep(0.01)
open(sys.argv[1], "w").write(str(got[0] if got else -1))
"""


def _catcher(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", CATCHER, str(marker)])
    deadline = time.monotonic() + 30
    while not (marker.exists() and marker.read_text() == "ready"):
        assert time.monotonic() < deadline, "signal catcher did not start"
        time.sleep(0.02)
    return proc, marker


@pytest.mark.parametrize(
    ("how", "sig", "expected"),
    [("pidfile", "ldm", signal.SIGUSR2), ("pid", "reopen", signal.SIGUSR1),
     ("inline", "reload", signal.SIGHUP), ("serve-flag", "term", signal.SIGTERM)],
)
def test_signal_reaches_the_process(tmp_path: Path, how: str, sig: str, expected: int) -> None:
    proc, marker = _catcher(tmp_path)
    try:
        pidfile = tmp_path / "j.pid"
        pidfile.write_text(f"{proc.pid}\n")
        argv = {
            "pidfile": ["signal", sig, "-P", str(pidfile)],
            "pid": ["signal", sig, "--pid", str(proc.pid)],
            "inline": ["signal", f"{sig}={proc.pid}"],
            "serve-flag": ["--signal", f"{sig}={pidfile}"],
        }[how]
        code, _, err = run_main(*argv)
        assert code == 0, err
        assert proc.wait(timeout=30) == 0
        assert marker.read_text() == str(int(expected))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_signal_errors(tmp_path: Path) -> None:
    code, _, err = run_main("signal", "nap", "--pid", "1")
    assert code == 2 and "unknown signal" in err
    code, _, err = run_main("signal", "ldm")
    assert code == 2 and "PID" in err
    (tmp_path / "bad.pid").write_text("not a pid")
    code, _, err = run_main("signal", "ldm", "-P", str(tmp_path / "bad.pid"))
    assert code == 2 and "does not hold a PID" in err


# ---- serve hands the options to node.server


def test_serve_starts_a_server_with_the_flags(tmp_path: Path) -> None:
    try:
        import node.server  # noqa: F401
    except ImportError as e:  # another part of the tree is still being written
        pytest.skip(f"node.server not importable: {e}")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "node.cli", "serve", "-a", "127.0.0.1", "-p", str(port),
         "-n", "cli-test", "-sd", str(tmp_path / "js")],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        info = _read_info(port, proc)
        assert b'"server_name":"cli-test"' in info and f'"port":{port}'.encode() in info
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _read_info(port: int, proc: subprocess.Popen[bytes]) -> bytes:
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, f"server exited with {proc.returncode}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                return s.makefile("rb").readline()
        except OSError:
            assert time.monotonic() < deadline, "server did not start listening"
            time.sleep(0.1)


def test_pid_file_holds_a_pid_for_signal(tmp_path: Path) -> None:
    # The pid file format `signal -P` reads is the one nats-server writes: digits only.
    pidfile = tmp_path / "p.pid"
    pidfile.write_text(str(os.getpid()))
    from node.cli import _read_pid

    assert _read_pid(str(pidfile)) == os.getpid()
