"""Every mutant in the repository's mutation catalogues still applies to this tree.

A mutant is a text replacement that must match its file exactly once. When the guarded
code is rewritten, the text can stop matching, and the catalogue's runner then refuses
the mutant (or, in CI's fast subset, never runs it): the check it stood for is gone
without anyone seeing it (session 11 found `d1-stale-conf-after-snapshot` and
`ack-before-wal-fsync` in that state). This test reads every catalogue and fails on the
first anchor that no longer matches exactly once, naming the catalogue and the mutant.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import mutation_accounts, mutation_sys
from tests.cluster import mutants as cluster_mutants
from tests.durability import mutants as durability_mutants
from tests.jetstream import mutants as jetstream_mutants
from tests.raft import storage_mutants
from tests.sim import mutants as sim_mutants

ROOT = Path(__file__).resolve().parents[2]


def _anchors() -> Iterator[tuple[str, str, str]]:
    """(mutant id, file relative to the root, text that must occur once)."""
    for m in sim_mutants.MUTANTS:
        for file, old, _ in m.edits():
            yield f"sim:{m.name}", f"raft/{file}", old
    for m in storage_mutants.MUTANTS:
        yield f"storage:{m.name}", m.path, m.old
    for name, edits in durability_mutants.MUTANTS.items():
        for file, old, _ in edits:
            yield f"durability:{name}", file, old
    for name, (edits, _) in durability_mutants.OTHER.items():
        for file, old, _ in edits:
            yield f"durability:{name}", file, old
    for name, (edits, _, _) in cluster_mutants.MUTANTS.items():
        for file, old, _ in edits:
            yield f"cluster:{name}", file, old
    for name, file, old, _, _, *more in jetstream_mutants.MUTANTS:
        for text in (old, *more[::2]):
            yield f"jetstream:{name}", file, text
    for catalogue in (mutation_accounts, mutation_sys):
        for file, old, _, group, *more in catalogue.MUTANTS:
            mid = f"{catalogue.__name__}:{group}:{old[:40]}"
            yield mid, file, old
            for extra_file, extra_old, _ in (more[0] if more else ()):
                yield mid, extra_file, extra_old


ANCHORS = list(_anchors())


def test_the_catalogues_are_read() -> None:
    # Guards the reader itself: an empty or truncated walk would pass everything below.
    names = {a[0].split(":")[0] for a in ANCHORS}
    assert {"sim", "storage", "durability", "cluster", "jetstream"} <= names
    assert len(ANCHORS) > 60


@pytest.mark.parametrize("mutant,file,old", ANCHORS, ids=[f"{a[0]}@{i}" for i, a in
                                                         enumerate(ANCHORS)])
def test_every_mutant_anchor_matches_its_file_once(mutant: str, file: str, old: str) -> None:
    path = ROOT / file
    assert path.is_file(), f"{mutant}: {file} does not exist"
    count = path.read_text().count(old)
    assert count == 1, f"{mutant}: its text occurs {count} times in {file}: {old!r}"
