"""Parser alone, per message: interpreted vs mypyc-compiled, 1,000 alternating subjects vs one.

    PYTHONPATH=$PWD python benchmarks/parser_forms_bench.py [pure|compiled]
    PYTHONPATH=<older checkout> python benchmarks/parser_forms_bench.py pure   # before/after

A 2,000-frame buffer of 128 B PUBs (the server_bound.py publisher's) is fed in 64 KB
chunks with a no-op callback; CPU time (process_time, best of 5), so other tenants'
load changes it less than wall time would.
"""

from __future__ import annotations

import sys
import time

PAYLOAD = b"x" * 128


def main(which: str) -> None:
    if which == "compiled":
        from node.protocol.native import compiled_parser
        parser_cls = compiled_parser()
        if parser_cls is None:
            raise SystemExit("not built: python -m node.protocol.build_native")
    else:
        from node.protocol.parser import Parser as parser_cls
    res = []
    for subjects in (1000, 1):
        buf = b"".join(b"PUB bench.%d 128\r\n%s\r\n" % ((i * 7919) % subjects, PAYLOAD)
                       for i in range(2000))
        chunks = [buf[i:i + 65536] for i in range(0, len(buf), 65536)]
        best = 1e9
        for _ in range(5):
            p = parser_cls()
            t = time.process_time()
            for _ in range(40):
                for c in chunks:
                    p.feed_into(c, lambda s, r, pl: None, print)
            best = min(best, (time.process_time() - t) / 80000 * 1e6)
        res.append(f"{subjects} subjects {best:.3f} us/msg")
    print(which, "; ".join(res))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "pure")
