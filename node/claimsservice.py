"""Operator mode with a full (dir) resolver: the system account's claim
requests. `$SYS.REQ.CLAIMS.UPDATE` and `$SYS.REQ.ACCOUNT.<acc>.CLAIMS.UPDATE`
store an account JWT (node/resolver.py decides and writes it durably) and
then refresh that account at the node; `$SYS.REQ.ACCOUNT.<acc>.CLAIMS.LOOKUP`
answers the stored JWT. Only clients of the system account can publish on
these subjects: they live in its subject space.
"""

from __future__ import annotations

import json
import time
from typing import Any

from node.client import Kind
from node.resolver import ResolverDiskError, claims_lookup_response, claims_update_response
from node.version import VERSION

UPDATE = "$SYS.REQ.CLAIMS.UPDATE"
ACCOUNT_UPDATE = "$SYS.REQ.ACCOUNT.*.CLAIMS.UPDATE"
ACCOUNT_LOOKUP = "$SYS.REQ.ACCOUNT.*.CLAIMS.LOOKUP"


class ClaimsService:
    """Subscribes an internal client of the system account to the claim subjects."""

    def __init__(self, server: Any, system_account: str) -> None:
        self.server = server
        self.client = server.internal_client(Kind.SYSTEM, "claims", system_account)
        self.seq = 0

    def start(self) -> None:
        self.client.subscribe_internal(UPDATE, self._on_update)
        self.client.subscribe_internal(ACCOUNT_UPDATE, self._on_update)
        self.client.subscribe_internal(ACCOUNT_LOOKUP, self._on_lookup)

    def _on_update(self, sub: Any, subject: str, reply: str | None, headers: bytes | None,
                   payload: bytes) -> None:
        server = self.server
        expected = subject.split(".")[3] if subject != UPDATE else None
        try:
            body = claims_update_response(server.auth.resolver, payload, time.time(), expected)
        except ResolverDiskError as err:
            # Durability rule: after a failed fsync the node stops.
            server.log.error(f"resolver: {err}; stopping")
            server.shutdown(1)
            return
        data = body.get("data")
        if data and data.get("code") == 200:
            server.refresh_operator_account(data["account"])
        if reply:
            self.client.publish(reply, None, json.dumps({"server": self._info(), **body}).encode())

    def _on_lookup(self, sub: Any, subject: str, reply: str | None, headers: bytes | None,
                   payload: bytes) -> None:
        token = claims_lookup_response(self.server.auth.resolver, subject.split(".")[3])
        if reply and token is not None:
            self.client.publish(reply, None, token)

    def _info(self) -> dict[str, Any]:
        """The `server` member nats-server puts in its $SYS replies."""
        self.seq += 1
        s = self.server
        return {"name": s.server_name, "host": s.options.host, "id": s.server_id,
                "ver": VERSION, "seq": self.seq, "jetstream": False,
                "time": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())}
