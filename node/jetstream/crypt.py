"""Encryption at rest for a JetStream store: keys, nonces and sealed records (docs/jetstream.md,
"Encryption at rest").

`jetstream { key: ..., cipher: chacha | aes }` names a master key. Nothing is encrypted with it
directly (envelope keys):

* Per store: `<store_dir>/crypt` (the key file) holds a random 32-byte salt, the cipher, an
  epoch, and two secrets wrapped (AEAD) under a key derived from the master key: the store's
  own data secret (WAL and LMDB keys: HKDF(root, salt, purpose)) and the cluster's shared
  secret (snapshot files, index tokens: they travel between nodes as they are).
* Key rotation (`prev_key`): the key file opens with `key`, else `prev_key`, and is rewritten
  wrapped under `key` in one rename; no record, file or token changes.
* A v1 key file (before envelope keys) has root = shared = the master key: its data reads as
  the v1 code sealed it, and its first start rewrites the key file as v2.
* Per file: a snapshot image gets a fresh random salt in its header and its own key
  HKDF(shared, file salt, "file"); any node of the cluster can read it, which is what a Raft
  snapshot sent to a follower needs.

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
import signal
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

T = TypeVar("T")

KEY_FILE = "crypt"
NONCE = 12
TAG = 16
OVERHEAD = NONCE + TAG
_KF_MAGIC = b"JRCRYPT1\n"
_KF = struct.Struct("<B32s32sI")  # v1: cipher id, salt, key check, epoch
_KF2_MAGIC = b"JRCRYPT2\n"
_KF2 = struct.Struct("<B32sI16sH")  # v2: cipher id, salt, epoch, wrap salt, wrapped length
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
    """The opened key file of one store: its record sealers and the file codec.

    `root` is the store's data secret (WAL and LMDB keys), `shared` the secret every node of
    a cluster holds alike (snapshot files and index tokens travel between nodes). A store
    made before envelope keys (key file v1) has both equal to the key it was created with,
    so its data reads as it did; rotation never changes either (docs/jetstream.md "Key
    rotation")."""

    def __init__(self, root: bytes, cipher: str, salt: bytes, epoch: int,
                 shared: bytes | None = None) -> None:
        self.root = root
        self.shared = root if shared is None else shared
        self.cipher = cipher
        self.salt = salt
        self.epoch = epoch
        self.rotated = False  # set by open_store: the key file was re-wrapped at this start
        nonces = Nonces(epoch)
        self.wal = Sealer(cipher, derive(root, salt, "wal", cipher), nonces)
        self.lmdb = Sealer(cipher, derive(root, salt, "lmdb", cipher), nonces)
        self.files = FileCodec(self.shared, cipher)
        # No store salt: a stream image (keys included) moves between nodes as it is.
        self.tokens = IndexTokens(derive(self.shared, b"", "index", cipher))


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


@dataclass(frozen=True)
class KeyFile:
    """A parsed key file. v1 (before envelope keys): the key check of the creating key.
    v2: the store's secrets wrapped (AEAD) under a key derived from the configured key;
    `aad` is everything before `wrapped`, so cipher, salt and epoch are authenticated."""

    version: int
    cipher: str
    salt: bytes
    epoch: int
    check: bytes = b""
    wrap_salt: bytes = b""
    wrapped: bytes = b""
    aad: bytes = b""


def open_store(store_dir: str, key: str | None, cipher: str,
               prev_key: str | None = None) -> StoreCrypt | None:
    """Check the configured key against the store and raise the epoch, durably, before any
    record is sealed. `key` opens the key file, else `prev_key` (a rotation): the store's
    secrets are then wrapped under `key` in the same one-rename rewrite that raises the
    epoch, and no data record changes. Raises KeyFileError (the node stops, nothing on disk
    changed) for: neither key opens it, another cipher, an encrypted store without a key,
    an unencrypted store with one. A fresh store with a key gets its key file first.
    None: no encryption."""
    path = os.path.join(store_dir, KEY_FILE)
    exists = os.path.exists(path)
    if key is None:
        if exists:
            raise KeyFileError(f"the store {store_dir} is encrypted at rest, and no "
                               "jetstream.key is configured: refusing to start")
        return None
    if not exists:
        if _has_data(store_dir):
            raise KeyFileError(f"the store {store_dir} holds unencrypted data and a "
                               "jetstream.key is configured: converting a store is not "
                               "supported; refusing to start")
        # The shared secret is the cluster's: a node created after a rotation, with the old
        # key as prev_key, shares it with the nodes created before.
        root, shared = secrets.token_bytes(32), (prev_key or key).encode()
        salt, epoch, rotated = secrets.token_bytes(32), 0, False
    else:
        kf = _parse_key_file(path)
        root, shared, rotated = _unlock_for(path, kf, key, prev_key, cipher)
        salt, epoch = kf.salt, kf.epoch
    if epoch >= 0xFFFFFFFF:
        raise KeyFileError(f"{path}: nonce epochs used up; re-create the store")
    write_key_file(path, key.encode(), cipher, salt, epoch + 1, root, shared)
    out = StoreCrypt(root, cipher, salt, epoch + 1, shared)
    out.rotated = rotated
    return out


def _unlock_for(path: str, kf: KeyFile, key: str, prev_key: str | None,
                cipher: str | None) -> tuple[bytes, bytes, bool]:
    """(root, shared, opened by prev_key) of a key file, or KeyFileError (clear text)."""
    where = os.path.dirname(path)
    if cipher is not None and kf.cipher != cipher:
        raise KeyFileError(f"the store {where} is encrypted with cipher {kf.cipher!r}, the "
                           f"configuration says {cipher!r}: refusing to start")
    for candidate, rotated in ((key, False), (prev_key, True)):
        if candidate:
            secrets_ = _unlock(kf, candidate.encode())
            if secrets_ is not None:
                return secrets_[0], secrets_[1], rotated and candidate != key
    if prev_key:
        raise KeyFileError(f"neither jetstream.key nor jetstream.prev_key opens the store "
                           f"{where} (wrong key): refusing to start")
    raise KeyFileError(f"the configured jetstream.key does not open the store {where} "
                       "(wrong key; after changing the key, give the old one as "
                       "jetstream.prev_key): refusing to start")


def _unlock(kf: KeyFile, master: bytes) -> tuple[bytes, bytes] | None:
    """The store's (root, shared) secrets if `master` opens the key file, else None."""
    if kf.version == 1:
        ok = hmac.compare_digest(kf.check, _check_value(master, kf.salt, kf.cipher))
        return (master, master) if ok else None
    kek = _aead(kf.cipher, derive(master, kf.wrap_salt, "kek", kf.cipher))
    try:
        plain = kek.decrypt(bytes(NONCE), kf.wrapped, kf.aad)
    except _invalid_tag():
        return None
    rlen = struct.unpack_from("<H", plain)[0]
    root = plain[2:2 + rlen]
    slen = struct.unpack_from("<H", plain, 2 + rlen)[0]
    return root, plain[4 + rlen:4 + rlen + slen]


def _parse_key_file(path: str) -> KeyFile:
    """The key file, v1 or v2; KeyFileError when damaged (its CRC fails)."""
    with open(path, "rb") as f:
        raw = f.read()
    damaged = KeyFileError(f"{path} is damaged: refusing to start")
    if len(raw) < 4 or zlib.crc32(raw[:-4]) != struct.unpack("<I", raw[-4:])[0]:
        raise damaged
    if raw.startswith(_KF_MAGIC):
        body = raw[len(_KF_MAGIC):-4]
        if len(body) != _KF.size:
            raise damaged
        cid, salt, check, epoch = _KF.unpack(body)
        return KeyFile(1, _cipher_name(cid), salt, epoch, check=check)
    if raw.startswith(_KF2_MAGIC):
        head = raw[:len(_KF2_MAGIC) + _KF2.size]
        if len(head) != len(_KF2_MAGIC) + _KF2.size:
            raise damaged
        cid, salt, epoch, wrap_salt, wlen = _KF2.unpack(head[len(_KF2_MAGIC):])
        wrapped = raw[len(head):-4]
        if len(wrapped) != wlen:
            raise damaged
        return KeyFile(2, _cipher_name(cid), salt, epoch, wrap_salt=wrap_salt,
                       wrapped=wrapped, aad=head)
    raise damaged


def _cipher_name(cid: int) -> str:
    return next((n for n, i in _CIPHER_IDS.items() if i == cid), f"#{cid}")


class _NoNonces(Nonces):
    """A read-only view (the audit) never seals: drawing a nonce is a bug, not a reuse."""

    def __init__(self) -> None:
        super().__init__(0)

    def next(self) -> bytes:
        raise RuntimeError("a store opened read-only must not seal")


def open_readonly(store_dir: str, key: str, cipher: str | None = None,
                  prev_key: str | None = None) -> StoreCrypt:
    """The store's keys for READING (the audit): the key file is checked, never written, and
    the returned sealers refuse to seal. `cipher` None: the one the key file names.
    `prev_key`: also tried, as the node does (a store not started since its key changed).
    KeyFileError: no key file, a damaged one, a wrong key, or another cipher."""
    path = os.path.join(store_dir, KEY_FILE)
    if not os.path.exists(path):
        raise KeyFileError(f"the store {store_dir} is not encrypted at rest (no {KEY_FILE} "
                           "file)")
    kf = _parse_key_file(path)
    root, shared, _ = _unlock_for(path, kf, key, prev_key, cipher)
    out = StoreCrypt(root, kf.cipher, kf.salt, kf.epoch, shared)
    nonces = _NoNonces()
    out.wal._nonces = nonces
    out.lmdb._nonces = nonces
    return out


def key_file_bytes(master: bytes, cipher: str, salt: bytes, epoch: int, root: bytes,
                   shared: bytes) -> bytes:
    """A v2 key file. The wrapping key is fresh at every write (a new random wrap salt), so
    its one AEAD nonce is never reused under it."""
    wrap_salt = secrets.token_bytes(16)
    plain = (struct.pack("<H", len(root)) + root + struct.pack("<H", len(shared)) + shared)
    wlen = len(plain) + TAG
    head = _KF2_MAGIC + _KF2.pack(_CIPHER_IDS[cipher], salt, epoch, wrap_salt, wlen)
    kek = _aead(cipher, derive(master, wrap_salt, "kek", cipher))
    body = head + kek.encrypt(bytes(NONCE), plain, head)
    return body + struct.pack("<I", zlib.crc32(body))


def write_key_file(path: str, master: bytes, cipher: str, salt: bytes, epoch: int,
                   root: bytes, shared: bytes) -> None:
    """Durably replace the key file: the new bytes in `crypt.tmp`, fsync it, rename it over
    the key file, fsync the directory. A crash at any point leaves the old file or the new
    one whole (the rename is atomic), never a mix; the directory fsync makes the new one
    survive a power loss before anything is sealed under the epoch it names."""
    body = key_file_bytes(master, cipher, salt, epoch, root, shared)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(body)
        f.flush()
        _crash_point("written")
        os.fsync(f.fileno())
    _crash_point("synced")
    os.replace(tmp, path)
    _crash_point("renamed")
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    _crash_point("dir-synced")


# Tests only (tests/integration/test_key_rotation.py): the node kills itself with SIGKILL at
# the named step of a key file write, i.e. kill -9 at exactly that moment.
CRASH_ENV = "JETRAFT_TEST_KEYFILE_CRASH"


def _crash_point(step: str) -> None:
    if os.environ.get(CRASH_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


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
