"""The `jetraft` command line, flag-compatible with nats-server.

Scripts and Helm charts written for nats-server should work unchanged, so
flags follow Go's `flag` package rules rather than argparse's: one or two
dashes (`-port`, `--port`), `-name=value` or `-name value`, boolean flags
take no separate value (`-js`, `-js=false`), and parsing stops at the first
argument that is not a flag.

    jetraft [serve] [flags]              run a server (`serve` may be omitted)
    jetraft signal <sig>[=<pid>] [--pid PID | -P PIDFILE]
    jetraft audit DATA_DIR... [--master URL] [--out DIR] [--acked FILE]   (audit/job.py)
                  [--config NODE.CONF | --key-file FILE [--cipher C]]  (encrypted stores)
    jetraft cluster up [-n 3|5] [--tags ...] [--dir DIR] [--detach]   (node/cluster/local.py)
    jetraft cluster status [--dir DIR]
    jetraft --version

Installed under the name `nats-server` (a symlink, as drop-in installs do),
the command takes nats-server's command line: it always serves.
"""

from __future__ import annotations

import os
import signal as _signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import urlsplit

from node.config import ConfigError, load_options, validate_options
from node.options import Options, TLSOptions
from node.version import VERSION

PROG = "jetraft"
DROP_IN_NAME = "nats-server"  # argv[0] of a drop-in install: act as `jetraft serve`

# nats-server's names for the signals it understands.
SIGNALS: dict[str, int] = {
    "stop": _signal.SIGKILL,
    "quit": _signal.SIGINT,
    "term": _signal.SIGTERM,
    "reopen": _signal.SIGUSR1,
    "reload": _signal.SIGHUP,
    "ldm": _signal.SIGUSR2,
}


class UsageError(Exception):
    """A bad command line: reported on stderr with a usage hint, exit 2."""


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]  # without dashes; the first is the canonical one
    kind: type  # bool, int or str
    help: str
    metavar: str = ""


FLAGS: tuple[Flag, ...] = (
    Flag(("a", "addr", "net"), str, "Bind to host address (default: 0.0.0.0)", "<host>"),
    Flag(("p", "port"), int, "Use port for clients (default: 4222, -1: random)", "<port>"),
    Flag(("n", "name", "server_name"), str, "Server name (default: auto)", "<name>"),
    Flag(("P", "pid"), str, "File to store PID", "<file>"),
    Flag(("m", "http_port"), int, "Use port for http monitoring", "<port>"),
    Flag(("c", "config"), str, "Configuration file", "<file>"),
    Flag(("t",), bool, "Test configuration and exit"),
    Flag(("sl", "signal"), str, "Send signal to a jetraft process", "<signal>[=<pid>]"),
    Flag(("ports_file_dir",), str, "Write a ports file in this directory", "<dir>"),
    Flag(("l", "log"), str, "File to redirect log output", "<file>"),
    Flag(("D", "debug"), bool, "Enable debugging output"),
    Flag(("V", "trace"), bool, "Trace the raw protocol"),
    Flag(("VV",), bool, "Verbose trace"),
    Flag(("DV",), bool, "Debug and trace"),
    Flag(("DVV",), bool, "Debug and verbose trace"),
    Flag(("js", "jetstream"), bool, "Enable JetStream"),
    Flag(("sd", "store_dir"), str, "Set the storage directory", "<dir>"),
    Flag(("user",), str, "User required for connections", "<user>"),
    Flag(("pass",), str, "Password required for connections", "<password>"),
    Flag(("auth",), str, "Authorization token required for connections", "<token>"),
    Flag(("tls",), bool, "Enable TLS, do not verify clients"),
    Flag(("tlscert",), str, "Server certificate file", "<file>"),
    Flag(("tlskey",), str, "Private key for server certificate", "<file>"),
    Flag(("tlsverify",), bool, "Enable TLS, verify client certificates"),
    Flag(("tlscacert",), str, "Client certificate CA for verification", "<file>"),
    Flag(("routes",), str, "Routes to solicit and connect", "<url,url>"),
    Flag(("cluster",), str, "Cluster URL for the route listener", "<url>"),
    Flag(("cluster_listen",), str, "Cluster URL from which members can solicit routes", "<url>"),
    Flag(("cluster_name",), str, "Cluster name", "<name>"),
    Flag(("cluster_advertise",), str, "Cluster URL to advertise to other nodes", "<url>"),
    Flag(("no_advertise",), bool, "Do not advertise known cluster info to clients"),
    Flag(("h", "help"), bool, "Show this message"),
    Flag(("v", "version"), bool, "Show version"),
)

# nats-server flags Jetraft accepts but does not act on; recorded in
# Options.unsupported so the server can warn about them.
IGNORED_FLAGS: tuple[Flag, ...] = (
    Flag(("ms", "https_port"), int, ""),
    Flag(("client_advertise",), str, ""),
    Flag(("T", "logtime"), bool, ""),
    Flag(("logtime_utc",), bool, ""),
    Flag(("s", "syslog"), bool, ""),
    Flag(("r", "remote_syslog"), str, ""),
    Flag(("log_size_limit",), str, ""),
    Flag(("max_traced_msg_len",), int, ""),
    Flag(("connect_retries",), int, ""),
    Flag(("profile",), int, ""),
)

# Shown with one dash in the usage text, as nats-server does (both work).
_SHORT = {"a", "p", "n", "P", "m", "c", "t", "sl", "l", "D", "V", "VV", "DV", "DVV", "js", "sd",
          "h", "v", "ms", "T", "s", "r"}
_BY_NAME: dict[str, Flag] = {n: f for f in FLAGS + IGNORED_FLAGS for n in f.names}
_TRUE = {"1", "t", "true", "y", "yes", "on"}
_FALSE = {"0", "f", "false", "n", "no", "off"}


# --------------------------------------------------------------------------
# Parsing (pure)


def _convert(flag: Flag, name: str, raw: str) -> Any:
    try:
        if flag.kind is bool:
            low = raw.lower()
            if low not in _TRUE | _FALSE:
                raise ValueError(raw)
            return low in _TRUE
        return flag.kind(raw)
    except ValueError:
        raise UsageError(f'invalid value "{raw}" for flag -{name}: parse error') from None


def parse_flags(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """Go-style flag parsing: ({canonical name: value}, positional args)."""
    values: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return values, list(argv[i + 1 :])
        if not arg.startswith("-") or arg == "-":
            return values, list(argv[i:])
        name, eq, raw = arg.lstrip("-").partition("=")
        flag = _BY_NAME.get(name)
        if flag is None or arg.startswith("---"):
            raise UsageError(f"flag provided but not defined: -{name}")
        if not eq and flag.kind is not bool:
            if i + 1 >= len(argv):
                raise UsageError(f"flag needs an argument: -{name}")
            i += 1
            raw = argv[i]
        values[flag.names[0]] = _convert(flag, name, raw) if (eq or flag.kind is not bool) else True
        i += 1
    return values, []


def _url_host_port(text: str, what: str) -> tuple[str | None, int]:
    """`nats://host:port`, `host:port` or `:port` to (host, port)."""
    parts = urlsplit(text if "://" in text else f"nats://{text}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        raise UsageError(f"{what}: could not parse URL {text!r} (expected nats://host:port)")
    return parts.hostname or None, port


def _apply_tls(opts: Options, v: dict[str, Any]) -> None:
    if not any(k in v for k in ("tls", "tlscert", "tlskey", "tlscacert", "tlsverify")):
        return
    if v.get("tls") is False and not v.get("tlsverify"):
        opts.tls = None
        return
    tls = opts.tls or TLSOptions()
    tls.cert_file = v.get("tlscert", tls.cert_file)
    tls.key_file = v.get("tlskey", tls.key_file)
    tls.ca_file = v.get("tlscacert", tls.ca_file)
    if "tlsverify" in v:
        tls.verify = v["tlsverify"]
    opts.tls = tls


def _apply_cluster(opts: Options, v: dict[str, Any]) -> None:
    for key in ("cluster", "cluster_listen"):
        if key in v:
            host, port = _url_host_port(v[key], f"--{key}")
            if host:
                opts.cluster.host = host
            opts.cluster.port = port
            parts = urlsplit(v[key] if "://" in v[key] else f"nats://{v[key]}")
            if parts.username:  # nats-server: credentials in --cluster authorize routes
                opts.cluster.user = parts.username
                opts.cluster.password = parts.password
    if "cluster_name" in v:
        opts.cluster.name = v["cluster_name"]
    if "routes" in v:
        opts.cluster.routes = [r.strip() for r in v["routes"].split(",") if r.strip()]
    if "cluster_advertise" in v:
        opts.cluster.advertise = v["cluster_advertise"]
    if "no_advertise" in v:
        opts.cluster.no_advertise = v["no_advertise"]


_SIMPLE: dict[str, Callable[[Options, Any], None]] = {
    "a": lambda o, x: setattr(o, "host", x),
    "p": lambda o, x: setattr(o, "port", x),
    "n": lambda o, x: setattr(o, "server_name", x),
    "P": lambda o, x: setattr(o, "pid_file", x),
    "m": lambda o, x: setattr(o, "http_port", x),
    "ports_file_dir": lambda o, x: setattr(o, "ports_file_dir", x),
    "l": lambda o, x: setattr(o, "log_file", x),
    "D": lambda o, x: setattr(o, "debug", x),
    "V": lambda o, x: setattr(o, "trace", x),
    "VV": lambda o, x: setattr(o, "trace", x),
    "DV": lambda o, x: (setattr(o, "debug", x), setattr(o, "trace", x)),
    "DVV": lambda o, x: (setattr(o, "debug", x), setattr(o, "trace", x)),
    "js": lambda o, x: setattr(o.jetstream, "enabled", x),
    "sd": lambda o, x: setattr(o.jetstream, "store_dir", x),
    "user": lambda o, x: setattr(o, "user", x),
    "pass": lambda o, x: setattr(o, "password", x),
    "auth": lambda o, x: setattr(o, "token", x),
}


def options_from_flags(values: dict[str, Any], env: dict[str, str] | None = None) -> Options:
    """The config file (if any) with the flags applied on top: flags win."""
    path = values.get("c")
    opts = load_options(path, env=env) if path else Options()
    for name, value in values.items():
        if name in _SIMPLE:
            _SIMPLE[name](opts, value)
        elif _BY_NAME[name] in IGNORED_FLAGS:
            long_name = f"--{_BY_NAME[name].names[-1]}"
            opts.unsupported.append(long_name)
            opts.extra[long_name] = value
    _apply_tls(opts, values)
    _apply_cluster(opts, values)
    opts.flags = dict(values)
    return opts


# --------------------------------------------------------------------------
# Output


def _invoked_as() -> str:
    """Our name on output lines: `nats-server` under a drop-in install, so
    scripts that parse `nats-server --version` keep working."""
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    return DROP_IN_NAME if name == DROP_IN_NAME else PROG


def version() -> str:
    """The version INFO and /varz report (not the Python package's)."""
    return VERSION


def usage() -> str:
    lines = [f"Usage: {PROG} [serve] [options]", f"       {PROG} signal <signal>[=<pid>] "
             "[--pid <pid> | -P <pidfile>]", "", "Options:"]
    for f in FLAGS:
        names = ", ".join(("-" if n in _SHORT else "--") + n for n in f.names)
        lines.append(f"    {names + ' ' + f.metavar:<40} {f.help}")
    lines.append("")
    lines.append(f"Signals: {', '.join(SIGNALS)}")
    return "\n".join(lines)


def log_line(level: str, message: str, now: float | None = None) -> str:
    """nats-server's log format: `[pid] YYYY/MM/DD HH:MM:SS.ffffff [LVL] msg`."""
    t = time.time() if now is None else now
    stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t))
    micros = int((t % 1) * 1_000_000)
    return f"[{os.getpid()}] {stamp}.{micros:06d} [{level}] {message}"


def _fatal(message: str, err: TextIO) -> int:
    print(log_line("FTL", message), file=err)
    return 1


# --------------------------------------------------------------------------
# Commands


def _read_pid(target: str) -> int:
    """A PID, or the path of a PID file holding one (as nats-server allows)."""
    if target.isdigit():
        return int(target)
    try:
        with open(target, encoding="ascii") as f:
            text = f.read().strip()
    except OSError as e:
        raise UsageError(f"could not read PID file {target!r}: {e.strerror or e}") from None
    if not text.isdigit():
        raise UsageError(f"PID file {target!r} does not hold a PID: {text[:40]!r}")
    return int(text)


def send_signal(name_and_pid: str, pid_arg: str | None, err: TextIO) -> int:
    name, _, inline_pid = name_and_pid.partition("=")
    sig = SIGNALS.get(name.lower())
    if sig is None:
        raise UsageError(f"unknown signal {name!r} (expected one of: {', '.join(SIGNALS)})")
    target = inline_pid or pid_arg
    if not target:
        raise UsageError("signal: give the server's PID with --pid <pid> or -P <pidfile>")
    pid = _read_pid(target)
    try:
        os.kill(pid, sig)
    except OSError as e:
        print(f"{PROG}: could not send {name} to pid {pid}: {e.strerror or e}", file=err)
        return 1
    return 0


def _signal_command(argv: Sequence[str], err: TextIO) -> int:
    if not argv:
        raise UsageError("signal: which signal? " + ", ".join(SIGNALS))
    name, rest = argv[0], list(argv[1:])
    values, extra = parse_flags(rest)
    if extra:
        raise UsageError(f"unrecognized command: {extra[0]!r}")
    unexpected = set(values) - {"P"}
    if unexpected:
        raise UsageError(f"signal: unexpected flag -{sorted(unexpected)[0]}")
    return send_signal(name, values.get("P"), err)


def _test_config(values: dict[str, Any], out: TextIO) -> int:
    if "c" not in values:
        raise UsageError("must specify [-c, --config] option to check configuration file syntax")
    options_from_flags(values)
    print(f"{PROG}: configuration file {values['c']} is valid", file=out)
    return 0


def serve(argv: Sequence[str], out: TextIO, err: TextIO) -> int:
    values, extra = parse_flags(argv)
    if extra:
        raise UsageError(f"unrecognized command: {extra[0]!r}")
    if values.get("h"):
        print(usage(), file=out)
        return 0
    if values.get("v"):
        print(f"{_invoked_as()}: v{version()}", file=out)
        return 0
    if "sl" in values:
        return send_signal(values["sl"], values.get("P"), err)
    try:
        if values.get("t"):
            return _test_config(values, out)
        opts = options_from_flags(values)
        validate_options(opts)
    except ConfigError as e:
        return _fatal(str(e), err)
    from node.server import run  # imported late: the server pulls in asyncio, grpc, lmdb

    return run(opts)


def _audit_command(args: list[str], err: TextIO) -> int:
    """The Raft log audit; its dependencies (pyspark, matplotlib) are the `audit` extra."""
    try:
        from audit.job import main as audit_main
    except ImportError as e:
        print(f"{PROG} audit: {e}; install with: pip install 'jetraft[audit]'", file=err)
        return 2
    return audit_main(args)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    out = out or sys.stdout
    err = err or sys.stderr
    if argv is None and _invoked_as() == DROP_IN_NAME:
        args = ["serve", *args]
    try:
        if args and args[0] == "signal":
            return _signal_command(args[1:], err)
        if args and args[0] == "audit":
            return _audit_command(args[1:], err)
        if args and args[0] == "cluster":
            from node.cluster.local import main as cluster_main

            return cluster_main(args[1:], out, err)
        if args and args[0] == "serve":
            args = args[1:]
        elif args and not args[0].startswith("-"):
            raise UsageError(f"unrecognized command: {args[0]!r}")
        return serve(args, out, err)
    except UsageError as e:
        print(f"{_invoked_as()}: {e}", file=err)
        print(f"Run '{_invoked_as()} --help' for usage.", file=err)
        return 2


if __name__ == "__main__":
    sys.exit(main())
