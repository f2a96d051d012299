"""Config reload (SIGHUP, `jetraft signal reload`, `$SYS.REQ.SERVER.<id>.RELOAD`).

The config file is read again and the command-line flags applied on top, as
at start. What nats-server can change at runtime is applied: authorization
users and permissions, accounts (limits, mappings, imports and exports),
logging, connection and message limits, ping and write settings, TLS. An
option it cannot change (ports, hosts, names, cluster, JetStream, operator)
refuses the whole reload with nats-server's message, and so does a new config
that does not load or validate: the running config stays as it was.

Security fails closed: every connected client is authenticated again with
the credentials of its CONNECT against the new config. A client whose user
is gone, whose credentials no longer pass, or whose user moved to another
account is closed; one whose permissions changed gets the new ones at once,
and each of its subscriptions the new permissions deny is removed with
nats-server's `-ERR`. While a bcrypt check for a client runs off the loop,
that client may neither publish nor receive.

`plan_reload` is pure (old and new Options in, changes or a refusal out);
`Reloader` applies a plan to the running server.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from typing import Any

from node.auth import Authenticator, CompiledPermissions, PermissionSet, SlowCheck
from node.config import ConfigError
from node.options import Options, Permissions

# Options nats-server refuses to change at runtime, with the name its message uses.
_NOT_RELOADABLE = {
    "host": "Host", "port": "Port", "http_host": "HTTPHost", "http_port": "HTTPPort",
    "server_name": "ServerName", "cluster": "Cluster", "websocket": "Websocket",
    "jetstream": "JetStream", "server_tags": "Tags", "pid_file": "PidFile",
    "ports_file_dir": "PortsFileDir", "operator": "TrustedOperators",
}
# Reloadable options, with the name nats-server logs ("Reloaded: <name> = <value>").
_SIMPLE = {
    "debug": "debug", "trace": "trace", "log_file": "log_file",
    "max_connections": "max_connections", "max_payload": "max_payload",
    "max_control_line": "max_control_line", "max_pending": "max_pending",
    "ping_interval": "ping_interval", "ping_max": "ping_max",
    "write_deadline": "write_deadline", "auth_timeout": "auth_timeout",
    "lame_duck_duration": "lame_duck_duration",
    "lame_duck_grace_period": "lame_duck_grace_period", "tls": "tls",
}
_DURATIONS = {"ping_interval", "write_deadline", "lame_duck_duration", "lame_duck_grace_period"}
_AUTH = ("user", "password", "token", "users", "no_auth_user", "default_permissions")
_ACCOUNTS = ("accounts", "mappings")
# Not options a reload compares: where the config came from, and what the
# start-up checks read (unenforced is checked on its own, below).
_IGNORED = {"config_file", "unsupported", "unenforced", "extra", "flags"}

NO_FILE = "can only reload config when a file is provided using -c or --config"
# No one may publish, subscribe or receive while a re-check runs.
# (An empty subscribe allow list means "no restriction", so deny everything explicitly.)
_DENY_ALL = CompiledPermissions.build(Permissions(publish_allow=[], publish_deny=[">"],
                                                  subscribe_deny=[">"]))


class ReloadError(Exception):
    """The reload is refused; the message is what nats-server logs after
    "Failed to reload server configuration: "."""


def go_duration(seconds: float) -> str:
    """Go's time.Duration text: 2m0s, 10s, 500ms."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    s = round(seconds)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    if h:
        return f"{h}h{m}m{sec}s"
    if m:
        return f"{m}m{sec}s"
    return f"{sec}s"


def _show(name: str, value: Any) -> str:
    if name in _DURATIONS:
        return go_duration(float(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    if name == "tls":
        return "enabled" if value is not None else "disabled"
    return "" if value is None else str(value)


@dataclass
class Plan:
    """What a reload changes (empty lists: nothing)."""

    changes: list[str] = field(default_factory=list)  # "Reloaded: ..." lines
    auth: bool = False  # users, permissions or accounts changed: re-check every client
    accounts: bool = False


def plan_reload(old: Options, new: Options) -> Plan:
    """Compare the running options with the new ones; ReloadError if refused."""
    if new.unenforced:
        names = ", ".join(repr(k) for k in new.unenforced)
        raise ReloadError(f"security configuration not enforced by jetraft yet: {names}")
    if _system_account(old) != _system_account(new):
        # The system service lives in it: nats-server does not move it at runtime either.
        raise ReloadError("config reload not supported for SystemAccount: "
                          f"old={_plain(_system_name(old))}, new={_plain(_system_name(new))}")
    for name, label in _NOT_RELOADABLE.items():
        before, after = getattr(old, name), getattr(new, name)
        if before != after:
            raise ReloadError(f"config reload not supported for {label}: "
                              f"old={_plain(before)}, new={_plain(after)}")
    plan = Plan()
    for name, label in _SIMPLE.items():
        before, after = getattr(old, name), getattr(new, name)
        if before != after:
            plan.changes.append(f"Reloaded: {label} = {_show(name, after)}")
    if any(getattr(old, n) != getattr(new, n) for n in _AUTH) or new.users or new.accounts \
            and new.accounts.accounts:
        # nats-server re-applies users and accounts on every reload that has them.
        plan.auth = True
        plan.changes.append("Reloaded: authorization users")
    if _has_accounts(old) or _has_accounts(new):
        # Rebuilt on every reload that has them (their mapping tables have no
        # equality to compare), as nats-server re-applies them.
        plan.auth = plan.accounts = True
        plan.changes.append("Reloaded: accounts")
    known = set(_NOT_RELOADABLE) | set(_SIMPLE) | set(_AUTH) | set(_ACCOUNTS) | _IGNORED
    for name in vars(old):
        if name not in known and getattr(old, name) != getattr(new, name):
            raise ReloadError(f"config reload not supported for {name}")
    return plan


def _has_accounts(o: Options) -> bool:
    conf = o.accounts
    return conf is not None and bool(conf.accounts or conf.global_mappings)


def _system_account(o: Options) -> tuple[str, bool] | None:
    conf = o.accounts
    return None if conf is None else (conf.system_account, conf.no_system_account)


def _system_name(o: Options) -> str:
    conf = o.accounts
    return "" if conf is None or conf.no_system_account else conf.system_account


def _plain(value: Any) -> str:
    """Values the way nats-server prints them in its refusal (old=, new=)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def config_digest(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return "sha256:" + hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return "sha256:"


class Reloader:
    """Applies a reload to a running server (node/server.py's `reload_config`)."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def load(self) -> Options:
        """The new options: config file, then the command-line flags, checked
        as at start. ConfigError / ReloadError when they cannot be used."""
        from node.cli import options_from_flags  # cli imports the server lazily
        from node.config import validate_options

        old = self.server.options
        flags = dict(getattr(old, "flags", None) or {})
        if not old.config_file or "c" not in flags:
            raise ReloadError(NO_FILE)
        new = options_from_flags(flags)
        new.flags = flags
        validate_options(new)
        return new

    def reload(self) -> str | None:
        """Reload now; None when done, else the reason it was refused."""
        server = self.server
        try:
            new = self.load()
            plan = plan_reload(server.options, new)
            auth = self._new_auth(new) if plan.auth else server.auth
            tls_ctx = self._new_tls(new)
        except (ConfigError, ReloadError, ValueError, OSError) as err:
            server.log.error(f"Failed to reload server configuration: {err}")
            return str(err)
        self._apply(new, plan, auth, tls_ctx)
        for line in plan.changes:
            server.log.info(line)
        server.log.info(f"Reloaded server configuration ({config_digest(new.config_file)})")
        return None

    def _new_auth(self, new: Options) -> Any:
        server = self.server
        if new.operator is not None:
            return server.auth  # operator mode: accounts come from the resolver, unchanged
        auth = Authenticator(new)  # ValueError: no_auth_user names no user
        old = server.auth
        if isinstance(old, Authenticator):
            # bcrypt outcomes are keyed on (configured hash, given secret): still true.
            auth._secrets = old._secrets
        return auth

    def _new_tls(self, new: Options) -> Any:
        from node import tls

        if new.tls is None or not new.tls.cert_file:
            return None
        if new.tls == self.server.options.tls:
            return self.server.tls_ctx
        return tls.server_context(new.tls)

    def _apply(self, new: Options, plan: Plan, auth: Any, tls_ctx: Any) -> None:
        server = self.server
        old = server.options
        if new.operator is not None:
            new.accounts = old.accounts  # built from the resolver's JWTs at start
        server.options = new
        log = server.log
        log.debug_enabled, log.trace_enabled = new.debug, new.trace
        if new.log_file != old.log_file:
            log.set_file(new.log_file)
        server.tls_ctx = tls_ctx
        server.tls_first = bool(new.tls and new.tls.handshake_first)
        if plan.accounts and new.operator is None:
            server.rebuild_accounts(new)
        server.auth = auth
        if server.system is not None:
            server.system.accounts_changed()
        pins_changed = _pins(new) != _pins(old)
        for client in list(server.clients.values()):
            if pins_changed:
                client.recheck_pin()
                if client.closed:
                    continue
            client.set_tracing(new.trace)
            client.limits_reloaded()
            if plan.auth and new.operator is None:
                self._recheck(client)
            else:
                client.account_changed(client.account)

    def _recheck(self, client: Any) -> None:
        """Authenticate a connected client again against the new config."""
        if client.closed or not client.connected:
            return
        server = self.server
        auth = server.auth
        user = client.identity.user if client.identity is not None else None
        if user is not None and auth.user_account(user) != client.account.name:
            # The user is gone or lives in another account now: closed without a
            # word, as nats-server does; a user still there whose credentials fail
            # gets -ERR 'Authorization Violation' (reauthorized(None)).
            client.removed_by_reload()
            return
        result = auth.begin(client.opts, client.nonce, client.peer_cert(),
                            client.conn_type, client.host or None)
        if type(result) is not SlowCheck:
            client.reauthorized(result)
            return
        # bcrypt, not known yet: off the loop; meanwhile the client can do nothing.
        client.hold(PermissionSet(_DENY_ALL))
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(server.auth_workers, result.run)
        except RuntimeError:  # shutting down
            client.reauthorized(None)
            return

        def done(f: asyncio.Future[bool]) -> None:
            ok = not f.cancelled() and f.exception() is None and bool(f.result())
            client.reauthorized(server.auth.finish(result, ok))

        future.add_done_callback(done)


def _pins(options: Options) -> list[str]:
    return list(options.tls.pinned_certs) if options.tls is not None else []
