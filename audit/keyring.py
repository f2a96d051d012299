"""The key of stores encrypted at rest (`jetstream { key, cipher }`, docs/jetstream.md
"Encryption at rest"), as the audit uses it.

The audit is given the master key (`--key-file`, or `--config` naming the node's config
file) and checks it on the driver against every encrypted node's key file before Spark
starts: a wrong key or another cipher stops the audit (exit 2), so sealed bytes are never
compared as if they were data. The executors then open WAL payloads and LMDB values through
node/jetstream/crypt.py, read-only (the key file is never rewritten, nothing is sealed).

A `Keyring` travels to the executors inside the task closures: the master key with it (on a
real cluster, turn on Spark's RPC encryption, `spark.network.crypto.enabled`). The opened
ciphers are rebuilt in each executor process, never pickled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

# node/jetstream/crypt.py KEY_FILE: present in a store encrypted at rest.
KEY_FILE = "crypt"
# Value of an LMDB record or WAL payload that does not open: it differs from any replay.
UNOPENED = b"\x00jetraft-audit: does not decrypt\x00"


class KeyringError(ValueError):
    """The key given does not open a store (or none was given for an encrypted one)."""


def store_of(wal: str) -> str:
    """The JetStream store directory of a WAL directory (`<store>/raft/wal`)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(wal)))


def encrypted(store_dir: str) -> bool:
    return os.path.exists(os.path.join(store_dir, KEY_FILE))


@dataclass
class Keyring:
    """The master key, its cipher (None: what each key file says), and the store directory
    of every encrypted node (by the node name the findings use)."""

    key: str
    cipher: str | None = None
    stores: dict[str, str] = field(default_factory=dict)
    # The previous key of a rotation (a config's jetstream.prev_key): tried as the node tries
    # it, for a store not started since its key changed. A rotated store opens with `key`.
    prev_key: str | None = None
    _opened: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"key": self.key, "cipher": self.cipher, "stores": self.stores,
                "prev_key": self.prev_key}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _opened={})

    def check(self, node: str, store_dir: str) -> None:
        """Driver side: the key opens this node's store, else KeyringError (clear text)."""
        from node.jetstream.crypt import KeyFileError, open_readonly

        try:
            self._opened[node] = open_readonly(store_dir, self.key, self.cipher,
                                               self.prev_key)
        except KeyFileError as e:
            raise KeyringError(str(e).removesuffix(": refusing to start")) from None
        self.stores[node] = store_dir

    def crypt(self, node: str) -> Any:
        """The node's opened StoreCrypt, or None for a store in the clear."""
        if node not in self.stores:
            return None
        opened = self._opened.get(node)
        if opened is None:
            from node.jetstream.crypt import open_readonly

            opened = self._opened[node] = open_readonly(self.stores[node], self.key,
                                                        self.cipher, self.prev_key)
        return opened

    def tokens(self) -> Any:
        """The index tokens (subjects, msg ids in LMDB keys): derived from the stores' shared
        secret (the key they were created with, kept through rotations), one for every node
        of a cluster."""
        for node in sorted(self.stores):
            return self.crypt(node).tokens
        return None


def load_key(key_file: str | None, config: str | None, cipher: str | None
             ) -> tuple[str, str | None, str | None] | None:
    """(master key, cipher, previous key) from the command line: `--key-file` (the key, one
    line; a trailing newline is not part of it) or `--config` (a node config's jetstream
    block, its prev_key included). None: no key given. Raises KeyringError on an unusable
    source."""
    if key_file and config:
        raise KeyringError("give --key-file or --config, not both")
    if cipher is not None:
        from node.jetstream.crypt import parse_cipher

        name = parse_cipher(cipher)
        if name is None:
            raise KeyringError(f"Unknown cipher type: \"{cipher}\"")
        cipher = name
    prev_key = None
    if key_file:
        with open(key_file, encoding="utf-8") as f:
            key = f.read().rstrip("\r\n")
    elif config:
        from node.config import ConfigError, load_options

        try:
            js = load_options(config).jetstream
        except ConfigError as e:
            raise KeyringError(str(e)) from None
        if not js.key:
            raise KeyringError(f"{config}: no jetstream.key in this config")
        key, cipher, prev_key = js.key, cipher or js.cipher, js.prev_key
    else:
        if cipher is not None:
            raise KeyringError("--cipher needs a key (--key-file or --config)")
        return None
    if not key:
        raise KeyringError("the key is empty")
    return key, cipher, prev_key
