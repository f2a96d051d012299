"""Pure parser for the NATS client protocol: the bytes a client sends to a server.

`Parser.feed(bytes)` returns the complete events (`node/protocol/events.py`) in order
and keeps partial frames for the next call. No sockets, no clocks, no awaits.
`Parser.feed_into(bytes, on_pub, on_event)` is the same parse for the server's hot path:
a PUB becomes a callback with its fields, and no Pub object is built.

Behaviour follows nats-server 2.15 as observed over raw sockets (see the
differential tests in tests/unit/test_parser.py):

* op names are case-insensitive; arguments are separated by any run of spaces or tabs;
  a control line ends at LF, and one CR right before it is dropped;
* PING, PONG and +OK ignore whatever follows them on the line; INFO from a client is
  accepted and ignored (it must still be JSON); MSG/HMSG/-ERR from a client are errors;
* a payload must be followed by exactly CRLF;
* sizes are 1-9 ASCII digits, anything else is "Bad or Missing Size";
* malformed framing gets -ERR 'Unknown Protocol Operation', an oversized control line
  -ERR 'maximum control line exceeded', a too-large payload -ERR 'Maximum Payload
  Violation'; bad PUB/SUB/UNSUB/HPUB arguments and bad CONNECT JSON close the connection
  WITHOUT any -ERR (`ProtocolError.send_err` is False). Every parser error is fatal.

Deliberate differences: nats-server checks the control-line limit only on lines split
across socket reads (its own comment calls the check "not exact"); we check every line,
so the result never depends on how TCP chunks the stream. We split arguments with
bytes.split(), which also splits on VT/FF; nats-server would keep those inside a token.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import FunctionType
from typing import TYPE_CHECKING, Any

from .errors import ProtocolError

if TYPE_CHECKING:  # only annotations of locals name it: never evaluated at run time
    from mypy_extensions import i64  # a native int when compiled by mypyc
from .events import Connect, Event, HPub, Ping, Pong, Pub, Sub, Unsub

ERR_UNKNOWN_OP = "Unknown Protocol Operation"
ERR_MAX_PAYLOAD = "Maximum Payload Violation"
ERR_MAX_CONTROL_LINE = "maximum control line exceeded"
ERR_HEADERS = "message headers not supported"

_MAX_SIZE_DIGITS = 9  # nats-server refuses sizes with more digits (its 999 MB cap)
_SNIPPET = 32
_SEP = b" \t"
_PING = Ping()
_PONG = Pong()

# Build Pub/HPub without the frozen-dataclass __init__ (object.__setattr__ per field
# costs more than the rest of the parse): the slot descriptors write the fields directly.
_new: Any = object.__new__
_pub_subject: Any = vars(Pub)["subject"].__set__
_pub_reply: Any = vars(Pub)["reply"].__set__
_pub_payload: Any = vars(Pub)["payload"].__set__
_hpub_subject: Any = vars(HPub)["subject"].__set__
_hpub_reply: Any = vars(HPub)["reply"].__set__
_hpub_headers: Any = vars(HPub)["headers"].__set__
_hpub_payload: Any = vars(HPub)["payload"].__set__

# Op words a line may start with. A word with a separator needs a space/tab after it
# (nats-server: "PUB\r\n" and "PUBX" are unknown ops); the others take anything.
_OPS: tuple[tuple[bytes, bool], ...] = (
    (b"PUB", True),
    (b"HPUB", True),
    (b"SUB", True),
    (b"UNSUB", True),
    (b"-ERR", True),
    (b"PING", False),
    (b"PONG", False),
    (b"+OK", False),
    (b"CONNECT", False),
    (b"INFO", False),
)
_SKIP_OPS: dict[bytes, Event | None] = {b"PING": _PING, b"PONG": _PONG, b"+OK": None}

class _Line:
    """A parsed "PUB ..." line: what a frame with that exact control line needs."""

    __slots__ = ("subject", "reply", "size", "arglen")

    def __init__(self, subject: str, reply: str | None, size: int, arglen: int) -> None:
        self.subject = subject
        self.reply = reply
        self.size = size
        self.arglen = arglen  # what the control-line limit applies to


# Parsed "PUB ..." lines, whole (op to LF), shared by every parser: publishers repeat a
# set of lines, and a hit replaces split/int/decode with one lookup. The entry records
# the size and argument length, so each parser still applies its own limits (a line over
# them takes the slow path, which produces the error). Bounded: cleared when full.
_lines: dict[bytes, _Line] = {}
_LINES_MAX = 8192

OnPub = Callable[[str, "str | None", bytes], Any]  # feed_into's PUB callback
OnEvent = Callable[[Event], Any]  # feed_into's callback for every other event


def _quote(arg: bytes) -> str:
    # Mirrors Go's %q closely enough for a log line.
    return json.dumps(arg.decode("utf-8", "replace"))


def _size(digits: bytes) -> int:
    """nats-server's parseSize: 1-9 ASCII digits, else -1."""
    if 0 < len(digits) <= _MAX_SIZE_DIGITS and digits.isdigit():
        return int(digits)
    return -1


def _text(raw: bytes) -> str:
    # Subjects, sids and queues are str in events; invalid UTF-8 must not crash anyone
    # downstream, so it is replaced (both a publisher and a subscriber map it alike).
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw.decode("utf-8", "replace")


def _op_prefix_ok(head: bytes) -> bool:
    """Could an upper-cased, not yet terminated line still become a valid op?"""
    for word, needs_sep in _OPS:
        k = min(len(head), len(word))
        if head[:k] != word[:k]:
            continue
        if needs_sep and len(head) > len(word) and head[len(word)] not in _SEP:
            continue
        return True
    return False


def _split_pub(arg: bytes) -> list[bytes]:
    """nats-server splits PUB/HPUB arguments on spaces and tabs only (a CR stays put)."""
    if 13 not in arg:
        return arg.split()  # same result, faster
    return [a for a in arg.replace(b"\t", b" ").split(b" ") if a]


def _find_lf(data: bytes, pos: int, n: int) -> int:
    """data.find(b"\\n", pos), as a loop: compiled (native i64 indexes), it costs less
    than the method call, whose argument parsing alone outweighs the scan."""
    i: i64 = pos
    end: i64 = n
    while i < end:
        if data[i] == 10:
            return i
        i += 1
    return -1


def _same(data: bytes, pos: int, line: bytes, ll: int) -> bool:
    """data.startswith(line, pos) for a line of ll bytes, as a loop (see _find_lf).
    From the end: the subject, where a publisher's lines differ, is nearer the end
    than the start ("PUB " and a common subject prefix)."""
    start: i64 = pos
    k: i64 = ll
    if start + k > len(data):
        return False
    k -= 1
    while k >= 0:
        if data[start + k] != line[k]:
            return False
        k -= 1
    return True


# Compiled by mypyc (node/protocol/native.py), module functions are not Python functions:
# then the byte loops above replace bytes.find/startswith, whose argument parsing costs
# more than the scan itself on CPython 3.11. Interpreted, the methods are faster.
_NATIVE = not isinstance(_size, FunctionType)


def _line_end(data: bytes, pos: int, nl: int) -> int:
    """End of the control line's content: the LF, minus one CR right before it."""
    return nl - 1 if nl > pos and data[nl - 1] == 13 else nl


class _BadJson(Exception):
    """CONNECT/INFO JSON nats-server would refuse; the text is what it logs."""


# CONNECT fields nats-server decodes into typed Go fields (ClientOpts); a value of the
# wrong JSON type makes it close the connection. Unknown fields are ignored by it.
_BOOL_FIELDS = frozenset(
    {"echo", "verbose", "pedantic", "tls_required", "new_account", "headers", "no_responders"}
)
_STR_FIELDS = frozenset(
    {"nkey", "jwt", "sig", "auth_token", "user", "pass", "name", "lang", "version",
     "account", "remote_account"}
)
_INT_FIELDS = frozenset({"protocol"})
_PERM_FIELDS = frozenset({"import", "export"})
_KNOWN_FIELDS = _BOOL_FIELDS | _STR_FIELDS | _INT_FIELDS | _PERM_FIELDS
_GO_INT = 1 << 63


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid character {name[0]!r} looking for beginning of value")


def _loads(arg: bytes) -> Any:
    # Go replaces invalid UTF-8 with U+FFFD rather than failing; so do we.
    try:
        return json.loads(arg.decode("utf-8", "replace"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise _BadJson(str(exc) or "invalid JSON") from None


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    kinds: dict[type, str] = {dict: "object", list: "array", str: "string"}
    return kinds.get(type(value), "value")


def _clean_str(value: str) -> str:
    # json.loads keeps lone surrogates ("\ud800"); Go turns them into U+FFFD, and a lone
    # surrogate would make any later .encode() raise.
    try:
        value.encode()
        return value
    except UnicodeEncodeError:
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _canonical(key: str) -> str | None:
    # Go's encoding/json matches field names case-insensitively.
    if key in _KNOWN_FIELDS:
        return key
    low = key.lower()
    return low if key.isascii() and low in _KNOWN_FIELDS else None


def _check_perm(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _BadJson(f"json: cannot unmarshal {_json_kind(value)} into Go struct field "
                       f"ClientOpts.{name} of type server.SubjectPermission")
    out: dict[str, Any] = {}
    for key, items in value.items():
        low = key.lower() if key.isascii() else key
        if low not in ("allow", "deny") or items is None:
            continue
        if not isinstance(items, list) or not all(
            isinstance(i, str) or i is None for i in items
        ):
            raise _BadJson(f"json: cannot unmarshal {_json_kind(items)} into Go struct field "
                           f"ClientOpts.{name}.{low} of type []string")
        out[low] = [_clean_str(i) if i is not None else "" for i in items]
    return out


def _check_field(name: str, value: Any) -> Any:
    """Type-check one known CONNECT field the way Go's json.Unmarshal would."""
    if name in _BOOL_FIELDS:
        ok, gotype = isinstance(value, bool), "bool"
    elif name in _STR_FIELDS:
        ok, gotype = isinstance(value, str), "string"
        if ok:
            value = _clean_str(value)
    elif name in _INT_FIELDS:
        ok, gotype = type(value) is int and -_GO_INT <= value < _GO_INT, "int"
    else:
        return _check_perm(name, value)
    if not ok:
        raise _BadJson(f"json: cannot unmarshal {_json_kind(value)} into Go struct field "
                       f"ClientOpts.{name} of type {gotype}")
    return value


def decode_connect(arg: bytes) -> dict[str, Any]:
    """CONNECT's JSON as a dict with known fields type-checked and named canonically.

    null values are dropped (Go leaves the field unset); unknown fields pass through.
    """
    value = _loads(arg)
    if value is None:
        return {}  # Go accepts "CONNECT null" as an empty options object
    if not isinstance(value, dict):
        raise _BadJson(f"json: cannot unmarshal {_json_kind(value)} into Go value of type "
                       "server.ClientOpts")
    options: dict[str, Any] = {}
    for key, item in value.items():
        name = _canonical(key)
        if name is None:
            options[key] = item
        elif item is not None:
            options[name] = _check_field(name, item)
    return options


def decode_info(arg: bytes) -> None:
    """A client may send INFO; nats-server only checks that it is a JSON object."""
    value = _loads(arg)
    if value is not None and not isinstance(value, dict):
        raise _BadJson(f"json: cannot unmarshal {_json_kind(value)} into Go value of type "
                       "server.Info")


class Parser:
    """Incremental parser of client->server NATS protocol bytes (see module docstring)."""

    def __init__(
        self, max_payload: int = 1048576, max_control_line: int = 4096, headers: bool = True
    ) -> None:
        self.max_payload = max_payload  # mutable: the server may change it after CONNECT
        self.max_control_line = max_control_line
        self.headers = headers  # does the server support headers at all
        self._client_headers = False  # did the client's CONNECT ask for headers
        self._tail = b""  # an unterminated control line
        self._chunks: list[bytes] = []  # a frame whose payload is still arriving
        self._have = 0  # bytes in _chunks
        self._need = 0  # total bytes of that frame
        self._skip: Event | bool | None = None  # after a long PING/PONG/+OK: drop to LF
        self._consumed = 0  # stream offset of the first byte still held, for error details
        self._dead = False

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame (bounded by the limits)."""
        return len(self._tail) + self._have

    def feed(self, data: bytes) -> list[Event]:
        """Consume bytes; return all complete events, in order (see module docstring)."""
        events: list[Event] = []
        append = events.append

        def on_pub(subject: str, reply: str | None, payload: bytes) -> None:
            event = _new(Pub)
            _pub_subject(event, subject)
            _pub_reply(event, reply)
            _pub_payload(event, payload)
            append(event)

        try:
            self.feed_into(data, on_pub, append)
        except ProtocolError as err:
            err.events = events
            raise
        return events

    def feed_into(self, data: bytes, on_pub: OnPub, on_event: OnEvent) -> None:
        """Like feed(), for the hot path: each PUB becomes `on_pub(subject, reply, payload)`
        and every other event `on_event(event)`, in stream order, with no Pub object built.

        The callbacks are the caller's; the parser stays pure. A ProtocolError is raised
        after the callbacks of the frames before it have run (its `events` is empty).
        """
        if self._dead:
            raise ProtocolError("parser closed", "parser closed after a fatal error",
                                send_err=False)
        try:
            data, start = self._resume(bytes(data), on_pub, on_event)
            if start >= 0:
                pos = self._parse(data, on_pub, on_event, start)
                if pos < len(data):
                    self._hold(data, pos)
                else:
                    self._consumed += pos
        except ProtocolError as err:
            self._dead = err.fatal
            raise

    def _resume(self, data: bytes, on_pub: OnPub, emit: OnEvent) -> tuple[bytes, int]:
        """Finish what earlier feeds held. Returns the bytes to parse and where to start,
        with `_consumed` then the stream offset of their byte 0; or start -1 when the new
        bytes were all held or skipped (`_consumed` already accounts for them)."""
        if self._skip is not None:
            nl = data.find(b"\n")
            if nl < 0:
                self._consumed += len(data)
                return data, -1
            if self._skip is not True:
                emit(self._skip)  # type: ignore[arg-type]
            self._skip = None
            return data, nl + 1  # nothing else is held while skipping
        if self._chunks:
            return self._finish_frame(data, on_pub, emit)
        if self._tail:
            if b"\n" not in data:
                self._tail += data
                self._check_partial()
                return data, -1
            data = self._tail + data
            self._tail = b""
        return data, 0

    def _finish_frame(self, data: bytes, on_pub: OnPub, emit: OnEvent) -> tuple[bytes, int]:
        """Complete the held frame with the first bytes of data and parse it alone: the
        rest of data is parsed in place instead of being copied behind the held part."""
        have = self._have
        k = self._need - have
        if len(data) < k:
            self._chunks.append(data)
            self._have += len(data)
            if self._have == self._need - 1 and data and data[-1] != 13:
                raise self._error(ERR_UNKNOWN_OP, data, len(data) - 1, "payload end")
            return data, -1
        self._chunks.append(data[:k])
        frame = b"".join(self._chunks)
        self._chunks = []
        self._have = self._need = 0
        end = self._parse(frame, on_pub, emit, 0)
        if end == len(frame):
            self._consumed += have  # now the offset of data[0]
            return data, k
        # Not one whole frame after all (cannot happen with unchanged limits): fall back
        # to parsing the remainder and the new bytes together.
        self._consumed += end
        self._need = 0
        return frame[end:] + data[k:], 0

    def _hold(self, data: bytes, pos: int) -> None:
        """Keep the incomplete frame starting at pos for the next feed()."""
        self._consumed += pos
        rest = data[pos:]
        if self._need:
            self._chunks = [rest]
            self._have = len(rest)
        else:
            self._tail = rest
            self._check_partial()

    def _check_partial(self) -> None:
        """Validate an unterminated line early, like nats-server's byte-wise parser."""
        tail = self._tail
        head = tail[:8].upper()
        if not _op_prefix_ok(head):
            raise self._error(ERR_UNKNOWN_OP, tail, 0, "op")
        for word, event in _SKIP_OPS.items():
            if head.startswith(word):
                # nats-server ignores the rest of these lines without buffering it.
                self._skip = True if event is None else event
                self._consumed += len(tail)
                self._tail = b""
                return
        word = next(w for w, _ in _OPS if head.startswith(w) or w.startswith(head))
        size = len(tail) - len(word) - 1 - (1 if tail.endswith(b"\r") else 0)
        if size > self.max_control_line:
            raise self._error(ERR_MAX_CONTROL_LINE, tail, 0, "control line")

    def _error(self, message: str, data: bytes, at: int, state: str, *,
               send_err: bool = True, reason: str = "") -> ProtocolError:
        snippet = data[at : at + _SNIPPET]
        detail = (f"{reason or message}: state={state} offset={self._consumed + at} "
                  f"proto={snippet!r}")
        return ProtocolError(message if send_err else (reason or message), detail,
                             send_err=send_err)

    def _parse(self, data: bytes, on_pub: OnPub, emit: OnEvent, pos: int) -> int:
        """Parse complete frames from data[pos:]; return where the first incomplete one
        starts."""
        n = len(data)
        find = data.find
        startswith = data.startswith
        mcl = self.max_control_line
        max_payload = self.max_payload
        if max_payload < 0:
            max_payload = 1 << 62  # negative means no limit
        # Publishers repeat the same control line ("PUB subj 128\r\n") frame after frame:
        # when the bytes at pos are exactly the last PUB line, its parse is reused and a
        # frame costs one startswith(). The line holds a single LF (its last byte), so a
        # match also means the same line boundary. Kept per call: limits may change.
        native = _NATIVE
        line = b""  # the last PUB line; ll == 0 while there is none
        lines = _lines
        ll = size = 0
        subject = ""
        reply: str | None = None
        while pos < n:
            if ll == 0 or not (_same(data, pos, line, ll) if native else startswith(line, pos)):
                nl = _find_lf(data, pos, n) if native else find(b"\n", pos)
                if nl < 0:
                    return pos
                # A line seen before (by any connection): its parse is one dict lookup.
                key = data[pos : nl + 1]
                hit = lines.get(key)
                if hit is not None and hit.arglen <= mcl and hit.size <= max_payload:
                    subject, reply, size = hit.subject, hit.reply, hit.size
                elif startswith(b"PUB ", pos):
                    # First PUB with this line: the slow path handles every variant and
                    # produces the errors; this handles the usual shape.
                    parsed = self._pub_line(data, pos, nl, mcl, max_payload)
                    if parsed is None:
                        pos = self._slow(data, pos, nl, on_pub, emit)
                        if pos < 0:
                            return -pos - 1
                        continue
                    subject, reply, size = parsed.subject, parsed.reply, parsed.size
                    if len(lines) >= _LINES_MAX:
                        lines.clear()
                    lines[key] = parsed
                elif startswith(b"PING", pos):
                    emit(_PING)
                    pos = nl + 1
                    continue
                else:
                    pos = self._slow(data, pos, nl, on_pub, emit)
                    if pos < 0:
                        return -pos - 1
                    # A CONNECT may have tightened the limits (its account's max_payload):
                    # the frames after it in this read obey the new ones, as in nats-server.
                    mcl = self.max_control_line
                    max_payload = self.max_payload
                    if max_payload < 0:
                        max_payload = 1 << 62
                    ll = 0
                    continue
                line = key
                ll = nl + 1 - pos
            # The frame whose control line is `line` (ll bytes) starts at pos.
            start = pos + ll
            stop = start + size
            if stop + 2 > n:
                return self._incomplete(data, pos, stop)
            if data[stop] != 13 or data[stop + 1] != 10:
                raise self._error(ERR_UNKNOWN_OP, data, stop, "MSG_END")
            on_pub(subject, reply, data[start:stop])
            pos = stop + 2
        return pos

    @staticmethod
    def _pub_line(
        data: bytes, pos: int, nl: int, mcl: int, max_payload: int
    ) -> _Line | None:
        """The parse of a well-formed "PUB " line; None for the slow path."""
        end = nl - 1 if data[nl - 1] == 13 else nl
        line = data[pos + 4 : end]
        args = line.split()
        nargs = len(args)
        if nargs == 2:
            subject, digits = args
            reply = None
        elif nargs == 3:
            subject, reply, digits = args
        else:
            return None
        if (
            end - pos - 4 > mcl
            or 13 in line  # nats-server keeps a CR inside a token
            or not digits.isdigit()
            or len(digits) > _MAX_SIZE_DIGITS
            or (size := int(digits)) > max_payload
        ):
            return None  # errors, and lines nats-server splits differently
        try:
            return _Line(subject.decode(), reply.decode() if reply is not None else None,
                         size, end - pos - 4)
        except UnicodeDecodeError:
            return _Line(_text(subject), _text(reply) if reply is not None else None, size,
                         end - pos - 4)

    def _incomplete(self, data: bytes, pos: int, stop: int) -> int:
        """A frame whose payload has not fully arrived: remember its size, stop parsing."""
        if stop < len(data) and data[stop] != 13:
            raise self._error(ERR_UNKNOWN_OP, data, stop, "MSG_END")
        self._need = stop + 2 - pos
        return pos

    def _arg_error(self, reason: str, data: bytes, pos: int, end: int) -> ProtocolError:
        arg_start = pos
        while arg_start < end and data[arg_start] not in _SEP:
            arg_start += 1
        arg = data[arg_start:end].lstrip(_SEP)
        return self._error("", data, pos, "ARG", send_err=False,
                           reason=f"{reason}: {_quote(arg)}")

    def _payload_error(self, size: int, data: bytes, pos: int) -> ProtocolError:
        return self._error(ERR_MAX_PAYLOAD, data, pos, "ARG",
                           reason=f"maximum payload exceeded: {size} vs {self.max_payload}")

    def _slow(self, data: bytes, pos: int, nl: int, on_pub: OnPub, emit: OnEvent) -> int:
        """Every line but the fast paths. Returns the next pos, or -(pos+1) if incomplete."""
        end = _line_end(data, pos, nl)
        head = data[pos : pos + 8].upper()
        if head.startswith(b"PUB"):
            return self._pub(data, pos, nl, self._arg(data, pos, end, 3), on_pub)
        if head.startswith(b"HPUB"):
            return self._hpub(data, pos, nl, self._arg(data, pos, end, 4), emit)
        if head.startswith(b"SUB"):
            emit(self._sub(self._arg(data, pos, end, 3), data, pos, end))
            return nl + 1
        if head.startswith(b"UNSUB"):
            emit(self._unsub(self._arg(data, pos, end, 5), data, pos, end))
            return nl + 1
        for word, event in _SKIP_OPS.items():
            if head.startswith(word):
                if event is not None:
                    emit(event)
                return nl + 1
        if head.startswith(b"CONNECT"):
            options = self._json(decode_connect, self._arg(data, pos, end, 7, False), data, pos)
            if "headers" in options:
                self._client_headers = bool(options["headers"])
            emit(Connect(options))
            return nl + 1
        if head.startswith(b"INFO"):
            self._json(decode_info, self._arg(data, pos, end, 4, False), data, pos)
            return nl + 1
        if head.startswith(b"-ERR"):
            arg = self._arg(data, pos, end, 4)
            raise self._error("", data, pos, "MINUS_ERR_ARG", send_err=False,
                              reason=f"Client Error {arg.strip(_SEP).decode('utf-8', 'replace')}")
        raise self._error(ERR_UNKNOWN_OP, data, pos, "OP_START")

    def _arg(self, data: bytes, pos: int, end: int, oplen: int, sep: bool = True) -> bytes:
        """The argument part of a line after its op word, with the limit checks."""
        if sep and (pos + oplen >= end or data[pos + oplen] not in _SEP):
            raise self._error(ERR_UNKNOWN_OP, data, pos, "OP")
        if end - pos - oplen - 1 > self.max_control_line:
            raise self._error(ERR_MAX_CONTROL_LINE, data, pos, "ARG")
        return data[pos + oplen : end]

    def _json(self, decode: Any, arg: bytes, data: bytes, pos: int) -> Any:
        try:
            return decode(arg)
        except _BadJson as exc:
            raise self._error("", data, pos, "JSON_ARG", send_err=False, reason=str(exc)) from None

    def _pub(self, data: bytes, pos: int, nl: int, arg: bytes, on_pub: OnPub) -> int:
        end = _line_end(data, pos, nl)
        args = _split_pub(arg)
        if len(args) not in (2, 3):
            raise self._arg_error("processPub Parse Error", data, pos, end)
        size = _size(args[-1])
        if size < 0:
            raise self._arg_error("processPub Bad or Missing Size", data, pos, end)
        if size > self.max_payload >= 0:
            raise self._payload_error(size, data, pos)
        start = nl + 1
        stop = start + size
        if stop + 2 > len(data):
            return -self._incomplete(data, pos, stop) - 1
        if data[stop : stop + 2] != b"\r\n":
            raise self._error(ERR_UNKNOWN_OP, data, stop, "MSG_END")
        reply = _text(args[1]) if len(args) == 3 else None
        on_pub(_text(args[0]), reply, data[start:stop])
        return stop + 2

    def _hpub(self, data: bytes, pos: int, nl: int, arg: bytes, emit: OnEvent) -> int:
        end = _line_end(data, pos, nl)
        if not (self.headers and self._client_headers):
            raise self._error("", data, pos, "HPUB_ARG", send_err=False, reason=ERR_HEADERS)
        args = _split_pub(arg)
        if len(args) not in (3, 4):
            raise self._arg_error("processHeaderPub Parse Error", data, pos, end)
        hdr = _size(args[-2])
        if hdr < 0:
            raise self._arg_error("processHeaderPub Bad or Missing Header Size", data, pos, end)
        total = _size(args[-1])
        if total < 0:
            raise self._arg_error("processHeaderPub Bad or Missing Total Size", data, pos, end)
        if hdr > total:
            raise self._arg_error("processHeaderPub Header Size larger then TotalSize",
                                  data, pos, end)
        if total > self.max_payload >= 0:
            raise self._payload_error(total, data, pos)
        start = nl + 1
        stop = start + total
        if stop + 2 > len(data):
            return -self._incomplete(data, pos, stop) - 1
        if data[stop : stop + 2] != b"\r\n":
            raise self._error(ERR_UNKNOWN_OP, data, stop, "MSG_END")
        event = _new(HPub)
        _hpub_subject(event, _text(args[0]))
        _hpub_reply(event, _text(args[1]) if len(args) == 4 else None)
        _hpub_headers(event, data[start : start + hdr])
        _hpub_payload(event, data[start + hdr : stop])
        emit(event)
        return stop + 2

    def _sub(self, arg: bytes, data: bytes, pos: int, end: int) -> Sub:
        args = arg.split()
        if len(args) == 2:
            return Sub(_text(args[0]), None, _text(args[1]))
        if len(args) == 3:
            return Sub(_text(args[0]), _text(args[1]), _text(args[2]))
        raise self._arg_error("processSub Parse Error", data, pos, end)

    def _unsub(self, arg: bytes, data: bytes, pos: int, end: int) -> Unsub:
        args = arg.split()
        if len(args) == 1:
            return Unsub(_text(args[0]), None)
        if len(args) == 2:
            # nats-server treats a missing, unparsable or non-positive max alike:
            # unsubscribe now. None carries all three.
            limit = _size(args[1])
            return Unsub(_text(args[0]), limit if limit > 0 else None)
        raise self._arg_error("processUnsub Parse Error", data, pos, end)
