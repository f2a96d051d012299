"""The deterministic Raft log the crash test replays (shared by the test and its child)."""

from __future__ import annotations

import json

from node.jetstream import config, ops

BATCH = 25
COUNT = 3000
T0 = 1_700_000_000_000_000_000


def stream_config() -> config.Config:
    body = json.dumps({"name": "C", "subjects": ["c.*"], "max_msgs": 1500,
                       "max_msgs_per_subject": 400, "allow_rollup_hdrs": True}).encode()
    cfg, pedantic = config.parse_request(body)
    return config.check_create("C", cfg, pedantic, {})[0]


def entries() -> list[tuple[int, bytes]]:
    out = []
    for i in range(1, COUNT + 1):
        hdr = b"NATS/1.0\r\nNats-Msg-Id: m%d\r\n\r\n" % (i % 500)
        op: ops.Op = ops.StreamMsg(T0 + i * 1000, f"c.{i % 7}", "r", hdr, b"p" * (i % 300))
        if i % 97 == 0:
            op = ops.Purge(T0 + i * 1000, "c.3", keep=5)
        out.append((i, ops.encode(op)))
    return out
