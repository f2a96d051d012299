"""STREAM.SNAPSHOT / STREAM.RESTORE: the snapshot byte stream and the API bodies, pure.

The chunks a client receives are Jetraft's own format (nats-server sends a compressed tar of
its file store; a backup restores into the kind of server that made it):

    zlib( b"JRSNAP1\\n"
          u32 header_len | header JSON {"config", "consumers": [{"name","config","state"}],
                                        "last_seq", "last_ts"}
          per message: 0x01 | seq u64 | ts i64 | subject_len u16 | hdr_len u32 | data_len u32
                       | subject | hdr | data
          0x00 | crc32 u32 of every byte above )

    for chunk in SnapshotWriter(header).chunks(messages, chunk_size): ...
    reader = SnapshotReader(); reader.feed(chunk) ...; reader.finish()
    reader.header, reader.take()   # messages decoded so far

A reader refuses a wrong magic, a short stream, trailing bytes and a CRC mismatch with
SnapshotError: a damaged backup never restores half a stream.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from node.jetstream import gojson
from node.jetstream.ops import RestoredMsg

MAGIC = b"JRSNAP1\n"
DEFAULT_CHUNK = 256 * 1024  # nats-server's default snapshot chunk size
WINDOW = 32 * 1024 * 1024   # bytes sent and not yet acknowledged before waiting
_LEN = struct.Struct("<I")
_REC = struct.Struct("<QqHII")
SNAPSHOT_TYPE = "io.nats.jetstream.api.v1.stream_snapshot_response"
RESTORE_TYPE = "io.nats.jetstream.api.v1.stream_restore_response"
SNAPSHOT_REQUEST = gojson.struct("server.JSApiStreamSnapshotRequest", {
    "deliver_subject": gojson.STRING, "no_consumers": gojson.BOOL,
    "chunk_size": gojson.scalar("int"), "jsck": gojson.BOOL})


class SnapshotError(ValueError):
    """A snapshot stream that is not one this code wrote, or was damaged."""


class SnapshotWriter:
    def __init__(self, header: dict[str, Any]) -> None:
        self._z = zlib.compressobj(6)
        self._crc = 0
        head = json.dumps(header, separators=(",", ":")).encode()
        self._pending = [self._raw(MAGIC + _LEN.pack(len(head)) + head)]

    def _raw(self, data: bytes) -> bytes:
        self._crc = zlib.crc32(data, self._crc)
        return self._z.compress(data)

    def chunks(self, messages: Iterable[RestoredMsg], chunk_size: int = DEFAULT_CHUNK
               ) -> Iterator[bytes]:
        """Compressed chunks of at most `chunk_size` bytes (the last may be shorter)."""
        size = max(chunk_size, 1024)
        buf = bytearray(b"".join(self._pending))
        for m in messages:
            subject = m.subject.encode()
            buf += self._raw(b"\x01" + _REC.pack(m.seq, m.ts_ns, len(subject), len(m.hdr),
                                                 len(m.data)) + subject + m.hdr + m.data)
            while len(buf) >= size:
                yield bytes(buf[:size])
                del buf[:size]
        crc = self._crc
        buf += self._z.compress(b"\x00" + _LEN.pack(crc)) + self._z.flush()
        while buf:
            yield bytes(buf[:size])
            del buf[:size]


class SnapshotReader:
    def __init__(self) -> None:
        self._z = zlib.decompressobj()
        self._buf = bytearray()
        self._crc = 0
        self.header: dict[str, Any] | None = None
        self._msgs: list[RestoredMsg] = []
        self.done = False

    def feed(self, chunk: bytes) -> None:
        try:
            self._buf += self._z.decompress(chunk)
        except zlib.error as exc:
            raise SnapshotError(f"not a snapshot stream: {exc}") from exc
        self._parse()

    def take(self) -> list[RestoredMsg]:
        out, self._msgs = self._msgs, []
        return out

    def finish(self) -> None:
        try:
            self._buf += self._z.flush()
        except zlib.error as exc:
            raise SnapshotError(f"snapshot stream damaged: {exc}") from exc
        self._parse()
        if not self.done or not self._z.eof:
            raise SnapshotError("snapshot stream ends early")
        if self._buf or self._z.unused_data:
            raise SnapshotError("snapshot stream has trailing bytes")

    def _consume(self, n: int) -> bytes:
        data = bytes(self._buf[:n])
        del self._buf[:n]
        self._crc = zlib.crc32(data, self._crc)
        return data

    def _parse(self) -> None:
        while not self.done:
            if self.header is None:
                if len(self._buf) < len(MAGIC) + _LEN.size:
                    return
                if bytes(self._buf[:len(MAGIC)]) != MAGIC:
                    raise SnapshotError("not a Jetraft snapshot (wrong magic)")
                (size,) = _LEN.unpack_from(self._buf, len(MAGIC))
                if len(self._buf) < len(MAGIC) + _LEN.size + size:
                    return
                raw = self._consume(len(MAGIC) + _LEN.size + size)[len(MAGIC) + _LEN.size:]
                try:
                    self.header = json.loads(raw)
                except ValueError as exc:
                    raise SnapshotError("snapshot header is not JSON") from exc
                continue
            if not self._buf:
                return
            if self._buf[0] == 0:
                if len(self._buf) < 1 + _LEN.size:
                    return
                want = self._crc  # the CRC covers everything before the end mark
                self._consume(1)
                (crc,) = _LEN.unpack(bytes(self._buf[:_LEN.size]))
                del self._buf[:_LEN.size]
                if crc != want:
                    raise SnapshotError("snapshot checksum mismatch")
                self.done = True
                return
            if self._buf[0] != 1 or len(self._buf) < 1 + _REC.size:
                if self._buf[0] != 1:
                    raise SnapshotError(f"unknown snapshot record {self._buf[0]}")
                return
            seq, ts, sl, hl, dl = _REC.unpack_from(self._buf, 1)
            total = 1 + _REC.size + sl + hl + dl
            if len(self._buf) < total:
                return
            rec = memoryview(self._consume(total))[1 + _REC.size:]
            self._msgs.append(RestoredMsg(seq, ts, bytes(rec[:sl]).decode(),
                                          bytes(rec[sl:sl + hl]), bytes(rec[sl + hl:])))


def restore_subject(stream: str, token: str) -> str:
    return f"$JS.SNAPSHOT.RESTORE.{stream}.{token}"


def ack_subject(stream: str, token: str) -> str:
    return f"$JS.SNAPSHOT.ACK.{stream}.{token}"
