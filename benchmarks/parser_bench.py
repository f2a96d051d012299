"""Micro-benchmark of the pure protocol parser and MSG writer (not run in CI).

    python benchmarks/parser_bench.py [n_msgs] [payload_size] [chunk_size]

Feeds n PUB frames of payload_size bytes in chunk_size pieces and prints msgs/s;
then times writer.msg for the same payloads.
"""

from __future__ import annotations

import sys
import time

from node.protocol import writer
from node.protocol.parser import Parser


def bench_parse(n: int, size: int, chunk: int) -> float:
    frame = b"PUB bench.subject.foo %d\r\n%b\r\n" % (size, b"x" * size)
    stream = frame * n
    chunks = [stream[i : i + chunk] for i in range(0, len(stream), chunk)]
    parser = Parser()
    count = 0
    start = time.perf_counter()
    for piece in chunks:
        count += len(parser.feed(piece))
    elapsed = time.perf_counter() - start
    assert count == n, count
    return n / elapsed


def bench_msg(n: int, size: int) -> float:
    payload = b"x" * size
    encode = writer.msg
    start = time.perf_counter()
    for _ in range(n):
        encode("bench.subject.foo", b"1", None, payload)
    return n / (time.perf_counter() - start)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    chunk = int(sys.argv[3]) if len(sys.argv) > 3 else 65536
    print(f"parse PUB {size}B in {chunk}B chunks: {bench_parse(n, size, chunk):,.0f} msgs/s")
    print(f"writer.msg {size}B: {bench_msg(n, size):,.0f} msgs/s")


if __name__ == "__main__":
    main()
