"""Child process for test_store_crash: applies a deterministic log to an LmdbStore stream in
batches and prints the last applied index after each batch has committed (the moment a node
would consider those entries applied)."""

from __future__ import annotations

import sys

from node.jetstream.store.lmdbstore import LmdbStore, NodeEnv
from node.jetstream.stream import Stream
from tests.jetstream.crash_log import BATCH, entries, stream_config


def main(path: str) -> None:
    env = NodeEnv(path)
    stream = Stream(stream_config(), LmdbStore(env, "C"))
    log = entries()
    start = stream.applied
    for at in range(start, len(log), BATCH):
        stream.apply_batch(log[at:at + BATCH])
        print(stream.applied, flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
