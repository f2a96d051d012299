"""WebSocket listener: NATS protocol bytes carried in WebSocket frames.

Three layers, as elsewhere in the node:
- `handshake()`: pure HTTP/1.1 Upgrade request -> 101/400 response (RFC 6455
  section 4.2, permessage-deflate negotiation of RFC 7692);
- `WsCodec`: a pure frame codec. Client frames in (masked, possibly
  fragmented, possibly compressed), events out; server frames are encoded
  unmasked as binary messages. Data frame payloads are emitted as they
  arrive, so a large frame is never buffered whole;
- `WsProtocol` + `WsTransport`: the asyncio edge, which hands the unwrapped
  byte stream to the ordinary client protocol made by
  `server.make_client_protocol("WEBSOCKET")`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import zlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from node.options import WebsocketOptions
from node.tls import server_context

log = logging.getLogger(__name__)

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_REQUEST = 8 * 1024  # bytes of HTTP upgrade request we accept
MAX_CONTROL_PAYLOAD = 125
HANDSHAKE_TIMEOUT = 5.0  # seconds to send the upgrade request
COMPRESS_MIN = 64  # smaller server messages are sent uncompressed

OP_CONT, OP_TEXT, OP_BINARY = 0x0, 0x1, 0x2
OP_CLOSE, OP_PING, OP_PONG = 0x8, 0x9, 0xA
_DATA_OPS = (OP_CONT, OP_TEXT, OP_BINARY)
_CONTROL_OPS = (OP_CLOSE, OP_PING, OP_PONG)

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_NO_STATUS = 1005
CLOSE_TOO_BIG = 1009
# Inflated size of one compressed message when the server does not say:
# nats-server's default max_payload plus max_control_line and two CRLFs.
DEFAULT_MAX_INFLATED = 1024 * 1024 + 4096 + 4
_DEFLATE_TAIL = b"\x00\x00\xff\xff"


# --------------------------------------------------------------------------- handshake


@dataclass(frozen=True)
class Handshake:
    ok: bool
    response: bytes  # the bytes to write back
    compress: bool = False  # permessage-deflate negotiated


def accept_key(key: str) -> str:
    """Sec-WebSocket-Accept for a Sec-WebSocket-Key."""
    return base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()


def _bad_request(status: str, reason: str) -> Handshake:
    body = reason.encode() + b"\n"
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Sec-Websocket-Version: 13\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return Handshake(False, head.encode() + body)


def _parse_request(raw: bytes) -> tuple[list[str], dict[str, str]] | None:
    try:
        text = raw.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes anything
        return None
    lines = text.split("\r\n")
    request = lines[0].split(" ")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            return None
        key = name.strip().lower()
        # Repeated headers are joined with ", " (RFC 9110 section 5.3).
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    return request, headers


def _tokens(value: str) -> set[str]:
    return {t.strip().lower() for t in value.split(",")}


@dataclass(frozen=True)
class OriginPolicy:
    """websocket { same_origin, allowed_origins }: which browser pages may connect.
    Origins compare by scheme, host and port (default 80/443), case-insensitively;
    with both settings, an origin must pass both, as in nats-server."""

    same_origin: bool = False
    allowed: tuple[tuple[str, str, int], ...] = ()
    tls: bool = False  # the listener is wss: a same origin is https

    @classmethod
    def build(cls, opts: WebsocketOptions, tls: bool) -> OriginPolicy | None:
        if not opts.same_origin and not opts.allowed_origins:
            return None
        allowed = tuple(o for o in (_origin(u) for u in opts.allowed_origins) if o is not None)
        return cls(opts.same_origin, allowed, tls)

    def allows(self, origin: str | None, host: str) -> bool:
        if origin is None:
            return True  # not a browser: nothing to protect against
        got = _origin(origin)
        if got is None:
            return False
        if self.same_origin:
            scheme = "https" if self.tls else "http"
            if got != _origin(f"{scheme}://{host}"):
                return False
        return not self.allowed or got in self.allowed


def _origin(url: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port or (443 if scheme == "https" else 80)


def handshake(raw: bytes, compression: bool, origins: OriginPolicy | None = None) -> Handshake:
    """Answer an upgrade request (`raw`: the request through the blank line)."""
    parsed = _parse_request(raw)
    if parsed is None or len(parsed[0]) != 3:
        return _bad_request("400 Bad Request", "Bad Request")
    (method, _target, version), headers = parsed
    if method != "GET":
        return _bad_request("405 Method Not Allowed", "Method Not Allowed")
    if version != "HTTP/1.1":
        return _bad_request("400 Bad Request", "Bad Request")
    if "websocket" not in _tokens(headers.get("upgrade", "")):
        return _bad_request("400 Bad Request", "Bad Request")
    if "upgrade" not in _tokens(headers.get("connection", "")):
        return _bad_request("400 Bad Request", "Bad Request")
    if headers.get("sec-websocket-version") != "13":
        return _bad_request("400 Bad Request", "Bad Request")
    key = headers.get("sec-websocket-key", "")
    try:
        valid_key = len(base64.b64decode(key, validate=True)) == 16
    except ValueError:
        valid_key = False
    if not valid_key:
        return _bad_request("400 Bad Request", "Bad Request")
    if origins is not None and not origins.allows(headers.get("origin"), headers.get("host", "")):
        return _bad_request("403 Forbidden", "Forbidden")
    offers = [o.split(";")[0].strip().lower()
              for o in headers.get("sec-websocket-extensions", "").split(",")]
    compress = compression and "permessage-deflate" in offers
    lines = [
        "HTTP/1.1 101 Switching Protocols",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Accept: {accept_key(key)}",
    ]
    if compress:
        # Like nats-server: no context takeover either way, so each message is
        # compressed on its own and no per-connection window is kept.
        lines.append("Sec-WebSocket-Extensions: permessage-deflate; "
                     "server_no_context_takeover; client_no_context_takeover")
    return Handshake(True, ("\r\n".join(lines) + "\r\n\r\n").encode(), compress)


# --------------------------------------------------------------------------- frame codec


class WsError(Exception):
    """A protocol violation: close the connection with `code`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Data:
    data: bytes  # a piece of the NATS byte stream (text and binary alike)


@dataclass(frozen=True, slots=True)
class Ping:
    payload: bytes


@dataclass(frozen=True, slots=True)
class Pong:
    payload: bytes


@dataclass(frozen=True, slots=True)
class Close:
    code: int
    reason: str


WsEvent = Data | Ping | Pong | Close


@dataclass(slots=True)
class _Frame:
    fin: bool
    opcode: int
    mask: bytes
    remaining: int
    pos: int = 0  # payload bytes consumed so far (for the mask phase)


def unmask(data: bytes, mask: bytes, offset: int = 0) -> bytes:
    """XOR `data` with the 4-byte `mask`, starting at mask byte `offset`.
    One big-int XOR is much faster in Python than a per-byte loop."""
    n = len(data)
    if n == 0:
        return b""
    if offset % 4:
        mask = mask[offset % 4:] + mask[: offset % 4]
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


def encode_frame(
    opcode: int, payload: bytes, fin: bool = True, mask: bytes | None = None, rsv1: bool = False
) -> bytes:
    """One frame. Servers send `mask=None`; clients (and tests) pass a mask."""
    b0 = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    n = len(payload)
    mbit = 0x80 if mask is not None else 0
    if n < 126:
        head = bytes((b0, mbit | n))
    elif n < 1 << 16:
        head = bytes((b0, mbit | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((b0, mbit | 127)) + n.to_bytes(8, "big")
    if mask is None:
        return head + payload
    return head + mask + unmask(payload, mask)


def close_payload(code: int, reason: str = "") -> bytes:
    return code.to_bytes(2, "big") + reason.encode()[:MAX_CONTROL_PAYLOAD - 2]


class WsCodec:
    """Sans-IO WebSocket for the server side of one connection."""

    def __init__(self, compress: bool = False, max_inflated: int = DEFAULT_MAX_INFLATED) -> None:
        self.compress = compress
        # A compressed message may inflate to at most this many bytes: deflate reaches
        # ~1000:1, so without a bound a small frame could claim gigabytes.
        self.max_inflated = max_inflated
        self._inflated = 0  # bytes inflated so far in the current message
        self._buf = bytearray()
        self._frame: _Frame | None = None
        self._in_message = False  # inside a fragmented data message
        self._inflating = False  # the current data message is compressed
        # One inflater for the connection: it decodes messages whether or not
        # the client resets its window between messages.
        self._inflater = zlib.decompressobj(wbits=-15)
        self.closed = False  # a Close frame was received

    # ---------------------------------------------------------------- inbound

    def feed(self, data: bytes, limit: int = 0) -> list[WsEvent]:
        """Consume bytes from the client; raise WsError on a violation. With `limit`,
        stop after the frame that brings the events' payload to `limit` bytes: the rest
        stays buffered for `feed(b"", limit)`, so a caller that acts on each batch (and
        closes on the first bad one) never inflates a whole read of compressed frames."""
        if self.closed:
            return []
        self._buf += data
        events: list[WsEvent] = []
        size = 0
        while not self.closed:
            if self._frame is None:
                self._frame = self._parse_header()
                if self._frame is None:
                    break
            before = len(events)
            if not self._consume(self._frame, events):
                break
            self._frame = None
            if limit:
                size += sum(len(e.data) for e in events[before:] if isinstance(e, Data))
                if size >= limit:
                    break
        return events

    def _parse_header(self) -> _Frame | None:
        buf = self._buf
        if len(buf) < 2:
            return None
        b0, b1 = buf[0], buf[1]
        size, at = b1 & 0x7F, 2
        if size == 126:
            if len(buf) < 4:
                return None
            size, at = int.from_bytes(buf[2:4], "big"), 4
        elif size == 127:
            if len(buf) < 10:
                return None
            size, at = int.from_bytes(buf[2:10], "big"), 10
            if size >> 63:
                raise WsError(CLOSE_PROTOCOL_ERROR, "invalid payload length")
        if not b1 & 0x80:
            raise WsError(CLOSE_PROTOCOL_ERROR, "client frame not masked")
        if len(buf) < at + 4:
            return None
        frame = _Frame(bool(b0 & 0x80), b0 & 0x0F, bytes(buf[at:at + 4]), size)
        self._check_frame(frame, b0 & 0x70)
        del buf[:at + 4]
        return frame

    def _check_frame(self, frame: _Frame, rsv: int) -> None:
        op = frame.opcode
        if op not in _DATA_OPS and op not in _CONTROL_OPS:
            raise WsError(CLOSE_PROTOCOL_ERROR, f"unknown opcode {op}")
        if op in _CONTROL_OPS:
            if not frame.fin or frame.remaining > MAX_CONTROL_PAYLOAD or rsv:
                raise WsError(CLOSE_PROTOCOL_ERROR, "invalid control frame")
            return
        if op == OP_CONT and not self._in_message:
            raise WsError(CLOSE_PROTOCOL_ERROR, "continuation without a message")
        if op != OP_CONT and self._in_message:
            raise WsError(CLOSE_PROTOCOL_ERROR, "new message inside a fragmented one")
        compressed = rsv == 0x40 and op != OP_CONT and self.compress
        if rsv and not compressed:
            raise WsError(CLOSE_PROTOCOL_ERROR, "unexpected reserved bits")
        if op != OP_CONT:
            self._inflating = compressed
            self._inflated = 0
        self._in_message = not frame.fin

    def _consume(self, frame: _Frame, events: list[WsEvent]) -> bool:
        """Use buffered payload of `frame`; True when the frame is complete."""
        if frame.opcode in _CONTROL_OPS:
            if len(self._buf) < frame.remaining:
                return False
            payload = unmask(bytes(self._buf[:frame.remaining]), frame.mask)
            del self._buf[:frame.remaining]
            events.append(self._control(frame.opcode, payload))
            return True
        take = min(frame.remaining, len(self._buf))
        if take:
            chunk = unmask(bytes(self._buf[:take]), frame.mask, frame.pos)
            del self._buf[:take]
            frame.pos += take
            frame.remaining -= take
            self._emit(chunk, events)
        if frame.remaining:
            return False
        if frame.fin and self._inflating:
            self._emit_tail(events)
        return True

    def _emit(self, chunk: bytes, events: list[WsEvent]) -> None:
        if self._inflating:
            chunk = self._inflate(chunk)
        if chunk:
            events.append(Data(chunk))

    def _emit_tail(self, events: list[WsEvent]) -> None:
        """End of a compressed message: the sender stripped the sync-flush tail."""
        self._inflating = False
        out = self._inflate(_DEFLATE_TAIL)
        if out:
            events.append(Data(out))

    def _inflate(self, chunk: bytes) -> bytes:
        """Inflate, never producing more than the message's remaining budget."""
        budget = self.max_inflated - self._inflated
        try:
            # One byte past the budget tells "exactly full" from "would overflow".
            out = self._inflater.decompress(chunk, budget + 1)
        except zlib.error as err:
            raise WsError(CLOSE_PROTOCOL_ERROR, f"bad compressed data: {err}") from err
        if len(out) > budget:
            raise WsError(CLOSE_TOO_BIG, "compressed message exceeds maximum payload")
        self._inflated += len(out)
        return out

    def _control(self, opcode: int, payload: bytes) -> WsEvent:
        if opcode == OP_PING:
            return Ping(payload)
        if opcode == OP_PONG:
            return Pong(payload)
        self.closed = True
        if not payload:
            return Close(CLOSE_NO_STATUS, "")
        if len(payload) < 2:
            raise WsError(CLOSE_PROTOCOL_ERROR, "invalid close payload")
        return Close(int.from_bytes(payload[:2], "big"), payload[2:].decode("utf-8", "replace"))

    # ---------------------------------------------------------------- outbound

    def encode(self, payload: bytes) -> bytes:
        """Server output as one binary message, compressed when negotiated."""
        if self.compress and len(payload) >= COMPRESS_MIN:
            deflater = zlib.compressobj(wbits=-15)
            body = deflater.compress(payload) + deflater.flush(zlib.Z_SYNC_FLUSH)
            if body.endswith(_DEFLATE_TAIL):
                body = body[:-4]
            return encode_frame(OP_BINARY, body, rsv1=True)
        return encode_frame(OP_BINARY, payload)

    @staticmethod
    def pong(payload: bytes) -> bytes:
        return encode_frame(OP_PONG, payload)

    @staticmethod
    def close(code: int, reason: str = "") -> bytes:
        payload = b"" if code == CLOSE_NO_STATUS else close_payload(code, reason)
        return encode_frame(OP_CLOSE, payload)


# --------------------------------------------------------------------------- asyncio edge


class WsTransport(asyncio.Transport):
    """What the client protocol writes to: every write becomes one binary
    message on the real transport; the rest is delegated."""

    def __init__(self, transport: asyncio.Transport, codec: WsCodec) -> None:
        super().__init__()
        self._t = transport
        self._codec = codec
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._closing and data:
            self._t.write(self._codec.encode(bytes(data)))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def close(self, code: int = CLOSE_NORMAL) -> None:
        if self._closing:
            return
        self._closing = True
        if not self._t.is_closing():
            self._t.write(WsCodec.close(code))
            self._t.close()

    def abort(self) -> None:
        self._closing = True
        self._t.abort()

    def is_closing(self) -> bool:
        return self._closing or self._t.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._t.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._t.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._t.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._t.set_write_buffer_limits(high, low)

    def pause_reading(self) -> None:
        self._t.pause_reading()

    def resume_reading(self) -> None:
        self._t.resume_reading()

    def is_reading(self) -> bool:
        return self._t.is_reading()

    def can_write_eof(self) -> bool:
        return False


class WsProtocol(asyncio.Protocol):
    """One WebSocket connection: HTTP upgrade, then frames <-> NATS bytes."""

    def __init__(self, server: Any, opts: WebsocketOptions) -> None:
        self._server = server
        self._compression = opts.compression
        self._handshake_timeout = opts.handshake_timeout or HANDSHAKE_TIMEOUT
        self._origins = OriginPolicy.build(opts, opts.tls is not None and not opts.no_tls)
        self._transport: asyncio.Transport | None = None
        self._request = bytearray()
        self._codec: WsCodec | None = None
        self._adapter: WsTransport | None = None
        self._inner: asyncio.Protocol | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._handshake_timeout, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._codec is None:
            self._on_request(data)
        else:
            self._on_frames(data)

    def _on_request(self, data: bytes) -> None:
        assert self._transport is not None
        self._request += data
        end = self._request.find(b"\r\n\r\n")
        if end < 0:
            if len(self._request) > MAX_REQUEST:
                self._transport.write(_bad_request("400 Bad Request", "Bad Request").response)
                self._transport.close()
            return
        rest = bytes(self._request[end + 4:])
        result = handshake(bytes(self._request[:end + 4]), self._compression, self._origins)
        self._request = bytearray()
        self._transport.write(result.response)
        if not result.ok:
            self._transport.close()
            return
        if self._timer is not None:
            self._timer.cancel()
        opts = self._server.options
        # One message carries at most a control line and a max_payload body.
        self._codec = WsCodec(result.compress, opts.max_payload + opts.max_control_line + 4)
        self._adapter = WsTransport(self._transport, self._codec)
        self._inner = self._server.make_client_protocol("WEBSOCKET")
        self._inner.connection_made(self._adapter)
        if rest:
            self._on_frames(rest)

    def _on_frames(self, data: bytes) -> None:
        """Frames in batches of at most one message's worth of payload, each handed on
        before the next is decoded: a connection the NATS parser closes (bad bytes before
        CONNECT, ...) stops costing inflation at once, whatever else its read carried."""
        assert self._codec is not None and self._adapter is not None
        codec = self._codec
        while not self._adapter.is_closing():
            try:
                events = codec.feed(data, codec.max_inflated)
            except WsError as err:
                log.debug("websocket protocol error: %s", err.reason)
                self._adapter.close(err.code)
                return
            if not events:
                return
            self._hand_on(events)
            data = b""

    def _hand_on(self, events: list[WsEvent]) -> None:
        assert self._adapter is not None
        for ev in events:
            if self._adapter.is_closing():
                return
            if isinstance(ev, Data):
                self._inner.data_received(ev.data)  # type: ignore[union-attr]
            elif isinstance(ev, Ping):
                self._transport.write(WsCodec.pong(ev.payload))  # type: ignore[union-attr]
            elif isinstance(ev, Close):
                # Echo the status, as RFC 6455 section 5.5.1 asks.
                code = CLOSE_NORMAL if ev.code == CLOSE_NO_STATUS else ev.code
                self._adapter.close(code)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


async def start_websocket(server: Any, opts: WebsocketOptions) -> asyncio.Server:
    """Listen for WebSocket clients. TLS (wss) unless `no_tls` or no `tls`."""
    ssl_ctx = server_context(opts.tls) if opts.tls is not None and not opts.no_tls else None
    if ssl_ctx is None and not opts.no_tls:
        log.warning("websocket listener without TLS (set no_tls: true to silence this)")
    loop = asyncio.get_running_loop()
    port = 0 if opts.port < 0 else opts.port
    # wss: the TLS handshake comes before connection_made (and HANDSHAKE_TIMEOUT's
    # timer); tls { timeout } bounds it, not asyncio's 60 s default.
    hs_timeout = opts.tls.timeout if ssl_ctx is not None and opts.tls is not None else None
    return await loop.create_server(
        lambda: WsProtocol(server, opts), opts.host, port, ssl=ssl_ctx, reuse_address=True,
        ssl_handshake_timeout=hs_timeout,
    )
