"""Child process for test_store_crash: applies a deterministic log to an LmdbStore stream in
batches; after every third batch it reads the applied index, syncs the environment
(`NodeEnv.sync`, what a snapshot does before the WAL is compacted) and prints the index read.
Commits in between are not fsynced: a reopened store rolls back to the last sync point, and
the log (here: the test) re-applies the rest."""

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
    for n, at in enumerate(range(start, len(log), BATCH)):
        stream.apply_batch(log[at:at + BATCH])
        if n % 3 == 2:
            index = stream.applied
            env.sync()
            print(index, flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
