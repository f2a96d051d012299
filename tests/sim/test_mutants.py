"""The fast mutants (tests/sim/mutants.py) must be killed by a named invariant.

Each starts at the seed that killed it in the full run (a few seeds of
slack, in case an unrelated change moved the schedule). The whole set runs
by hand: `PYTHONPATH=$PWD python -m tests.sim.mutants`.
"""

from __future__ import annotations

import pytest

from tests.sim.checkers import NAMES
from tests.sim.mutants import MUTANTS, run_mutant

FAST = [m for m in MUTANTS if m.fast]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mutant", FAST, ids=[m.name for m in FAST])
def test_fast_mutant_is_killed_by_a_named_invariant(mutant) -> None:
    v = run_mutant(mutant, seeds=40, budget_s=300, first=mutant.hint)
    assert v.get("killed"), f"{mutant.name} survived: {v}"
    assert v["invariant"] in NAMES, v


def test_the_unmutated_code_survives_the_fast_seeds() -> None:
    """The same runner on the unmutated package kills nothing (no false kills)."""
    for m in FAST:
        if m.sim == "real":
            v = run_mutant(None, seeds=1, budget_s=120, sim="real", first=m.hint)
            assert not v.get("killed"), v
