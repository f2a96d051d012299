"""The compiled parser (mypyc, node/protocol/build_native.py) against parser.py itself.

The server runs the compiled form when it is built; every other parser test imports
node.protocol.parser, the interpreted form. Here both parse the same mutated streams,
cut at the same places, and must agree on every event and every error (message, detail,
whether -ERR is sent). Skipped when no build exists, unless JETRAFT_REQUIRE_NATIVE is set
(.ci/run builds it and sets it).
"""

from __future__ import annotations

import os
import random

import pytest

from node.protocol import native
from node.protocol.errors import ProtocolError
from node.protocol.parser import Parser
from tests.unit.test_parser_fuzz import SEEDS, _mutate

Compiled = native.compiled_parser()
if Compiled is None:
    if os.environ.get("JETRAFT_REQUIRE_NATIVE"):
        raise RuntimeError("the compiled parser is missing or stale: "
                           "run python -m node.protocol.build_native")
    pytest.skip("compiled parser not built", allow_module_level=True)


def _outcome(cls: type, data: bytes, cuts: list[int], mp: int, mcl: int) -> list:
    parser = cls(max_payload=mp, max_control_line=mcl)
    out: list = []
    bounds = [0, *cuts, len(data)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        try:
            parser.feed_into(data[a:b], lambda s, r, p: out.append(("pub", s, r, p)),
                             out.append)
        except ProtocolError as err:
            out.append(("err", err.message, err.detail, err.send_err, err.fatal))
            return out
        out.append(("buffered", parser.buffered))
    return out


def test_the_compiled_parser_is_another_module_than_the_interpreted_one() -> None:
    assert Compiled is not Parser
    assert Compiled.__module__ == "node.protocol.parser_c"


def test_compiled_and_interpreted_agree_on_mutated_streams() -> None:
    rng = random.Random(2026)
    for _ in range(20000):
        data = bytearray(b"".join(rng.choice(SEEDS) for _ in range(rng.randint(1, 6))))
        for _ in range(rng.randint(0, 3)):
            _mutate(rng, data)
        raw = bytes(data)
        cuts = sorted(rng.sample(range(1, len(raw)), min(len(raw) - 1, rng.randint(0, 4)))) \
            if len(raw) > 1 else []
        mp, mcl = rng.choice([(1048576, 4096), (8, 4096), (1048576, 12)])
        assert _outcome(Compiled, raw, cuts, mp, mcl) == _outcome(Parser, raw, cuts, mp, mcl), raw


def test_many_subjects_agree() -> None:
    frames = b"".join(b"PUB many.%d %d\r\n%s\r\n" % (i % 97, i % 7, b"z" * (i % 7))
                      for i in range(3000))
    cuts = list(range(1000, len(frames), 4093))
    assert _outcome(Compiled, frames, cuts, 1048576, 4096) == \
        _outcome(Parser, frames, cuts, 1048576, 4096)


def test_a_stale_build_is_not_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    # parser.py edited after the build: its digest no longer matches the recorded one.
    monkeypatch.setattr(native, "source_digest", lambda: "0" * 64)
    assert native.compiled_parser() is None


def test_pure_python_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.PURE_ENV, "1")
    assert native.compiled_parser() is None
