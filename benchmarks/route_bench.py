"""In-process micro-benchmark of the publish path: parser -> routing -> output
buffers, with no sockets (a do-nothing transport), so it measures our code only.

    python benchmarks/route_bench.py [n_msgs] [repeats] [scenario ...]

Scenarios (msgs per CPU second of this process, best of `repeats`):
  fast     one subject, one plain subscriber (the single-subscriber fast path)
  subjects 1,000 subjects, one subscriber each
  fanout   one subject, ten subscribers
  queue    one subject, a queue group of ten members
Not a test: numbers vary with the machine; compare runs made side by side.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from node.options import Options
from node.server import Server


class NullTransport:
    """The transport surface a client connection uses, doing nothing."""

    def write(self, data: Any) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        pass


def _client(server: Server) -> Any:
    c = server.make_client_protocol()
    c.connection_made(NullTransport())
    c.data_received(b'CONNECT {"verbose":false,"pedantic":false}\r\n')
    return c


def _stream(subjects: list[str], n: int, size: int = 16) -> list[bytes]:
    payload = b"x" * size
    frames = [b"PUB %b %d\r\n%b\r\n" % (s.encode(), size, payload) for s in subjects]
    data = b"".join(frames[i % len(frames)] for i in range(n))
    return [data[i:i + 65536] for i in range(0, len(data), 65536)]


def run(scenario: str, n: int) -> float:
    server = Server(Options(port=-1))
    pub = _client(server)
    subjects = ["bench.one"]
    if scenario == "subjects":
        subjects = [f"bench.{i}" for i in range(1000)]
    members = {"fast": 1, "subjects": 1, "fanout": 10, "queue": 10}[scenario]
    sink = _client(server)
    for i, subject in enumerate(subjects):
        for m in range(members):
            queue = " q" if scenario == "queue" else ""
            sink.data_received(b"SUB %b%b %d\r\n" % (subject.encode(), queue.encode(),
                                                   i * members + m + 1))
    chunks = _stream(subjects, n)
    sink.max_pending = 1 << 62
    start = time.process_time()
    for chunk in chunks:
        pub.data_received(chunk)
        sink.out.clear()
    elapsed = time.process_time() - start
    assert pub.in_msgs == n, pub.in_msgs
    return n / elapsed


SCENARIOS = ("fast", "subjects", "fanout", "queue")


async def main(n: int, repeats: int, scenarios: list[str]) -> None:
    for scenario in scenarios or SCENARIOS:
        best = max(run(scenario, n) for _ in range(repeats))
        print(f"{scenario:9s} {best / 1e6:6.3f} M msgs/s")


if __name__ == "__main__":
    nums = [int(a) for a in sys.argv[1:] if a.isdigit()]
    names = [a for a in sys.argv[1:] if not a.isdigit()]
    asyncio.run(main(nums[0] if nums else 300_000, nums[1] if len(nums) > 1 else 5, names))
