"""What the audit reports, and the row layouts its Spark stages exchange.

A finding names what it could of node, group, index and term; `severity` is
`violation` (a promise was broken, or fsynced data is unreadable: the exit
code is non-zero) or `note` (worth knowing, breaks nothing: a torn tail past
the last fsync, a range the audit could not check).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

VIOLATION = "violation"
NOTE = "note"

# Finding kinds. Reading:
CORRUPT_RECORD = "corrupt_record"  # unreadable bytes with durable data after them
TORN_TAIL = "torn_tail"  # unreadable bytes at the end of the newest segment
SEGMENT_MISSING = "segment_missing"  # a segment number skipped (a repair or torn roll does that)
SNAPSHOT_META_BAD = "snapshot_meta_bad"
HISTORY_TRUNCATED = "history_truncated"  # segments deleted, no archive: a range not checked
# Raft safety:
LOG_MATCHING = "log_matching"  # same group, index and term; different payloads
TERM_REGRESSION = "term_regression"  # a term lower than the one before it in a log
TWO_LEADERS = "two_leaders"  # a term starts at two different indexes
VOTE_CHANGED = "vote_changed"  # a node voted for two candidates in one term
COMMITTED_MISMATCH = "committed_mismatch"  # committed prefixes hold different terms
COMMITTED_MISSING = "committed_missing"  # a node lacks an entry its own commit covers
PREFIX_MISSING = "prefix_missing"  # entries lost before the log's first entry, not compacted
# Acknowledged writes:
ACKED_MISSING = "acked_missing"
ACKED_DUPLICATED = "acked_duplicated"
ACKED_MISPLACED = "acked_misplaced"  # committed once, but not at the index the client was told
ACKED_UNCHECKED = "acked_unchecked"  # not found, but part of the log could not be checked
# Replay hooks (audit/hooks.py):
STORE_MISMATCH = "store_mismatch"  # a node's store differs from the replayed committed log
STORE_UNCHECKED = "store_unchecked"  # a store or range the replay could not compare (note)
META_MISMATCH = "meta_mismatch"  # a node's stream catalogue differs from the replayed meta log
META_ENTRY_BAD = "meta_entry_bad"  # a committed meta entry the replay cannot read

# Record types that carry an entry: ENTRY, and COPY (6, an entry copied forward at a
# segment roll by storage versions that write it; see audit/logpass.py).
ENTRY_TYPES = (1, 6)
DIGEST_BYTES = 16  # first 16 bytes of sha256(payload): payloads compare by digest only

# The record rows the reader emits (one per valid WAL record), in this order.
RECORD_FIELDS = ("node", "seg", "off", "rtype", "grp", "term", "idx", "etype", "plen",
                 "digest", "vote", "conf")
# The log pass emits tagged rows: tag E = an entry that survives in the node's log
# (carries seg/off so a replay hook can read its payload back); other tags are
# small (one per group and node, per gap, per term) and go to the driver.
PASS_FIELDS = ("tag", "node", "grp", "idx", "term", "digest", "etype", "seg", "off", "info")


@dataclass(frozen=True)
class Finding:
    kind: str
    severity: str
    detail: str
    node: str | None = None
    group: str | None = None
    index: int | None = None
    term: int | None = None
    index_hi: int | None = None  # a range of indexes ends here (inclusive)
    nodes: list[str] = field(default_factory=list)  # other nodes involved

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != []}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Finding:
        return Finding(**d)
