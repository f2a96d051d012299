"""Stream stores: the `StreamStore` interface, `MemStore` and `LmdbStore`."""

from node.jetstream.store.base import CorruptRecordError, StoredMsg, StreamStore

__all__ = ["CorruptRecordError", "StoredMsg", "StreamStore"]
