"""A direct TCP lane for Raft batches: the gRPC Raft stream's payload without gRPC.

Why it exists (an exception to "peers talk gRPC", measured on this 2-core
machine, docs/raft.md "Direct TCP lane"): a 128 B ping-pong over a grpc.aio
bidirectional stream costs p50 ~320 us, the same over asyncio streams ~65 us;
inside a window-1 commit each gRPC direction took 0.4-0.6 ms, because every
received message crosses gRPC's I/O thread and its poller thread before the
event loop sees it. Here the loop reads the socket itself, and once a stream
is up each Batch is decoded and handed on inside the socket's read callback
(no reader task, no loop turn per frame: a window-1 commit crosses two such
hops, each a wake-up of a process that on a loaded machine waits for a core).

Frames are a 4-byte big-endian length and a payload. With cluster
authorization the connection opens with a mutual proof of the cluster secret
(raft/lane_auth.py: the acceptor proves first, the secret never crosses the
wire); without it, the dialer's FIRST frame is an authorization frame
(`AUTH_MAGIC` and a credential text, empty in a cluster without
authorization). The acceptor reads nothing else before that passed, and
closes the connection on a mismatch. Until then a connection may hold at most
`AUTH_MAX_FRAME` bytes and `handshake` seconds (the transport bounds how many
such connections exist at once). Then come serialized `pb.Batch`es: a hello naming the lane
each way, then batches, which the transport checks exactly as it checks gRPC
ones. With TLS both sides present certificates from the cluster CA, the
dialer verifies the acceptor's certificate against the peer's node name and
the acceptor checks that the client certificate names the claimed node.
Snapshots stay on gRPC (their own RPC). A stream object here offers what the
transport uses of a gRPC call: `write`, `read` (returns `grpc.aio.EOF` at the
end), `cancel`; plus `serve(on_batch)`, the callback mode.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import struct
import tempfile
from collections import deque
from collections.abc import Callable

import grpc
from google.protobuf.message import DecodeError

from proto import cluster_pb2 as pb

HEADER = struct.Struct(">I")
# TCP keepalive: a peer behind a partition is noticed like gRPC's keepalive does.
KEEPALIVE_IDLE_S, KEEPALIVE_INTVL_S, KEEPALIVE_CNT = 10, 5, 2
HIGH_WATER = 4 << 20  # buffered bytes above which a writer awaits drain
AUTH_MAGIC = b"JRAUTH1\n"
AUTH_MAX_FRAME = 4096  # the largest frame before the authorization passed
# The receive area's usual size: every lane connection holds one (four per peer), and a
# frame larger than it grows it for as long as it is in flight.
RECV_AREA = 64 << 10
RECV_MIN_ROOM = 16 << 10  # the least free room offered to one read


class FrameTooLarge(ConnectionError):
    pass


class _Frames(asyncio.BufferedProtocol):
    """Cuts the byte stream into frames: queued for `read()` (handshake) or,
    once `serve` switched the mode, handed to a callback as they arrive.

    The socket is read straight into a receive area this object owns
    (`get_buffer`/`buffer_updated`): a plain `Protocol` gets a fresh
    256 KiB `bytes` per read (an mmap, an mremap and an munmap per Raft
    message on each node, measured by strace) that is then copied once more
    into the reassembly buffer."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray(RECV_AREA)
        self._len = 0  # bytes received and not yet cut into frames, from offset 0
        self._frames: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._on_frame: Callable[[bytes], None] | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._paused = False
        self._drained: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        """Free room after the bytes kept so far. It grows to hold the frame
        being received (whose header bounds it by `max_frame`) and shrinks
        back once a large frame is gone. A new area is a new bytearray: the
        transport may still hold a view of the old one."""
        del sizehint
        want = RECV_MIN_ROOM
        if self._len >= HEADER.size:
            (n,) = HEADER.unpack_from(self._buf, 0)
            want = max(want, HEADER.size + min(n, self.max_frame) - self._len)
        size = len(self._buf)
        if size - self._len < want or (size > RECV_AREA and self._len + want <= RECV_AREA):
            area = bytearray(max(RECV_AREA, self._len + want))
            area[:self._len] = self._buf[:self._len]
            self._buf = area
        return memoryview(self._buf)[self._len:]

    def buffer_updated(self, nbytes: int) -> None:
        self._len += nbytes
        buf = self._buf
        pos = 0
        while self._len - pos >= HEADER.size:
            (n,) = HEADER.unpack_from(buf, pos)
            if n > self.max_frame:
                self._abort(FrameTooLarge(f"frame of {n} bytes"))
                return
            end = pos + HEADER.size + n
            if self._len < end:
                break
            frame = bytes(buf[pos + HEADER.size:end])
            pos = end
            if self._on_frame is not None:
                self._on_frame(frame)
                if self.transport is None or self.transport.is_closing():
                    return
            else:
                self._frames.append(frame)
                self._wake()
        if pos:
            # Same-size slice assignment: the area is not resized while the
            # transport's view of it is alive.
            rest = self._len - pos
            buf[:rest] = buf[pos:self._len]
            self._len = rest

    def _abort(self, exc: BaseException) -> None:
        del exc
        self._len = 0
        if self.transport is not None:
            self.transport.abort()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def eof_received(self) -> bool:
        return False  # close the transport (connection_lost follows)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self._wake()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def drain(self) -> None:
        if self._paused and not self.closed.done():
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    async def next_frame(self) -> bytes | None:
        while not self._frames:
            if self.closed.done():
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._frames.popleft()

    def switch(self, on_frame: Callable[[bytes], None]) -> None:
        """Callback mode: frames already queued first, then each as it arrives."""
        self._on_frame = on_frame
        while self._frames and not self.closed.done():
            on_frame(self._frames.popleft())


class TcpStream:
    """One direction-pair of framed Batches over a TCP (or TLS) connection."""

    def __init__(self, proto: _Frames, max_frame: int) -> None:
        self._p = proto
        self._t = proto.transport
        self._max = max_frame

    @property
    def transport(self) -> asyncio.Transport:
        return self._t

    def buffered(self) -> int:
        """Bytes written but not yet handed to the kernel."""
        return self._t.get_write_buffer_size()

    def _frame(self, data: bytes) -> None:
        if self._t.is_closing():
            raise ConnectionError("direct lane closed")
        self._t.write(HEADER.pack(len(data)) + data)

    def write_now(self, batch: pb.Batch) -> None:
        """Hand a batch to the socket without awaiting (asyncio tries the
        send at once; what the kernel does not take stays buffered)."""
        self._frame(batch.SerializeToString())

    async def write(self, batch: pb.Batch) -> None:
        self.write_now(batch)
        if self.buffered() > HIGH_WATER:
            await self._p.drain()

    def write_auth(self, cred: str | None) -> None:
        self._frame(AUTH_MAGIC + (cred or "").encode())

    def write_frame(self, data: bytes) -> None:
        """One raw frame (the handshake's proofs, raft/lane_auth.py)."""
        self._frame(data)

    async def read_frame(self) -> bytes | None:
        """The next raw frame, None once the connection ended."""
        return await self._p.next_frame()

    async def read_auth(self) -> str | None:
        """The dialer's authorization frame: its credential text ("" = none),
        or None when the first frame is not one (or the connection ended)."""
        frame = await self._p.next_frame()
        if frame is None or not frame.startswith(AUTH_MAGIC):
            return None
        try:
            return frame[len(AUTH_MAGIC):].decode()
        except UnicodeDecodeError:
            return None

    def authorized(self) -> None:
        """The authorization passed: frames up to the stream's full size from now on."""
        self._p.max_frame = self._max

    async def read(self) -> pb.Batch | object:
        frame = await self._p.next_frame()
        if frame is None:
            return grpc.aio.EOF
        try:
            return pb.Batch.FromString(frame)
        except DecodeError:
            self.cancel()
            return grpc.aio.EOF

    async def serve(self, on_batch: Callable[[pb.Batch], None]) -> None:
        """Hand every further Batch to `on_batch` inside the read callback,
        until the connection ends (an undecodable frame ends it)."""
        def on_frame(frame: bytes) -> None:
            try:
                batch = pb.Batch.FromString(frame)
            except DecodeError:
                self.cancel()
                return
            on_batch(batch)
        self._p.switch(on_frame)
        await self._p.closed

    def cancel(self) -> None:
        self._t.close()

    def peer_names(self) -> set[bytes]:
        """DNS names and common names of the verified client certificate (TLS)."""
        cert = self._t.get_extra_info("peercert") or {}
        names = {v.encode() for k, v in cert.get("subjectAltName", ()) if k == "DNS"}
        for rdn in cert.get("subject", ()):
            names.update(v.encode() for k, v in rdn if k == "commonName")
        return names


def tune(transport: asyncio.BaseTransport) -> None:
    """No Nagle delay (one small frame per commit step), and keepalive probes."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, val in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTVL_S),
                     ("TCP_KEEPCNT", KEEPALIVE_CNT)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def proxy_for(addr: str, env: dict[str, str] | None = None) -> tuple[str, int] | None:
    """The HTTP CONNECT proxy the gRPC lanes would use to reach `addr`, by gRPC's
    environment rule: `grpc_proxy`, else `https_proxy`, else `http_proxy` (an
    `http://host:port` URL); none when the host is listed in `no_grpc_proxy`, else
    `no_proxy` (comma-separated names, a name also covering its subdomains, `*` all).
    The direct lane follows the same rule, so traffic an operator (or the partition
    tests, tests/cluster/netcut.py) routes through a proxy does not bypass it."""
    env = os.environ if env is None else env
    url = env.get("grpc_proxy") or env.get("https_proxy") or env.get("http_proxy")
    if not url:
        return None
    host = split_addr(addr)[0]
    skip = env.get("no_grpc_proxy") or env.get("no_proxy") or ""
    for name in (n.strip().lstrip(".") for n in skip.split(",")):
        if name and (name == "*" or host == name or host.endswith("." + name)):
            return None
    hostport = url.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[2]
    phost, _, pport = hostport.rpartition(":")
    return (phost.strip("[]"), int(pport)) if phost else (hostport, 80)


async def _tunnel(proxy: tuple[str, int], addr: str) -> socket.socket:
    """A socket to `addr` through an HTTP CONNECT proxy (plain TCP to the proxy)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET6 if ":" in proxy[0] else socket.AF_INET)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, proxy)
        await loop.sock_sendall(sock, f"CONNECT {addr} HTTP/1.1\r\nHost: {addr}\r\n\r\n"
                                .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = await loop.sock_recv(sock, 1)  # byte by byte: nothing past the head
            if not chunk or len(head) > AUTH_MAX_FRAME:
                raise ConnectionError(f"proxy {proxy[0]}:{proxy[1]}: no CONNECT answer")
            head += chunk
        status = head.split(b"\r\n", 1)[0].split()
        if len(status) < 2 or status[1] != b"200":
            raise ConnectionError(f"proxy {proxy[0]}:{proxy[1]} refused {addr}: "
                                  f"{head[:80]!r}")
    except BaseException:
        sock.close()
        raise
    return sock


async def dial(addr: str, ctx: ssl.SSLContext | None, server_name: str | None,
               max_frame: int, cred: str | None = None,
               proxy: tuple[str, int] | None = None, *, prove: bool = False) -> TcpStream:
    """Connect (through `proxy`, an HTTP CONNECT proxy, if given), and present
    `cred` (the cluster authorization) as the first frame. `prove`: write
    nothing (the caller runs the mutual proof, raft/lane_auth.py) and read
    at most AUTH_MAX_FRAME-byte frames until `authorized()`."""
    host, port = split_addr(addr)
    loop = asyncio.get_running_loop()
    where: dict[str, object] = {"host": host, "port": port}
    if proxy is not None:
        where = {"sock": await _tunnel(proxy, addr)}
    transport, proto = await loop.create_connection(
        lambda: _Frames(AUTH_MAX_FRAME if prove else max_frame), ssl=ctx,
        server_hostname=server_name if ctx is not None else None, **where)
    tune(transport)
    stream = TcpStream(proto, max_frame)
    if not prove:
        stream.write_auth(cred)
    return stream


async def listen(host: str, port: int, ctx: ssl.SSLContext | None, max_frame: int,
                 on_stream: Callable[[TcpStream], None]) -> asyncio.Server:
    """Accept connections; each becomes a TcpStream that reads at most
    AUTH_MAX_FRAME-byte frames until `authorized()`."""
    loop = asyncio.get_running_loop()

    def factory() -> _Frames:
        proto = _Frames(AUTH_MAX_FRAME)
        made = proto.connection_made

        def connection_made(transport: asyncio.BaseTransport) -> None:
            made(transport)
            tune(transport)
            on_stream(TcpStream(proto, max_frame))
        proto.connection_made = connection_made  # type: ignore[method-assign]
        return proto
    return await loop.create_server(factory, host, port, ssl=ctx)


def contexts(cert: str | bytes, key: str | bytes, ca: str | bytes
             ) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts for mutual TLS under the cluster CA. The
    client checks the acceptor's name itself (`server_hostname` = the peer's
    node name), the server requires a client certificate."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    for ctx in (server, client):
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        _load_ca(ctx, ca)
        _load_chain(ctx, cert, key)
    return server, client


def _load_ca(ctx: ssl.SSLContext, ca: str | bytes) -> None:
    if isinstance(ca, bytes):
        ctx.load_verify_locations(cadata=ca.decode())
    else:
        ctx.load_verify_locations(cafile=ca)


def _load_chain(ctx: ssl.SSLContext, cert: str | bytes, key: str | bytes) -> None:
    if isinstance(cert, str) and isinstance(key, str):
        ctx.load_cert_chain(cert, key)
        return
    # PEM given as bytes: ssl loads a chain only from files; a private
    # directory that lives only for the call.
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for name, blob in (("cert.pem", cert), ("key.pem", key)):
            path = os.path.join(d, name)
            if isinstance(blob, str):
                with open(blob, "rb") as f:
                    blob = f.read()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            paths.append(path)
        ctx.load_cert_chain(paths[0], paths[1])
