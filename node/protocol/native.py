"""The compiled form of the parser, when it was built and matches the source.

`python -m node.protocol.build_native` compiles node/protocol/parser.py with mypyc
into the extension module `node.protocol.parser_c` (the same source, under another
name, so that the interpreted module stays importable and tested). This module says
which Parser the server uses: the compiled one, unless it is missing, was built from
another version of parser.py (a stale build must never run), or JETRAFT_PURE_PYTHON
is set.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("parser.py")
PURE_ENV = "JETRAFT_PURE_PYTHON"


def source_digest() -> str:
    """What a build records, and what the loader checks it against."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()


def compiled_parser() -> Any:
    """The compiled Parser class, or None (see the module docstring)."""
    if os.environ.get(PURE_ENV):
        return None
    try:
        from . import parser_c  # type: ignore[attr-defined]
    except Exception:  # missing, or a stale build whose module code fails: interpreted
        return None
    if getattr(parser_c, "SOURCE_SHA256", None) != source_digest():
        return None
    return parser_c.Parser
