"""A direct TCP lane for Raft batches: the gRPC Raft stream's payload without gRPC.

Why it exists (an exception to "peers talk gRPC", measured on this 2-core
machine, docs/raft.md "Direct TCP lane"): a 128 B ping-pong over a grpc.aio
bidirectional stream costs p50 ~320 us, the same over asyncio streams ~65 us;
inside a window-1 commit each gRPC direction took 0.5-0.6 ms, because every
received message crosses gRPC's I/O thread and its poller thread before the
event loop sees it. Here the loop reads the socket itself.

The content and the checks are those of the gRPC lane: frames are a 4-byte
big-endian length and a serialized `pb.Batch`; the dialer's first frame is
a hello naming the lane, the acceptor answers with a hello; then both
directions carry Batches, which the transport checks exactly as it checks
gRPC ones. With TLS both sides present certificates from the cluster CA,
the dialer verifies the acceptor's certificate against the peer's node name
and the acceptor checks that the client certificate names the claimed node.
Snapshots stay on gRPC (their own RPC). A stream object here offers what the
transport uses of a gRPC call: `write`, `read` (returns `grpc.aio.EOF` at the
end), `cancel`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import struct
import tempfile

import grpc

from proto import cluster_pb2 as pb

HEADER = struct.Struct(">I")
# TCP keepalive: a peer behind a partition is noticed like gRPC's keepalive does.
KEEPALIVE_IDLE_S, KEEPALIVE_INTVL_S, KEEPALIVE_CNT = 10, 5, 2
HIGH_WATER = 4 << 20  # buffered bytes above which a writer awaits drain


class FrameTooLarge(ConnectionError):
    pass


class TcpStream:
    """One direction-pair of framed Batches over an asyncio stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 max_frame: int) -> None:
        self._r = reader
        self._w = writer
        self._max = max_frame
        self.writer = writer

    def buffered(self) -> int:
        """Bytes written but not yet handed to the kernel."""
        return self._w.transport.get_write_buffer_size()

    def write_now(self, batch: pb.Batch) -> None:
        """Hand a batch to the socket without awaiting (asyncio tries the
        send at once; what the kernel does not take stays buffered)."""
        if self._w.is_closing():
            raise ConnectionError("direct lane closed")
        data = batch.SerializeToString()
        self._w.write(HEADER.pack(len(data)) + data)

    async def write(self, batch: pb.Batch) -> None:
        self.write_now(batch)
        if self.buffered() > HIGH_WATER:
            await self._w.drain()

    async def read(self) -> pb.Batch | object:
        try:
            head = await self._r.readexactly(HEADER.size)
            (n,) = HEADER.unpack(head)
            if n > self._max:
                raise FrameTooLarge(f"frame of {n} bytes")
            return pb.Batch.FromString(await self._r.readexactly(n))
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            return grpc.aio.EOF

    def cancel(self) -> None:
        self._w.close()

    def peer_names(self) -> set[bytes]:
        """DNS names and common names of the verified client certificate (TLS)."""
        cert = self._w.get_extra_info("peercert") or {}
        names = {v.encode() for k, v in cert.get("subjectAltName", ()) if k == "DNS"}
        for rdn in cert.get("subject", ()):
            names.update(v.encode() for k, v in rdn if k == "commonName")
        return names


def tune(writer: asyncio.StreamWriter) -> None:
    """No Nagle delay (one small frame per commit step), and keepalive probes."""
    sock = writer.get_extra_info("socket")
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


async def dial(addr: str, ctx: ssl.SSLContext | None, server_name: str | None,
               max_frame: int) -> TcpStream:
    host, port = split_addr(addr)
    reader, writer = await asyncio.open_connection(
        host, port, ssl=ctx, server_hostname=server_name if ctx is not None else None,
        limit=1 << 20)
    tune(writer)
    return TcpStream(reader, writer, max_frame)


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
