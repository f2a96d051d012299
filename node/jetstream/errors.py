"""nats-server's JetStream API errors, kept as data in `errors.json`.

Every reply error a JetStream API handler or the stream state machine returns is an `ApiError`,
built from a row of the table by name. The table is the single place where codes and texts live,
so a test can check the whole table and a handler can never invent a code.

    ApiError.of("JSStreamNotFoundErr").to_json()
    -> {"error": {"code": 404, "err_code": 10059, "description": "stream not found"}}
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _load() -> dict[str, tuple[int, int, str]]:
    raw = json.loads(resources.files(__package__).joinpath("errors.json").read_text())
    table: dict[str, tuple[int, int, str]] = {}
    for name, row in raw.items():
        if name.startswith("_"):
            continue
        code, err_code, template = row
        table[name] = (int(code), int(err_code), str(template))
    return table


ERRORS: dict[str, tuple[int, int, str]] = _load()


class ApiError(Exception):
    """One JetStream API error: what goes into a reply's `error` object."""

    def __init__(self, name: str, code: int, err_code: int, description: str) -> None:
        super().__init__(description)
        self.name = name
        self.code = code
        self.err_code = err_code
        self.description = description

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ApiError) and self.to_dict() == other.to_dict()

    __hash__ = Exception.__hash__

    @classmethod
    def of(cls, name: str, **values: Any) -> ApiError:
        """The error `name` with its template's placeholders filled from `values`.

        A missing placeholder value is a programming error, so it raises KeyError rather than
        sending a reply with a literal `{err}` in it."""
        code, err_code, template = ERRORS[name]
        description = _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)
        return cls(name, code, err_code, description)

    def to_dict(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "err_code": self.err_code,
                          "description": self.description}}

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()

    def __str__(self) -> str:
        return f"{self.description} ({self.err_code})"


def invalid_config(text: str) -> ApiError:
    """The config validation error (10052) with nats-server's free-form text."""
    return ApiError.of("JSStreamInvalidConfigF", err=text)


class StartRefused(ValueError):
    """JetStream refuses to start, in nats-server's own [FTL] words (logged verbatim)."""
