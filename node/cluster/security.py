"""Who may talk to the cluster port: cluster authorization and mutual TLS.

Every RPC on the cluster port (Route and Raft alike) passes the server
interceptor: without the configured user/password or token in its metadata
it is refused before any handler runs. With `cluster { tls }` the port only
completes a TLS handshake with a client certificate signed by the cluster
CA. A node that is not a member can therefore neither gossip, route, nor send
a Raft message. Outgoing calls carry this node's credentials: a route URL's
`user:pass@`, else the node's own authorization settings.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import bcrypt
import grpc

from node.options import ClusterOptions

AUTH_KEY = "x-jetraft-route-auth"
PROVE_METHOD = "/jetraft.cluster.Route/Prove"  # needs no credentials (see ProveMsg)

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.keepalive_time_ms", 5_000),
    ("grpc.keepalive_timeout_ms", 3_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 5_000),
    ("grpc.keepalive_timeout_ms", 3_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 1_000),
    # A connection that has not finished its TLS and HTTP/2 handshake within this time is
    # dropped (gRPC's default is 120 s; measured 60 s: a stranger's silent socket held a
    # descriptor that long). nats-server's route port drops one after 2 s.
    ("grpc.server_handshake_timeout_ms", 5_000),
]


def credentials_text(user: str | None, password: str | None, token: str | None) -> str | None:
    if token:
        return "token " + token
    if user:
        return f"user {user}:{password or ''}"
    return None


class Authorizer:
    """The check every incoming call's metadata must pass."""

    def __init__(self, c: ClusterOptions) -> None:
        self.user, self.password, self.token = c.user, c.password, c.token
        self._ok_bcrypt: set[bytes] = set()  # presented secrets already checked
        self.refused = 0

    @property
    def required(self) -> bool:
        return bool(self.user or self.token)

    def _secret(self) -> bytes:
        return (self.token or f"{self.user}:{self.password or ''}").encode()

    def prove(self, nonce: bytes, addr: str) -> bytes:
        """This node's proof that it knows the cluster secret (see ProveMsg)."""
        if not self.required:
            return b""
        msg = b"jetraft-route-accept|" + nonce + b"|" + addr.encode()
        return hmac.new(self._secret(), msg, hashlib.sha256).digest()

    def check_proof(self, nonce: bytes, addr: str, proof: bytes) -> bool:
        return hmac.compare_digest(self.prove(nonce, addr), proof)

    def allows(self, presented: str | None) -> bool:
        if not self.required:
            return True
        if not presented:
            return False
        if self.token:
            return presented.startswith("token ") and hmac.compare_digest(
                presented[6:].encode(), self.token.encode())
        if not presented.startswith("user "):
            return False
        user, _, password = presented[5:].partition(":")
        if not hmac.compare_digest(user.encode(), (self.user or "").encode()):
            return False
        want = self.password or ""
        if want.startswith("$2"):
            key = presented.encode()
            if key in self._ok_bcrypt:
                return True
            ok = bcrypt.checkpw(password.encode(), want.encode())
            if ok:
                self._ok_bcrypt.add(key)
            return ok
        return hmac.compare_digest(password.encode(), want.encode())


def _refusing(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A refused call is answered from its headers: the handler takes the request
    as a stream it never reads, so its body (up to max_receive_message_length,
    64 MiB) is never buffered (a unary handler would have gRPC read it whole first)."""
    async def deny(requests: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "cluster authorization failed")

    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny)
    return grpc.stream_unary_rpc_method_handler(deny)


# Prove needs no credentials, so anyone may call it: its request is read by us (a
# stream), PROVE_AT_ONCE at a time, each within PROVE_READ_TIMEOUT, so strangers can
# make the node buffer at most PROVE_AT_ONCE messages, not one per call they open.
PROVE_AT_ONCE = 2
PROVE_READ_TIMEOUT = 3.0


def _bounded_prove(handler: grpc.RpcMethodHandler, gate: asyncio.Semaphore
                   ) -> grpc.RpcMethodHandler:
    async def first(requests: Any) -> Any:
        async with gate:
            async for request in requests:
                return request
        return None

    async def prove(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            request = await asyncio.wait_for(first(requests), PROVE_READ_TIMEOUT)
        except TimeoutError:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many proofs at once")
        if request is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no ProveMsg")
        return await handler.unary_unary(request, context)

    return grpc.stream_unary_rpc_method_handler(
        prove, request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, auth: Authorizer, on_refused: Callable[[str], None]) -> None:
        self.auth = auth
        self.on_refused = on_refused
        self._prove_gate = asyncio.Semaphore(PROVE_AT_ONCE)

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is not None and details.method == PROVE_METHOD \
                and not handler.request_streaming:
            return _bounded_prove(handler, self._prove_gate)
        if handler is None or not self.auth.required:
            return handler
        presented = None
        for key, value in details.invocation_metadata or ():
            if key == AUTH_KEY:
                presented = value if isinstance(value, str) else value.decode(errors="replace")
        if self.auth.allows(presented):
            return handler
        self.auth.refused += 1
        self.on_refused(details.method)
        return _refusing(handler)


def _with_auth(details: Any, cred: str) -> Any:
    md = list(details.metadata or [])
    md.append((AUTH_KEY, cred))
    return grpc.aio.ClientCallDetails(details.method, details.timeout, md, details.credentials,
                                      details.wait_for_ready)


class _UU(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, cred: str) -> None:
        self.cred = cred

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_auth(details, self.cred), request)


class _SU(grpc.aio.StreamUnaryClientInterceptor):
    def __init__(self, cred: str) -> None:
        self.cred = cred

    async def intercept_stream_unary(self, continuation: Any, details: Any,
                                     request_iterator: Any) -> Any:
        return await continuation(_with_auth(details, self.cred), request_iterator)


class _SS(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, cred: str) -> None:
        self.cred = cred

    async def intercept_stream_stream(self, continuation: Any, details: Any,
                                      request_iterator: Any) -> Any:
        return await continuation(_with_auth(details, self.cred), request_iterator)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class ChannelMaker:
    """Dialing channels with this node's TLS identity and credentials."""

    def __init__(self, c: ClusterOptions) -> None:
        self.default_cred = credentials_text(c.user, c.password, c.token)
        self.tls = c.tls
        self._creds: grpc.ChannelCredentials | None = None
        if c.tls is not None and c.tls.cert_file and c.tls.key_file and c.tls.ca_file:
            self._creds = grpc.ssl_channel_credentials(
                _read(c.tls.ca_file), private_key=_read(c.tls.key_file),
                certificate_chain=_read(c.tls.cert_file))

    def channel(self, addr: str, separate: bool = False, cred: str | None = None
                ) -> grpc.aio.Channel:
        """`separate`: a TCP connection of its own (not shared with other channels)."""
        options = list(CHANNEL_OPTIONS)
        if separate:
            options.append(("grpc.use_local_subchannel_pool", 1))
        cred = cred or self.default_cred
        interceptors = [_UU(cred), _SU(cred), _SS(cred)] if cred else None
        if self._creds is not None:
            return grpc.aio.secure_channel(addr, self._creds, options=options,
                                           interceptors=interceptors)
        return grpc.aio.insecure_channel(addr, options=options, interceptors=interceptors)

    def raft_channel(self, addr: str, separate: bool) -> grpc.aio.Channel:
        return self.channel(addr, separate)


def server_credentials(c: ClusterOptions) -> grpc.ServerCredentials | None:
    if c.tls is None:
        return None
    assert c.tls.cert_file and c.tls.key_file and c.tls.ca_file  # validate_options checked
    return grpc.ssl_server_credentials(
        [(_read(c.tls.key_file), _read(c.tls.cert_file))],
        root_certificates=_read(c.tls.ca_file), require_client_auth=True)
