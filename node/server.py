"""The node's asyncio server: listeners, the client registry, the accounts, signals.

Only socket, timer and signal code lives here.  Protocol handling is in
`node/client.py`; publishes are processed by the client's account
(`node/account.py`).  `run()` is what `jetraft serve` calls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import json
import math
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from node import tls
from node.account import GLOBAL_ACCOUNT, Account
from node.accountconf import AccountsConfig
from node.activation import apply_activations
from node.auth import AUTH_VIOLATION, CONN_STANDARD, CONN_WEBSOCKET, Authenticator
from node.authqueue import AuthThrottle
from node.claimsservice import ClaimsService
from node.client import Client, Kind
from node.config import ConfigError
from node.crossaccount import Router
from node.jetstream import domain
from node.log import Logger
from node.message import InternalCallback, Subscription
from node.monitor import start_monitor
from node.operatorauth import (
    OperatorAuthenticator,
    enforceable,
    make_resolver,
    operator_accounts,
)
from node.options import Options
from node.reload import Reloader
from node.resolver import account_config_from_claims
from node.sublist import SubList
from node.sysaccount import SystemService
from node.version import GO_VERSION, VERSION
from node.websocket import start_websocket

__all__ = ["GO_VERSION", "VERSION", "Server", "run"]

JS_API_LEVEL = 5  # nats-server 2.15.1's INFO api_lvl (node/jetstream/api.py API_LEVEL)
AUTH_WORKERS = 2  # threads for bcrypt checks: the event loop never hashes
_ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"  # base32, like nkeys server ids


def new_server_id() -> str:
    """56 characters starting with N, shaped like a nats-server id."""
    return "N" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(55))


def _optional_auth(options: Options) -> Any:
    """The config's authenticator, or operator mode's (JWT users)."""
    try:
        cfg = enforceable(options)
    except ConfigError as err:
        raise ValueError(str(err)) from err  # run() logs it as [FTL] and exits
    if cfg is None:
        return Authenticator(options)
    resolver = make_resolver(cfg)
    # Accounts come from the resolver's JWTs, built like configured ones.
    options.accounts = operator_accounts(cfg, resolver, time.time())
    return OperatorAuthenticator(options, cfg, resolver)


def _optional_tls(options: Options) -> Any:
    if options.tls is None or not options.tls.cert_file:
        return None
    return tls.server_context(options.tls)


class _InternalClientService:
    """Stops an internal client at shutdown, with the other services."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def stop(self) -> None:
        self.client.close_internal()


class Server:
    """One node: accepts clients, routes core NATS messages."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.server_id = new_server_id()
        self.server_name = options.server_name or self.server_id
        self.log = Logger(options.debug, options.trace, options.log_file)
        # Every user lives in the global account until accounts are configured.
        self.accounts: dict[str, Account] = {GLOBAL_ACCOUNT: Account(GLOBAL_ACCOUNT)}
        self.global_account = self.accounts[GLOBAL_ACCOUNT]
        self.clients: dict[int, Client] = {}  # network clients only
        self._cid = 0
        self._system_client: Client | None = None
        self.cluster: Any = None  # node.cluster.Cluster when a cluster port is configured
        self.auth = _optional_auth(options)
        self.router: Router | None = None
        self.router = self._build_accounts(options)
        self.auth_throttle: AuthThrottle[Any] = AuthThrottle(AUTH_WORKERS)
        self.auth_checks: dict[bytes, Any] = {}  # node.client._PendingCheck by digest
        self.auth_held_bytes = 0  # read past CONNECTs waiting for checks (node.client._hold)
        self.auth_workers = concurrent.futures.ThreadPoolExecutor(
            AUTH_WORKERS, thread_name_prefix="auth")
        self.tls_ctx = _optional_tls(options)
        self.tls_first = bool(options.tls and options.tls.handshake_first)
        self.start_time = time.time()
        self.total_connections = 0
        self.slow_consumers = 0
        self.stale_connections = 0
        # Counters of connections already gone, so totals survive closes.
        self.closed_stats = [0, 0, 0, 0]  # in_msgs, in_bytes, out_msgs, out_bytes
        self.account_closed: dict[str, list[int]] = {}  # the same, per account (/accstatz)
        self.internal_stats = [0, 0]  # in_msgs, in_bytes published by the server
        self.http_req_stats: dict[str, int] = {}
        self.port = 0
        self.http_port = 0
        self.ws_port = 0
        self.lame_duck = False
        self._listeners: list[asyncio.AbstractServer] = []
        self._monitor: asyncio.AbstractServer | None = None
        self._done: asyncio.Future[int] | None = None
        self._ports_file: str | None = None
        self.services: list[Any] = []  # objects with async stop(), closed at shutdown
        self.jetstream: Any = None  # node.jetstream.service.JetStreamService with -js
        self.system: SystemService | None = None  # $SYS requests and events
        self._ready = False  # start() finished: a reload may run

    # ------------------------------------------------------------------ registry

    def next_cid(self) -> int:
        self._cid += 1
        return self._cid

    def lookup_account(self, name: str) -> Account:
        account = self.accounts.get(name)
        if account is None:
            # Authentication only names accounts the configuration defines.
            raise KeyError(f"unknown account {name!r}")
        return account

    def _build_accounts(self, options: Options) -> Router | None:
        """One Account per `accounts {}` entry (and the system account), each
        with its limits and mappings; a Router for those that need one."""
        conf = options.accounts
        if conf is None:
            # No config file: nats-server still has its system account ($SYS).
            conf = options.accounts = AccountsConfig()
        for name, acc in conf.accounts.items():
            self.register_account(Account(name, acc.limits, acc.mappings or None))
        if not conf.no_system_account and conf.system_account not in self.accounts:
            self.register_account(Account(conf.system_account))
        self.global_account.mappings = conf.global_mappings or None
        return self._wire_router(conf)

    def _wire_router(self, conf: AccountsConfig) -> Router | None:
        """A Router for the accounts that need one (others keep the fast path)."""
        js = self.options.jetstream
        dom = js.domain if js.enabled else ""
        router = Router(conf, self.accounts, self.options.cluster.name or None,
                        domain_table=domain.mapping_table(dom))
        if self.router is not None:
            router.responses = self.router.responses  # requests in flight keep their way back
        used = False
        for account in self.accounts.values():
            account.router = router if router.needs_router(account.name) else None
            # With a domain, an account that needs no router otherwise sends only the
            # subjects under the domain's prefix through it (its fast path stays).
            only_domain = bool(dom) and account.router is None
            account.domain_prefix = domain.api_prefix(dom) + "." if only_domain else None
            account.domain_router = router if only_domain else None
            # Account-level message tracing (`msg_trace`), read by Client._on_pub.
            acc_conf = conf.accounts.get(account.name)
            account.msg_trace = acc_conf.msg_trace if acc_conf is not None else None
            used = used or account.router is not None or account.domain_router is not None
        return router if used else None

    def refresh_operator_account(self, key: str) -> None:
        """Operator mode: the resolver stored a new JWT for account `key`. Its
        Account takes the new limits, exports, imports and mappings, and every
        connected user of it is checked again (revoked or expired ones go)."""
        conf = self.options.accounts
        claims = self.auth.resolver.lookup(key, time.time())
        if claims is None or conf is None:
            return
        acc_conf = account_config_from_claims(claims)
        conf.accounts[key] = acc_conf
        account = self.accounts.get(key)
        if account is None:
            account = Account(key)
            self.register_account(account)
            self.auth.accounts.add(key)
        account.set_limits(acc_conf.limits, acc_conf.mappings or None)
        self._jetstream_account(key)
        now = time.time()
        apply_activations(conf, lambda k: self.auth.resolver.lookup(k, now), now)
        self.router = self._wire_router(conf)
        if self.cluster is not None:
            self.cluster.announce_response_interest()
        if self.system is not None:
            self.system.accounts_changed()
        for client in list(self.clients.values()):
            client.account_changed(account)
        self._enforce_connection_limit(account)

    def _enforce_connection_limit(self, account: Account) -> None:
        """A lowered `conn` limit closes the connections over it, newest first,
        as nats-server does."""
        limit = account.max_connections
        if limit < 0 or account.connections <= limit:
            return
        members = sorted((c for c in self.clients.values()
                          if c.account is account and c.connected_to_account and not c.closed),
                         key=lambda c: (c.start, c.cid), reverse=True)
        for client in members[:account.connections - limit]:
            client.over_account_limit()

    def rebuild_accounts(self, options: Options) -> None:
        """Config reload: accounts take the new config's limits and mappings,
        new ones appear, removed ones go (their clients were closed by the
        re-check or are about to be), and the router is rebuilt."""
        conf = options.accounts
        if conf is None:
            return
        keep = {GLOBAL_ACCOUNT, *conf.accounts}
        if not conf.no_system_account:
            keep.add(conf.system_account)
        for name in [n for n in self.accounts if n not in keep]:
            del self.accounts[name]
        for name, acc in conf.accounts.items():
            account = self.accounts.get(name)
            if account is None:
                self.register_account(Account(name, acc.limits, acc.mappings or None))
            else:
                account.set_limits(acc.limits, acc.mappings or None)
                self._jetstream_account(name)
        if not conf.no_system_account and conf.system_account not in self.accounts:
            self.register_account(Account(conf.system_account))
        self.global_account.mappings = conf.global_mappings or None
        self.router = self._wire_router(conf)
        if self.cluster is not None:  # the rebuilt router's reply interest goes to peers
            self.cluster.announce_response_interest()

    def reload_config(self) -> str | None:
        """Re-read the config (node/reload.py); None when applied, else why not."""
        return Reloader(self).reload()

    def register_account(self, account: Account) -> None:
        """Add a configured account (its name must be new)."""
        assert account.name not in self.accounts, f"account {account.name!r} registered twice"
        self.accounts[account.name] = account
        if self.cluster is not None:
            self.cluster.attach_account(account)
        self._jetstream_account(account.name)

    def _jetstream_account(self, name: str) -> None:
        """JetStream is per account: a new or changed account gets (or loses) its own
        `$JS.API` and limits (node/jetstream/jsaccount.py)."""
        js = getattr(self, "jetstream", None)  # None until JetStream started
        if js is not None:
            js.account_added(name)

    @property
    def sublist(self) -> SubList:
        """The global account's sublist (what /subsz shows today)."""
        return self.global_account.sublist

    def subscription_count(self) -> int:
        return sum(a.subscription_count() for a in self.accounts.values())

    def register(self, client: Client) -> bool:
        """False when the connection must be refused (limit reached)."""
        if len(self.clients) >= self.options.max_connections:
            return False
        self.clients[client.cid] = client
        self.total_connections += 1
        return True

    def unregister(self, client: Client, reason: str) -> None:
        if self.clients.pop(client.cid, None) is None:
            return
        if self.system is not None:
            auth_failed = not client.connected and reason == AUTH_VIOLATION
            if client.announced or auth_failed:
                self.system.client_closed(client, reason, auth_failed)
        for st in (self.closed_stats,
                   self.account_closed.setdefault(client.account.name, [0, 0, 0, 0])):
            st[0] += client.in_msgs
            st[1] += client.in_bytes
            st[2] += client.out_msgs
            st[3] += client.out_bytes
        self.log.debug(f"{client.host}:{client.port} - cid:{client.cid} - "
                       f'"{reason}" - connection closed')

    def make_client_protocol(self, conn_type: str = CONN_STANDARD) -> Client:
        """A fresh protocol object per connection (TCP, TLS or WebSocket)."""
        assert conn_type in (CONN_STANDARD, CONN_WEBSOCKET), conn_type
        return Client(self, Kind.CLIENT, conn_type)

    # ------------------------------------------------------------------ internal API

    def internal_client(self, kind: Kind, name: str, account: str = GLOBAL_ACCOUNT) -> Client:
        """A client inside the server (needs the running loop)."""
        client = Client.internal(self, kind, name, self.lookup_account(account))
        self.services.append(_InternalClientService(client))
        return client

    @property
    def system_client(self) -> Client:
        if self._system_client is None:
            self._system_client = self.internal_client(Kind.SYSTEM, "system")
        return self._system_client

    def subscribe_internal(self, subject: str, callback: InternalCallback,
                           queue: str | None = None) -> Subscription:
        """Subscribe the system client; `callback` runs from the loop, after the
        publisher's turn (see Client.subscribe_internal)."""
        return self.system_client.subscribe_internal(subject, callback, queue)

    def unsubscribe_internal(self, sub: Subscription) -> None:
        sub.client.remove_sub(sub)

    def publish_internal(self, subject: str, reply: str | None, payload: bytes,
                         headers: bytes | None = None) -> int:
        """Publish as the server's system client; returns deliveries."""
        self.internal_stats[0] += 1
        self.internal_stats[1] += len(payload)
        return self.system_client.publish(subject, reply, payload, headers)

    # ------------------------------------------------------------------ INFO

    def info_for(self, client: Client) -> dict[str, Any]:
        o = self.options
        info: dict[str, Any] = {
            "server_id": self.server_id, "server_name": self.server_name,
            "version": VERSION, "proto": 1, "go": GO_VERSION, "host": o.host,
            "port": self.port, "headers": True, "max_payload": o.max_payload,
        }
        if self.auth is not None and self.auth.required:
            info["auth_required"] = True
        if self.tls_ctx is not None:
            if client.conn_type == CONN_STANDARD:
                info.update(tls.info_fields(o.tls))
            else:
                info["tls_available"] = True
        # "jetstream" only when the JetStream API answers (nats-server's field order).
        if self.jetstream is not None:
            info["jetstream"] = True
        info["client_id"] = client.cid
        if client.host:
            info["client_ip"] = client.host
        if self.cluster is not None and self.cluster.name:
            info["cluster"] = self.cluster.name
        if self.jetstream is not None and o.jetstream.domain:
            info["domain"] = o.jetstream.domain  # between cluster and connect_urls, as nats-server
        if self.cluster is not None:
            urls, ws_urls = self.cluster.connect_urls()
            if client.conn_type == CONN_WEBSOCKET:
                if ws_urls:
                    info["ws_connect_urls"] = ws_urls
            elif urls:
                info["connect_urls"] = urls
        if self.jetstream is not None:
            info["api_lvl"] = JS_API_LEVEL
        return info

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Bind every listener; raises OSError when one cannot be bound."""
        o = self.options
        self.log.info("Starting jetraft")
        self.log.info(f"  Version:  {VERSION}")
        self.log.info(f"  Name:     {self.server_name}")
        self.log.info(f"  ID:       {self.server_id}")
        if o.config_file:
            self.log.info(f"Using configuration file: {o.config_file}")
        self._refuse_unenforced()
        if o.cluster.port:
            await self._start_cluster()
        if o.jetstream.enabled:
            await self._start_jetstream()
        for block in o.unsupported:
            self.log.warn(f"Configuration block {block!r} is not supported by jetraft; ignored")
        if o.default_permissions is not None and (o.user or o.token):
            self.log.warn("authorization permissions apply to the users list only: "
                          "a single user or token gets none (as in nats-server)")
        if o.pid_file:
            with open(o.pid_file, "w") as f:
                f.write(str(os.getpid()))
        if o.http_port:
            await self._start_monitor()
        if o.websocket is not None and o.websocket.port:
            await self._start_websocket()
        self._start_claims_service()
        self._start_system_service()
        # Clients last: once the client port answers, every other listener is up too.
        await self._start_clients()
        if self.cluster is not None:
            self._advertise_client_urls()
        self._write_ports_file()
        self.log.info("Server is ready")

    async def _start_jetstream(self) -> None:
        from node.jetstream.service import JetStreamService  # lmdb and raft: only with -js

        service = JetStreamService(self)
        try:
            await service.start()
        except Exception as err:
            from node.jetstream.errors import StartRefused

            if isinstance(err, StartRefused):
                raise
            raise ValueError(f"JetStream could not start: {err!r}") from err
        self.services.insert(0, service)  # stopped first: its last fsyncs while clients wait
        self.jetstream = service

    async def _start_cluster(self) -> None:
        from node.cluster import Cluster  # grpc: only with a cluster port

        cluster = Cluster(self)
        self.cluster = cluster
        self.services.append(cluster)  # stopped after JetStream, whose Raft uses its port
        await cluster.start()
        for account in self.accounts.values():
            cluster.attach_account(account)

    def _advertise_client_urls(self) -> None:
        from node.cluster.wire import public_host

        cluster_host = self.cluster.members()[self.cluster.self_id].cluster_addr.rpartition(":")[0]
        host = public_host(self.options.host, cluster_host)
        urls = [f"{host}:{self.port}"]
        ws_urls = []
        if self.ws_port and self.options.websocket is not None:
            ws_urls = [f"{public_host(self.options.websocket.host, cluster_host)}:{self.ws_port}"]
        self.cluster.set_client_urls(urls, ws_urls)

    def cluster_urls_changed(self) -> None:
        """Members joined or left: clients that take async INFO learn the new
        connect_urls (cluster discovery), as nats-server sends them."""
        if self.lame_duck:
            return
        for client in list(self.clients.values()):
            client.send_info_update()

    def _start_claims_service(self) -> None:
        """Operator mode with a full resolver: claim updates over $SYS."""
        cfg = self.options.operator
        conf = self.options.accounts
        if cfg is None or cfg.resolver is None or cfg.resolver.kind != "full" or conf is None:
            return
        ClaimsService(self, conf.system_account).start()

    def _start_system_service(self) -> None:
        """$SYS requests and events, in the system account (none without one)."""
        conf = self.options.accounts
        if conf is None or conf.no_system_account or conf.system_account not in self.accounts:
            return
        self.system = SystemService(self, conf.system_account)
        self.system.start()
        self.services.insert(0, self.system)  # its SHUTDOWN event goes out first

    def _refuse_unenforced(self) -> None:
        """Security settings fail closed: one we cannot enforce stops the node."""
        unenforced = self.options.unenforced
        if unenforced:
            names = ", ".join(repr(k) for k in unenforced)
            raise ValueError(f"security configuration not enforced by jetraft yet: {names}; "
                             "refusing to start without it")

    def http_host(self) -> str:
        """The monitor listens where clients do unless told otherwise (nats-server)."""
        return self.options.http_host or self.options.host

    async def _start_monitor(self) -> None:
        o = self.options
        host = self.http_host()
        port = 0 if o.http_port < 0 else o.http_port
        self.log.info(f"Starting http monitor on {host}:{port or '...'}")
        try:
            self._monitor = await start_monitor(self, host, port)
        except OSError as err:
            msg = f'Error listening on monitor port: {host}:{port}, "{err}"'
            raise OSError(msg) from err
        self.http_port = self._monitor.sockets[0].getsockname()[1]

    async def _start_clients(self) -> None:
        o = self.options
        loop = asyncio.get_running_loop()
        port = 0 if o.port < 0 else o.port
        ssl = self.tls_ctx if self.tls_first else None
        # handshake_first: asyncio runs the handshake before the client exists; tls
        # { timeout } bounds it (asyncio's own default is 60 s per silent socket).
        hs_timeout = o.tls.timeout if ssl is not None and o.tls is not None else None
        try:
            srv = await loop.create_server(
                lambda: Client(self, Kind.CLIENT, CONN_STANDARD), o.host, port,
                reuse_address=True, backlog=1024, ssl=ssl, ssl_handshake_timeout=hs_timeout)
        except OSError as err:
            raise OSError(f"Error listening on port: {o.host}:{port}, \"{err}\"") from err
        self._listeners.append(srv)
        self.port = srv.sockets[0].getsockname()[1]
        self.log.info(f"Listening for client connections on {o.host}:{self.port}")

    async def _start_websocket(self) -> None:
        ws = self.options.websocket
        srv = await start_websocket(self, ws)
        self._listeners.append(srv)
        self.ws_port = srv.sockets[0].getsockname()[1]
        scheme = "ws" if ws.no_tls or ws.tls is None else "wss"
        self.log.info(f"Listening for websocket clients on {scheme}://{ws.host}:{self.ws_port}")

    def _write_ports_file(self) -> None:
        d = self.options.ports_file_dir
        if not d:
            return
        host = self.options.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"  # the only address we hand out
        ports: dict[str, list[str]] = {"nats": [f"nats://{host}:{self.port}"]}
        if self.http_port:
            ports["monitoring"] = [f"http://{host}:{self.http_port}"]
        if self.ws_port:
            ports["websocket"] = [f"ws://{host}:{self.ws_port}"]
        exe = os.path.basename(sys.argv[0]) or "jetraft"
        path = os.path.join(d, f"{exe}_{os.getpid()}.ports")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(ports, f)
        os.replace(tmp, path)  # readers never see a half-written file
        self._ports_file = path

    async def serve(self) -> int:
        """Start, then block until shutdown. Returns the exit code."""
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        # Before start: a SIGTERM right after "Server is ready" must find its handler.
        self._install_signals(loop)
        try:
            await self.start()
        except (OSError, ValueError) as err:
            self.log.fatal(str(err))
            await self._close_everything()
            return 1
        self._ready = True
        code = await self._done
        await self._close_everything()
        self.log.info("Server Exiting..")
        self.log.close()
        return code

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        names = {signal.SIGTERM: "terminated", signal.SIGINT: "interrupt"}
        for sig, name in names.items():
            loop.add_signal_handler(sig, self._on_stop_signal, name)
        loop.add_signal_handler(signal.SIGUSR2, self._on_ldm_signal)
        loop.add_signal_handler(signal.SIGHUP, self._on_reload_signal)

    def _on_reload_signal(self) -> None:
        self.log.info('Trapped "hangup" signal')
        if not self._ready:
            self.log.error("Failed to reload server configuration: server is still starting")
            return
        self.reload_config()

    def _on_stop_signal(self, name: str) -> None:
        self.log.info(f'Trapped "{name}" signal')
        self.shutdown()

    def _on_ldm_signal(self) -> None:
        self.log.info('Trapped "user defined signal 2" signal')
        if not self.lame_duck:
            asyncio.get_running_loop().create_task(self.lame_duck_mode())

    def shutdown(self, code: int = 0) -> None:
        if self._done is not None and not self._done.done():
            self.log.info("Initiating Shutdown...")
            self._done.set_result(code)

    async def lame_duck_mode(self) -> None:
        """Stop accepting, tell clients, then close them gradually."""
        o = self.options
        self.lame_duck = True
        self.log.info("Entering lame duck mode, stop accepting new clients")
        if self.cluster is not None:
            await self.cluster.enter_lame_duck()
        self._close_listeners()
        for client in list(self.clients.values()):
            client.send_lame_duck_info()
        grace = min(o.lame_duck_grace_period, o.lame_duck_duration)
        await asyncio.sleep(grace)
        clients = list(self.clients.values())
        self.log.info("Closing existing clients")
        spread = max(o.lame_duck_duration - grace, 0.0)
        if clients:
            await self._close_gradually(clients, spread)
        self.shutdown()

    async def _close_gradually(self, clients: list[Client], spread: float) -> None:
        # One batch per millisecond at most; asyncio cannot sleep finer.
        steps = max(1, min(len(clients), int(spread * 1000)))
        batch = math.ceil(len(clients) / steps)
        pause = spread / steps
        for i in range(0, len(clients), batch):
            for client in clients[i:i + batch]:
                client.close("Server Shutdown")
            await asyncio.sleep(pause)

    def _close_listeners(self) -> None:
        for srv in self._listeners:
            srv.close()
        self._listeners.clear()

    async def _close_everything(self) -> None:
        self._close_listeners()
        for service in self.services:
            try:
                await service.stop()
            except Exception as err:  # noqa: BLE001 - shutdown must go on
                self.log.error(f"Error stopping {service!r}: {err}")
        for client in list(self.clients.values()):
            client.close("Server Shutdown")
        if self._monitor is not None:
            self._monitor.close()
        self.auth_workers.shutdown(wait=False, cancel_futures=True)
        await asyncio.sleep(0.05)  # let transports hand their last bytes to the kernel
        if self._ports_file:
            try:
                os.remove(self._ports_file)
            except OSError:
                pass

    # ------------------------------------------------------------------ stats

    def totals(self) -> dict[str, int]:
        """Message counters over all connections, live and closed."""
        in_msgs, in_bytes, out_msgs, out_bytes = self.closed_stats
        for c in self.clients.values():
            in_msgs += c.in_msgs
            in_bytes += c.in_bytes
            out_msgs += c.out_msgs
            out_bytes += c.out_bytes
        return {"in_msgs": in_msgs + self.internal_stats[0],
                "in_bytes": in_bytes + self.internal_stats[1],
                "out_msgs": out_msgs, "out_bytes": out_bytes}


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


# The cyclic collector's first-generation threshold (CPython: 700 net container
# allocations). A publish allocates a few short-lived objects that reference counting
# frees; at 700 the collector ran ~1,000 times per 100k async publishes and took ~8 % of
# the node's CPU (docs/notes/asyncjs.md). Reference cycles are still collected, later.
GC_THRESHOLD = (20_000, 50, 50)


def run(options: Options) -> int:
    """Run a node until it is told to stop; returns the process exit code."""
    gc.set_threshold(*GC_THRESHOLD)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        try:
            server = Server(options)
        except (OSError, ValueError) as err:
            Logger().fatal(str(err))
            return 1
        return runner.run(server.serve())
