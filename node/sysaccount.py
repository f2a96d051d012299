"""The system account's services: `$SYS.REQ.*` requests and `$SYS.*` events.

Everything here lives in the system account's subject space (`system_account`,
`$SYS` by default), so only users of that account can make the requests or
see the events: a user of another account publishing or subscribing to
`$SYS.>` does so in its own account, where nothing answers or arrives. The
one exception is what nats-server itself gives every account (as service
imports from the system account): `$SYS.REQ.SERVER.PING.CONNZ`,
`$SYS.REQ.ACCOUNT.PING.CONNZ`, `$SYS.REQ.ACCOUNT.PING.STATZ` and
`$SYS.REQ.USER.INFO`, each answered with that account's data only. Those are
served by one internal client per account (`_AccountResponder`).

Requests (the JSON is the monitor's, node/monitor.py, in nats-server's
`{"server": {...}, "data": {...}}` envelope):
- `$SYS.REQ.SERVER.PING` (STATSZ) and `$SYS.REQ.SERVER.PING.<KIND>`: every
  node answers once. The subscriptions are plain (no queue group), so once
  routes carry the system account's interest, a request reaches each node
  once and each node replies on the requester's reply subject.
- `$SYS.REQ.SERVER.<server id>.<KIND>`: this node only (plus RELOAD).
- `$SYS.REQ.ACCOUNT.<account>.<KIND>`: CONNZ, SUBSZ, INFO, CONNS, STATZ, JSZ,
  LEAFZ for one account.
Unknown kinds get no reply, as in nats-server.

Events: `$SYS.ACCOUNT.<acc>.CONNECT` / `.DISCONNECT`, the account connection
counts on `$SYS.ACCOUNT.<acc>.SERVER.CONNS` (and the older
`$SYS.SERVER.ACCOUNT.<acc>.CONNS`), `$SYS.SERVER.<id>.CLIENT.AUTH.ERR`,
`$SYS.SERVER.<id>.STATSZ` (periodic) and `$SYS.SERVER.<id>.SHUTDOWN`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import time
from typing import Any

from node import monitor
from node.client import Kind
from node.version import VERSION

# The periodic STATSZ starts fast (a new node shows up at once) and slows down
# to the steady interval, as nats-server's does.
STATSZ_FIRST_INTERVAL = 1.0
STATSZ_INTERVAL = float(os.environ.get("JETRAFT_STATSZ_INTERVAL", "30"))

CONNECT_TYPE = "io.nats.server.advisory.v1.client_connect"
DISCONNECT_TYPE = "io.nats.server.advisory.v1.client_disconnect"
ACCOUNT_CONNS_TYPE = "io.nats.server.advisory.v1.account_connections"
AUTH_FAILURE = "Authentication Failure"

_SERVER_KINDS = ("STATSZ", "VARZ", "CONNZ", "SUBSZ", "ROUTEZ", "HEALTHZ", "JSZ", "ACCOUNTZ",
                 "IDZ", "GATEWAYZ", "LEAFZ")
_ACCOUNT_KINDS = ("CONNZ", "SUBSZ", "INFO", "CONNS", "STATZ", "JSZ", "LEAFZ")


def _event_id() -> str:
    return base64.urlsafe_b64encode(secrets.token_bytes(16)).rstrip(b"=").decode()[:22]


def _options(payload: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """A request's JSON options ({} when empty), or an error text."""
    if not payload.strip():
        return {}, None
    try:
        opts = json.loads(payload)
    except ValueError as err:
        return None, f"invalid JSON in request: {err}"
    if not isinstance(opts, dict):
        return None, "request options must be a JSON object"
    return opts, None


def _connz_query(opts: dict[str, Any], account: str | None) -> dict[str, str]:
    """ConnzOptions (nats-server's JSON names) as a /connz query."""
    q: dict[str, str] = {}
    for key in ("offset", "limit"):
        if isinstance(opts.get(key), int):
            q[key] = str(opts[key])
    if opts.get("subscriptions_detail"):
        q["subs"] = "detail"
    elif opts.get("subscriptions"):
        q["subs"] = "1"
    acc = account or opts.get("acc")
    if isinstance(acc, str) and acc:
        q["acc"] = acc
    return q


def _subsz_query(opts: dict[str, Any], account: str | None) -> dict[str, str]:
    q: dict[str, str] = {}
    for key in ("offset", "limit"):
        if isinstance(opts.get(key), int):
            q[key] = str(opts[key])
    if opts.get("subscriptions") or account:
        q["subs"] = "1"
    acc = account or opts.get("account")
    if isinstance(acc, str) and acc:
        q["acc"] = acc
    return q


def _permissions_json(perms: Any) -> dict[str, Any]:
    """A user's permissions the way nats-server's USER.INFO shows them."""
    if perms is None:
        return {}
    out: dict[str, Any] = {}
    for side, allow, deny in (("publish", perms.publish_allow, perms.publish_deny),
                              ("subscribe", perms.subscribe_allow, perms.subscribe_deny)):
        entry = {k: list(v) for k, v in (("allow", allow), ("deny", deny)) if v}
        if entry:
            out[side] = entry
    if perms.allow_responses:
        out["responses"] = {"max": perms.response_max,
                            "ttl": int(perms.response_expires * 1_000_000_000)}
    return out


class SystemService:
    """The system account's internal client, its responders and its events."""

    def __init__(self, server: Any, system_account: str) -> None:
        self.server = server
        self.system_account = system_account
        self.client = server.internal_client(Kind.SYSTEM, "_system", system_account)
        self.seq = 0
        self._statsz_timer: asyncio.TimerHandle | None = None
        self._interval = STATSZ_FIRST_INTERVAL
        self.responders: dict[str, _AccountResponder] = {}
        self.stopped = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        sid = self.server.server_id
        sub = self.client.subscribe_internal
        # One subscription per kind, as nats-server has: a kind nobody serves gets
        # no-responders.
        sub("$SYS.REQ.SERVER.PING", self._on_ping)
        for kind in _SERVER_KINDS:
            sub(f"$SYS.REQ.SERVER.PING.{kind}", self._on_ping_kind)
            sub(f"$SYS.REQ.SERVER.{sid}.{kind}", self._on_server_kind)
        sub(f"$SYS.REQ.SERVER.{sid}.RELOAD", self._on_server_kind)
        sub(f"$SYS.REQ.SERVER.{sid}.KICK", self._on_client_op)
        sub(f"$SYS.REQ.SERVER.{sid}.LDM", self._on_client_op)
        for kind in _ACCOUNT_KINDS:
            sub(f"$SYS.REQ.ACCOUNT.*.{kind}", self._on_account_kind)
        sub("$SYS.REQ.USER.INFO", self._on_user_info)
        self.accounts_changed()
        self._schedule_statsz()

    def accounts_changed(self) -> None:
        """Every non-system account gets its responder (again after a reload)."""
        for name, account in self.server.accounts.items():
            if name != self.system_account and name not in self.responders:
                self.responders[name] = _AccountResponder(self, account)
        for name in [n for n in self.responders if n not in self.server.accounts]:
            self.responders.pop(name).client.close_internal()

    async def stop(self) -> None:
        """Shutdown: the event goes out before the client leaves."""
        if self.stopped:
            return
        self.stopped = True
        if self._statsz_timer is not None:
            self._statsz_timer.cancel()
        # nats-server's shutdown event is the bare server info, without an envelope.
        self._publish(f"$SYS.SERVER.{self.server.server_id}.SHUTDOWN", self.server_info())
        await asyncio.sleep(0)  # let the internal deliveries of the event run
        for responder in self.responders.values():
            responder.client.close_internal()
        self.client.close_internal()

    # ------------------------------------------------------------------ envelope

    def server_info(self) -> dict[str, Any]:
        """The `server` member of every $SYS message (nats-server's ServerInfo)."""
        self.seq += 1
        s = self.server
        info: dict[str, Any] = {"name": s.server_name, "host": s.options.host, "id": s.server_id}
        if s.options.cluster.name:
            info["cluster"] = s.options.cluster.name
        # nats-server's capability bits, set with JetStream: 1 JetStream enabled,
        # 2 binary stream snapshots, 4 account NRG (seen from 2.15.1 with -js: 7).
        flags = 7 if s.jetstream is not None else 0
        info.update({"ver": VERSION, "jetstream": s.jetstream is not None, "flags": flags,
                     "seq": self.seq, "time": monitor.rfc3339(time.time())})
        return info

    def _publish(self, subject: str, body: dict[str, Any], client: Any = None) -> None:
        payload = json.dumps(body).encode()
        s = self.server
        s.internal_stats[0] += 1
        s.internal_stats[1] += len(payload)
        (client or self.client).publish(subject, None, payload)

    def reply(self, reply: str | None, body: dict[str, Any], client: Any = None) -> None:
        if reply:
            self._publish(reply, body, client)

    def data_reply(self, reply: str | None, data: Any, client: Any = None) -> None:
        self.reply(reply, {"server": self.server_info(), "data": data}, client)

    def error_reply(self, reply: str | None, code: int, text: str, client: Any = None,
                    null_data: bool = False) -> None:
        """nats-server's error envelope (its JSZ one also carries `"data": null`)."""
        body: dict[str, Any] = {"server": self.server_info()}
        if null_data:
            body["data"] = None
        body["error"] = {"code": code, "description": text}
        self.reply(reply, body, client)

    # ------------------------------------------------------------------ requests

    def _on_ping(self, sub: Any, subject: str, reply: str | None, headers: bytes | None,
                 payload: bytes) -> None:
        self._serve_server_kind("STATSZ", reply, payload, ping=True)

    def _on_ping_kind(self, sub: Any, subject: str, reply: str | None, headers: bytes | None,
                      payload: bytes) -> None:
        self._serve_server_kind(subject.rsplit(".", 1)[1], reply, payload, ping=True)

    def _on_server_kind(self, sub: Any, subject: str, reply: str | None, headers: bytes | None,
                        payload: bytes) -> None:
        kind = subject.rsplit(".", 1)[1]
        if kind == "RELOAD":
            self._reload(reply)
            return
        self._serve_server_kind(kind, reply, payload, ping=False)

    def _on_client_op(self, sub: Any, subject: str, reply: str | None, headers: bytes | None,
                      payload: bytes) -> None:
        """KICK closes one client, LDM sends it a lame-duck INFO ({"cid": N})."""
        kind = subject.rsplit(".", 1)[1]
        opts, _err = _options(payload)
        if opts is None:
            return  # nats-server does not answer a request it cannot read
        cid = opts.get("cid")
        client = self.server.clients.get(cid) if isinstance(cid, int) else None
        if client is None or client.closed:
            text = "no such client or leafnode id" if kind == "KICK" else "no such client id"
            self.error_reply(reply, 500, text)
            return
        if kind == "KICK":
            self.server.log.info(f"{client.host}:{client.port} - cid:{client.cid} - "
                                 "kicked by a system account request")
            client.close("Kicked")
        else:
            client.send_lame_duck_info()
        self.reply(reply, {"server": self.server_info()})

    def _serve_server_kind(self, kind: str, reply: str | None, payload: bytes,
                           ping: bool) -> None:
        if kind not in _SERVER_KINDS or not reply:
            return
        opts, err = _options(payload)
        if opts is None:
            self.error_reply(reply, 400, err or "bad request")
            return
        if ping and not self._selected(opts):
            return  # a PING filtered to other nodes: only they answer
        s = self.server
        if kind == "IDZ":
            self.reply(reply, {"name": s.server_name, "host": s.options.host, "id": s.server_id})
        elif kind == "STATSZ":
            self.reply(reply, {"server": self.server_info(), "statsz": self.statsz()})
        else:
            self.data_reply(reply, self.server_data(kind, opts, None))

    def _selected(self, opts: dict[str, Any]) -> bool:
        """nats-server's event filter: `cluster` must match when given."""
        cluster = opts.get("cluster")
        return not cluster or cluster == self.server.options.cluster.name

    def server_data(self, kind: str, opts: dict[str, Any], account: str | None) -> Any:
        """The `data` of a server request; `account` scopes CONNZ and SUBSZ."""
        s = self.server
        if kind == "VARZ":
            return monitor.varz(s)
        if kind == "CONNZ":
            return monitor.connz(s, _connz_query(opts, account))
        if kind == "SUBSZ":
            return monitor.subsz(s, _subsz_query(opts, account))
        if kind == "HEALTHZ":
            return {"status": "ok", "status_code": 200}
        if kind == "ACCOUNTZ":
            acc = opts.get("account")
            return monitor.accountz(s, {"acc": acc} if isinstance(acc, str) and acc else {})
        if kind in ("ROUTEZ", "JSZ"):
            return self.endpoint(kind)(s)
        if kind == "GATEWAYZ":
            return {"server_id": s.server_id, "now": monitor.rfc3339(time.time()),
                    "outbound_gateways": {}, "inbound_gateways": {}}
        if kind == "LEAFZ":
            return {"server_id": s.server_id, "now": monitor.rfc3339(time.time()),
                    "leafnodes": 0, "leafs": []}
        raise AssertionError(kind)

    @staticmethod
    def endpoint(kind: str) -> Any:
        """/routez's or /jsz's data: the full ones the routes and JetStream
        branches add to node/monitor.py (`_routez`, `_jsz`) when present, else
        nats-server's shape with nothing in it."""
        full = getattr(monitor, "_routez" if kind == "ROUTEZ" else "_jsz", None)
        if full is not None:
            return lambda server: full(server, {})
        return monitor.routez if kind == "ROUTEZ" else monitor.jsz

    def _on_account_kind(self, sub: Any, subject: str, reply: str | None,
                         headers: bytes | None, payload: bytes) -> None:
        tokens = subject.split(".")
        account, kind = tokens[3], tokens[4]
        if kind not in _ACCOUNT_KINDS or not reply:
            return
        opts, err = _options(payload)
        if opts is None:
            if kind != "CONNS":
                self.error_reply(reply, 400, err or "bad request")
            return
        if account == "PING" and kind == "STATZ":  # every account (CONNZ: an unknown one)
            self.serve_account_kind(kind, None, reply, opts)
            return
        self.serve_account_kind(kind, account, reply, opts)

    def serve_account_kind(self, kind: str, account: str | None, reply: str,
                           opts: dict[str, Any], client: Any = None) -> None:
        """One account's CONNZ, SUBSZ, ... (`account` None: every account)."""
        s = self.server
        known = account is None or account in s.accounts
        if kind == "CONNZ":
            if not known:
                data = {"server_id": "", "now": monitor.rfc3339(time.time()),
                        "num_connections": 0, "total": 0, "offset": 0,
                        "limit": monitor.CONNZ_DEFAULT_LIMIT, "connections": None}
            else:
                data = monitor.connz(s, _connz_query(opts, account))
            self.data_reply(reply, data, client)
        elif kind == "SUBSZ" and known:
            self.data_reply(reply, monitor.subsz(s, _subsz_query(opts, account)), client)
        elif kind == "INFO" and account is not None and known:
            self.data_reply(reply, monitor.account_detail(s, account), client)
        elif kind == "CONNS" and account is not None and known:
            self.reply(reply, self._account_conns(account), client)
        elif kind == "STATZ":
            names = [account] if account is not None else opts.get("accounts") or []
            q = {"accounts": ",".join(n for n in names if isinstance(n, str))}
            if account is not None or opts.get("include_unused"):
                q["unused"] = "1"
            self.data_reply(reply, monitor.accstatz(s, q), client)
        elif kind == "JSZ" and known:
            if s.jetstream is None:
                self.error_reply(reply, 500, "jetstream not enabled", client, null_data=True)
            elif account is None:
                self.data_reply(reply, self.endpoint("JSZ")(s), client)
            elif s.jetstream.limits.get(account) is None:  # nats-server's wording
                self.error_reply(reply, 500, f'account "{account}" not jetstream enabled',
                                 client, null_data=True)
            else:  # the account's own entry of /jsz's account_details (2.15.1)
                from node.jetstream.jszdetail import account_detail

                self.data_reply(reply, account_detail(s.jetstream, account), client)
        elif kind == "LEAFZ" and known:
            self.data_reply(reply, {"server_id": s.server_id, "now": monitor.rfc3339(time.time()),
                                    "leafnodes": 0, "leafs": []}, client)

    def _on_user_info(self, sub: Any, subject: str, reply: str | None, headers: bytes | None,
                      payload: bytes) -> None:
        self.user_info(self.system_account, reply)

    def user_info(self, account: str, reply: str | None, client: Any = None) -> None:
        """Who sent the request: the one network client of `account` whose
        subscription takes the reply (a request's inbox is its own)."""
        if not reply:
            return
        acc = self.server.accounts.get(account)
        if acc is None:
            return
        result = acc.sublist.match(reply)
        senders = {sub.client for sub in result.psubs if sub.client.kind is Kind.CLIENT}
        for members in result.qsubs.values():
            senders.update(sub.client for sub in members if sub.client.kind is Kind.CLIENT)
        if len(senders) != 1:
            return  # nobody, or several clients share the inbox: no answer rather than a guess
        sender = senders.pop()
        data: dict[str, Any] = {"user": sender.user or "", "account": account,
                                "account_name": account}
        perms = getattr(sender.identity, "permissions", None)
        shown = _permissions_json(getattr(perms, "source", None))
        if shown:
            data["permissions"] = shown
        self.data_reply(reply, data, client)

    def _reload(self, reply: str | None) -> None:
        """`$SYS.REQ.SERVER.<id>.RELOAD`: the same as SIGHUP."""
        err = self.server.reload_config()
        if err is None:
            self.reply(reply, {"server": self.server_info()})
        else:
            self.error_reply(reply, 500, err)

    # ------------------------------------------------------------------ statistics

    def statsz(self) -> dict[str, Any]:
        s = self.server
        t = s.totals()
        active = sum(1 for a in s.accounts.values() if a.connections > 0)
        sent = {"msgs": t["out_msgs"], "bytes": t["out_bytes"]}
        received = {"msgs": t["in_msgs"], "bytes": t["in_bytes"]}
        return {"start": monitor.rfc3339(s.start_time), "mem": monitor.mem_rss(),
                "cores": os.cpu_count() or 1, "cpu": monitor.cpu_percent(),
                "connections": len(s.clients), "total_connections": s.total_connections,
                "active_accounts": active, "subscriptions": s.subscription_count(),
                "sent": sent, "sent_to_clients": dict(sent), "received": received,
                "received_from_clients": dict(received), "slow_consumers": s.slow_consumers,
                "active_servers": 1 + self._peers_up(), "gomaxprocs": os.cpu_count() or 1}

    def _peers_up(self) -> int:
        cluster = getattr(self.server, "cluster", None)
        if cluster is None:
            return 0
        try:
            return sum(1 for m in cluster.members().values()
                       if m.up and m.peer_id != cluster.self_id)
        except Exception:  # noqa: BLE001 - statistics must not break on a cluster hiccup
            return 0

    def _schedule_statsz(self) -> None:
        loop = asyncio.get_running_loop()
        self._statsz_timer = loop.call_later(self._interval, self._statsz_tick)

    def _statsz_tick(self) -> None:
        if self.stopped:
            return
        self._publish(f"$SYS.SERVER.{self.server.server_id}.STATSZ",
                      {"server": self.server_info(), "statsz": self.statsz()})
        self._interval = min(self._interval * 2, STATSZ_INTERVAL)
        self._schedule_statsz()

    def _account_conns(self, account: str) -> dict[str, Any]:
        body: dict[str, Any] = {"type": ACCOUNT_CONNS_TYPE, "id": _event_id(),
                                "timestamp": monitor.rfc3339(time.time()),
                                "server": self.server_info()}
        body.update(monitor.account_statz(self.server, self.server.accounts[account]))
        return body

    # ------------------------------------------------------------------ events

    def _client_info(self, client: Any, closing: bool) -> dict[str, Any]:
        acc = client.account.name
        info: dict[str, Any] = {"start": monitor.rfc3339(client.start), "host": client.host,
                                "id": client.cid, "acc": acc}
        user = client.user or client.opts.get("user")  # a failed login: the name it gave
        if user and isinstance(user, str):
            info["user"] = user
        for key, opt in (("name", "name"), ("lang", "lang"), ("ver", "version")):
            value = client.opts.get(opt)
            if value:
                info[key] = value
        if closing:
            info["rtt"] = int(client.rtt * 1e9)
            info["stop"] = monitor.rfc3339(time.time())
        info.update({"name_tag": acc, "kind": client.kind.value,
                     "client_type": "websocket" if client.conn_type == "WEBSOCKET" else "nats"})
        return info

    def _wanted(self, *subjects: str) -> bool:
        """Someone in the system account (here, or on a peer once routes exist)
        listens on one of `subjects`: events nobody wants are not even built,
        so connection storms do not pay for JSON nobody reads."""
        account = self.client.account
        has_interest = getattr(account, "has_interest", None)
        for subject in subjects:
            if has_interest is not None:
                if has_interest(subject):
                    return True
                continue
            result = account.sublist.match(subject)
            if result.psubs or result.qsubs:
                return True
        return False

    def client_connected(self, client: Any) -> None:
        """A network client passed CONNECT: its account's CONNECT event."""
        if self.stopped:
            return
        acc = client.account.name
        if not self._wanted(f"$SYS.ACCOUNT.{acc}.CONNECT", f"$SYS.ACCOUNT.{acc}.SERVER.CONNS",
                            f"$SYS.SERVER.ACCOUNT.{acc}.CONNS"):
            return
        self._publish_conns(acc)
        self._publish(f"$SYS.ACCOUNT.{acc}.CONNECT", {
            "type": CONNECT_TYPE, "id": _event_id(), "timestamp": monitor.rfc3339(time.time()),
            "server": self.server_info(), "client": self._client_info(client, False)})

    def client_closed(self, client: Any, reason: str, auth_failed: bool) -> None:
        """A network client went away: DISCONNECT for one that had connected,
        AUTH.ERR (and a DISCONNECT, as nats-server sends) for a failed login."""
        if self.stopped:
            return
        acc = client.account.name
        sid = self.server.server_id
        if not self._wanted(f"$SYS.ACCOUNT.{acc}.DISCONNECT", f"$SYS.ACCOUNT.{acc}.SERVER.CONNS",
                            f"$SYS.SERVER.ACCOUNT.{acc}.CONNS",
                            f"$SYS.SERVER.{sid}.CLIENT.AUTH.ERR"):
            return
        # "server" is filled per message (each has its own seq); placed here for
        # nats-server's key order.
        body = {"type": DISCONNECT_TYPE, "id": _event_id(),
                "timestamp": monitor.rfc3339(time.time()), "server": None,
                "client": self._client_info(client, True),
                # Counted from the client's side, as nats-server does.
                "sent": {"msgs": client.in_msgs, "bytes": client.in_bytes},
                "received": {"msgs": client.out_msgs, "bytes": client.out_bytes},
                "reason": AUTH_FAILURE if auth_failed else reason}
        if auth_failed:
            body["server"] = self.server_info()
            self._publish(f"$SYS.SERVER.{self.server.server_id}.CLIENT.AUTH.ERR", body)
        else:
            self._publish_conns(acc)
        body = {**body, "id": _event_id(), "server": self.server_info()}
        self._publish(f"$SYS.ACCOUNT.{acc}.DISCONNECT", body)

    def _publish_conns(self, account: str) -> None:
        if account not in self.server.accounts:
            return
        body = self._account_conns(account)
        self._publish(f"$SYS.SERVER.ACCOUNT.{account}.CONNS", body)
        self._publish(f"$SYS.ACCOUNT.{account}.SERVER.CONNS",
                      {**body, "server": self.server_info()})


class _AccountResponder:
    """The system services every account has (nats-server imports them from
    the system account): answered with this account's data only."""

    def __init__(self, service: SystemService, account: Any) -> None:
        self.service = service
        self.account = account.name
        self.client = service.server.internal_client(Kind.ACCOUNT, f"_sys_{account.name}",
                                                     account.name)
        for local, kind, _tmpl, _share in monitor.SYSTEM_ACCOUNT_IMPORTS:
            self.client.subscribe_internal(local, self._handler(kind))

    def _handler(self, kind: str) -> Any:
        def on_request(sub: Any, subject: str, reply: str | None, headers: bytes | None,
                       payload: bytes) -> None:
            if not reply or self.service.stopped:
                return
            if kind == "USERINFO":
                self.service.user_info(self.account, reply, self.client)
                return
            opts, err = _options(payload)
            if opts is None:
                self.service.error_reply(reply, 400, err or "bad request", self.client)
                return
            self.service.serve_account_kind(kind, self.account, reply, opts, self.client)
        return on_request
