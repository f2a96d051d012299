"""Encryption at rest for a JetStream store: keys, nonces and sealed records (docs/jetstream.md,
"Encryption at rest").

`jetstream { key: ..., cipher: chacha | aes }` names a master key. Nothing is encrypted with it
directly: every use derives its own key with HKDF-SHA256.

* Per store: `<store_dir>/crypt` (the key file, no secret in it) holds a random 32-byte salt,
  the cipher, a key check and an epoch. The WAL and LMDB keys are HKDF(master, salt, purpose),
  so two nodes configured with the same key still encrypt with different keys.
* Per file: a snapshot image gets a fresh random salt in its header and its own key
  HKDF(master, file salt, "file"); any node with the same master key can read it, which is
  what a Raft snapshot sent to a follower needs.

Nonces (96 bits) are never reused under one key:

* WAL and LMDB records: epoch (u32) | counter (u64). The epoch is raised and the key file
  fsynced (written, fsynced, renamed, directory fsynced) at every start BEFORE the first seal,
  so a crash or restart can never repeat an (epoch, counter) pair; the counter is per process.
* Files: the key is fresh per file (random salt), so the chunk number is the nonce.

Records are AEAD-sealed (ChaCha20-Poly1305 or AES-256-GCM from `cryptography`) with the place
they belong to as associated data (group/index/term for the WAL, the LMDB key), so a ciphertext
moved elsewhere fails to open. A failed open is `SealError`: callers report it as corruption,
never serve it as data.
"""

from __future__ import annotations

import hmac
import itertools
import os
import secrets
import struct
import zlib
from collections.abc import Callable
from typing import Any, BinaryIO, TypeVar

T = TypeVar("T")

KEY_FILE = "crypt"
NONCE = 12
TAG = 16
OVERHEAD = NONCE + TAG
_KF_MAGIC = b"JRCRYPT1\n"
_KF = struct.Struct("<B32s32sI")  # cipher id, salt, key check, epoch
_CIPHER_IDS = {"chacha": 1, "aes": 2}
DISPLAY = {"chacha": "ChaCha20-Poly1305", "aes": "AES-GCM"}  # as nats-server logs them


class SealError(ValueError):
    """A sealed record or file that does not open: damaged, moved, or another key."""


class KeyFileError(ValueError):
    """The store and the configured key do not match: the node must not start."""


def parse_cipher(value: str) -> str | None:
    """nats-server 2.15's spellings (checked with `nats-server -t`): chacha, chachapoly, aes,
    any case. None: unknown."""
    low = value.lower()
    if low in ("chacha", "chachapoly"):
        return "chacha"
    if low == "aes":
        return "aes"
    return None


def _aead(cipher: str, key: bytes) -> Any:
    # Imported here: only a node with a key needs the library (missing -> [FTL] at start).
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

    return (ChaCha20Poly1305 if cipher == "chacha" else AESGCM)(key)


def _invalid_tag() -> type[Exception]:
    from cryptography.exceptions import InvalidTag

    return InvalidTag


def derive(master: bytes, salt: bytes, purpose: str, cipher: str) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    info = f"jetraft/{purpose}/{cipher}".encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(master)


class Nonces:
    """epoch | counter. `itertools.count` steps atomically under the GIL, so threads (the
    apply worker, the WAL writer on the loop) never draw the same value."""

    def __init__(self, epoch: int) -> None:
        self._prefix = struct.pack(">I", epoch)
        self._count = itertools.count()

    def next(self) -> bytes:
        return self._prefix + next(self._count).to_bytes(8, "big")


class Sealer:
    """AEAD over records: `seal(data, aad)` -> nonce | ciphertext | tag; `open` reverses it."""

    overhead = OVERHEAD

    def __init__(self, cipher: str, key: bytes, nonces: Nonces) -> None:
        self._aead = _aead(cipher, key)
        self._invalid = _invalid_tag()
        self._nonces = nonces

    def seal(self, data: bytes, aad: bytes) -> bytes:
        nonce = self._nonces.next()
        return nonce + self._aead.encrypt(nonce, bytes(data), aad)

    def open(self, blob: bytes, aad: bytes) -> bytes:
        if len(blob) < OVERHEAD:
            raise SealError("sealed record too short")
        try:
            return self._aead.decrypt(bytes(blob[:NONCE]), bytes(blob[NONCE:]), aad)
        except self._invalid:
            raise SealError("sealed record fails authentication (damaged, moved, "
                            "or another key)") from None


class StoreCrypt:
    """The opened key file of one store: its record sealers and the file codec."""

    def __init__(self, master: bytes, cipher: str, salt: bytes, epoch: int) -> None:
        self.master = master
        self.cipher = cipher
        self.epoch = epoch
        nonces = Nonces(epoch)
        self.wal = Sealer(cipher, derive(master, salt, "wal", cipher), nonces)
        self.lmdb = Sealer(cipher, derive(master, salt, "lmdb", cipher), nonces)
        self.files = FileCodec(master, cipher)
        # No store salt: a stream image (keys included) moves between nodes as it is.
        self.tokens = IndexTokens(derive(master, b"", "index", cipher))


class IndexTokens:
    """Subjects and msg ids inside LMDB KEYS (the per-subject index, the dedup table) become
    HMAC-SHA256 tokens, 16 bytes: lookups by exact subject still work, the names do not show.
    A bounded cache spares the HMAC on a stream's hot subjects."""

    SIZE = 16
    CACHE = 4096

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._cache: dict[tuple[bytes, str], bytes] = {}

    def _token(self, domain: bytes, name: str) -> bytes:
        hit = self._cache.get((domain, name))
        if hit is None:
            if len(self._cache) >= self.CACHE:
                self._cache.clear()
            mac = hmac.new(self._key, domain + name.encode(), "sha256").digest()
            hit = self._cache[(domain, name)] = mac[:self.SIZE]
        return hit

    def subject(self, subject: str) -> bytes:
        return self._token(b"s\x00", subject)

    def msg_id(self, msg_id: str) -> bytes:
        return self._token(b"m\x00", msg_id)


def _check_value(master: bytes, salt: bytes, cipher: str) -> bytes:
    return derive(master, salt, "key-check", cipher)


def _has_data(store_dir: str) -> bool:
    wal = os.path.join(store_dir, "raft", "wal")
    if os.path.isdir(wal) and any(n.startswith("wal-") for n in os.listdir(wal)):
        return True
    return os.path.exists(os.path.join(store_dir, "lmdb", "data.mdb"))


def open_store(store_dir: str, key: str | None, cipher: str) -> StoreCrypt | None:
    """Check the configured key against the store and raise the epoch, durably, before any
    record is sealed. Raises KeyFileError (the node stops, nothing on disk changed) for: a
    wrong key, another cipher, an encrypted store without a key, an unencrypted store with
    one. A fresh store with a key gets its key file first. None: no encryption."""
    path = os.path.join(store_dir, KEY_FILE)
    exists = os.path.exists(path)
    if key is None:
        if exists:
            raise KeyFileError(f"the store {store_dir} is encrypted at rest, and no "
                               "jetstream.key is configured: refusing to start")
        return None
    master = key.encode()
    if not exists:
        if _has_data(store_dir):
            raise KeyFileError(f"the store {store_dir} holds unencrypted data and a "
                               "jetstream.key is configured: converting a store is not "
                               "supported; refusing to start")
        salt, epoch = secrets.token_bytes(32), 0
    else:
        salt, epoch = _read_key_file(path, master, cipher)
    if epoch >= 0xFFFFFFFF:
        raise KeyFileError(f"{path}: nonce epochs used up; re-create the store")
    _write_key_file(path, cipher, salt, _check_value(master, salt, cipher), epoch + 1)
    return StoreCrypt(master, cipher, salt, epoch + 1)


def _parse_key_file(path: str) -> tuple[str, bytes, bytes, int]:
    """(cipher, salt, key check, epoch) of a key file; KeyFileError when damaged."""
    with open(path, "rb") as f:
        raw = f.read()
    body = raw[len(_KF_MAGIC):-4]
    if (not raw.startswith(_KF_MAGIC) or len(body) != _KF.size
            or zlib.crc32(raw[:-4]) != struct.unpack("<I", raw[-4:])[0]):
        raise KeyFileError(f"{path} is damaged: refusing to start")
    cid, salt, check, epoch = _KF.unpack(body)
    stored = next((n for n, i in _CIPHER_IDS.items() if i == cid), f"#{cid}")
    return stored, salt, check, epoch


def _read_key_file(path: str, master: bytes, cipher: str) -> tuple[bytes, int]:
    stored, salt, check, epoch = _parse_key_file(path)
    if stored != cipher:
        raise KeyFileError(f"the store {os.path.dirname(path)} is encrypted with cipher "
                           f"{stored!r}, the configuration says {cipher!r}: refusing to start")
    if not hmac.compare_digest(check, _check_value(master, salt, cipher)):
        raise KeyFileError(f"the configured jetstream.key does not open the store "
                           f"{os.path.dirname(path)} (wrong key): refusing to start")
    return salt, epoch


class _NoNonces(Nonces):
    """A read-only view (the audit) never seals: drawing a nonce is a bug, not a reuse."""

    def __init__(self) -> None:
        super().__init__(0)

    def next(self) -> bytes:
        raise RuntimeError("a store opened read-only must not seal")


def open_readonly(store_dir: str, key: str, cipher: str | None = None) -> StoreCrypt:
    """The store's keys for READING (the audit): the key file is checked, never written, and
    the returned sealers refuse to seal. `cipher` None: the one the key file names.
    KeyFileError: no key file, a damaged one, a wrong key, or another cipher."""
    path = os.path.join(store_dir, KEY_FILE)
    if not os.path.exists(path):
        raise KeyFileError(f"the store {store_dir} is not encrypted at rest (no {KEY_FILE} "
                           "file)")
    stored = _parse_key_file(path)[0]
    salt, epoch = _read_key_file(path, key.encode(), cipher or stored)
    out = StoreCrypt(key.encode(), cipher or stored, salt, epoch)
    nonces = _NoNonces()
    out.wal._nonces = nonces
    out.lmdb._nonces = nonces
    return out


def _write_key_file(path: str, cipher: str, salt: bytes, check: bytes, epoch: int) -> None:
    body = _KF_MAGIC + _KF.pack(_CIPHER_IDS[cipher], salt, check, epoch)
    body += struct.pack("<I", zlib.crc32(body))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


# ---- files (snapshot images) ---------------------------------------------------------------

FILE_MAGIC = b"JRENC1\n"
FILE_CHUNK = 64 << 10
_CHUNK_LEN = struct.Struct("<I")


class FileCodec:
    """Sealed files: magic | salt 16 | chunks (u32 length | ciphertext+tag). Chunk i is sealed
    with nonce i under the file's own key; the last chunk's AAD says so (a file cut at a chunk
    boundary fails instead of reading as a shorter image)."""

    def __init__(self, master: bytes, cipher: str) -> None:
        self._master = master
        self._cipher = cipher

    def _aead(self, salt: bytes) -> Any:
        return _aead(self._cipher, derive(self._master, salt, "file", self._cipher))

    def writer(self, f: BinaryIO) -> SealedWriter:
        salt = secrets.token_bytes(16)
        f.write(FILE_MAGIC + salt)
        return SealedWriter(f, self._aead(salt))

    def reader(self, f: BinaryIO) -> SealedReader:
        """`f` positioned after FILE_MAGIC."""
        salt = f.read(16)
        if len(salt) != 16:
            raise SealError("sealed file truncated")
        return SealedReader(f, self._aead(salt))


def _nonce(i: int) -> bytes:
    return i.to_bytes(NONCE, "big")


def _aad(last: bool) -> bytes:
    return b"last" if last else b"more"


class SealedWriter:
    def __init__(self, f: BinaryIO, aead: Any) -> None:
        self._f = f
        self._aead = aead
        self._buf = bytearray()
        self._n = 0

    def write(self, data: bytes) -> int:
        self._buf += data
        while len(self._buf) > FILE_CHUNK:
            self._emit(bytes(self._buf[:FILE_CHUNK]), False)
            del self._buf[:FILE_CHUNK]
        return len(data)

    def _emit(self, piece: bytes, last: bool) -> None:
        sealed = self._aead.encrypt(_nonce(self._n), piece, _aad(last))
        self._n += 1
        self._f.write(_CHUNK_LEN.pack(len(sealed)) + sealed)

    def close(self) -> None:
        """Seals the last chunk (possibly empty); the caller flushes and fsyncs `f`."""
        self._emit(bytes(self._buf), True)
        self._buf.clear()


class SealedReader:
    def __init__(self, f: BinaryIO, aead: Any) -> None:
        self._f = f
        self._aead = aead
        self._invalid = _invalid_tag()
        self._buf = b""
        self._pos = 0
        self._n = 0
        self._done = False

    def _next(self) -> None:
        head = self._f.read(_CHUNK_LEN.size)
        if len(head) != _CHUNK_LEN.size:
            raise SealError("sealed file truncated")
        size = _CHUNK_LEN.unpack(head)[0]
        sealed = self._f.read(size)
        if len(sealed) != size:
            raise SealError("sealed file truncated")
        for last in (False, True):
            try:
                plain = self._aead.decrypt(_nonce(self._n), sealed, _aad(last))
            except self._invalid:
                continue
            self._n += 1
            self._buf = self._buf[self._pos:] + plain
            self._pos = 0
            self._done = last
            if last and self._f.read(1):
                raise SealError("sealed file has bytes after its last chunk")
            return
        raise SealError("sealed file fails authentication (damaged, or another key)")

    def read(self, n: int = -1) -> bytes:
        while not self._done and (n < 0 or len(self._buf) - self._pos < n):
            self._next()
        end = len(self._buf) if n < 0 else min(self._pos + n, len(self._buf))
        out = self._buf[self._pos:end]
        self._pos = end
        return out


def write_file(codec: FileCodec | None, f: BinaryIO, fill: Callable[[Any], T]) -> T:
    """`fill(out)` writes a file's content to `out`: `f` itself, or a SealedWriter over it.
    The caller flushes and fsyncs `f` afterwards."""
    if codec is None:
        return fill(f)
    out = codec.writer(f)
    result = fill(out)
    out.close()
    return result


def read_file(codec: FileCodec | None, f: BinaryIO) -> Any:
    """A readable (`read(n)`) over `f`'s plaintext. An encrypted store reads only sealed files
    (or empty ones: the empty state), so nothing unencrypted slips in through a snapshot."""
    head = f.read(len(FILE_MAGIC))
    if head == FILE_MAGIC:
        if codec is None:
            raise SealError("this snapshot file is encrypted and no jetstream.key is set")
        return codec.reader(f)
    if codec is not None and head:
        raise SealError("an unencrypted snapshot file in an encrypted store (every node of "
                        "a cluster needs the same jetstream.key)")
    f.seek(0)
    return f
