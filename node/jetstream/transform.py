"""Subject transform validation (stream `subject_transform`, `republish`, source transforms).

Only the checks nats-server makes when a stream config is created or updated: a source must be a
valid subject, a destination may only refer to wildcards the source has, and only with known
functions. Applying a transform to a subject belongs to the stream state machine.
"""

from __future__ import annotations

import re

from node.subject import FWC, PWC, valid_subject

_DOLLAR = re.compile(r"^\$(\d+)$")
_FUNC = re.compile(r"^\{\{\s*([A-Za-z]+)\s*\((.*)\)\s*\}\}$")
_FUNCTIONS = frozenset({
    "wildcard", "partition", "splitfromleft", "splitfromright", "slicefromleft",
    "slicefromright", "split", "left", "right", "random",
})


class TransformError(ValueError):
    """The text nats-server puts after `stream transform: ` and its siblings."""


def wildcard_count(source: str) -> int:
    return sum(1 for token in source.split(".") if token in (PWC, FWC))


def validate_mapping(source: str, destination: str) -> None:
    """Raise TransformError unless `source` -> `destination` is a usable mapping."""
    if destination == "":
        return
    if source == "" or not valid_subject(source):
        raise TransformError("invalid subject")
    wildcards = wildcard_count(source)
    for token in destination.split("."):
        _check_token(token, wildcards)


def _check_token(token: str, wildcards: int) -> None:
    dollar = _DOLLAR.match(token)
    if dollar:
        _check_index(int(dollar.group(1)), wildcards, token)
        return
    func = _FUNC.match(token)
    if func is None:
        if "{{" in token:
            raise TransformError(f"invalid mapping destination: unknown function in {token}")
        return
    name = func.group(1).lower()
    if name not in _FUNCTIONS:
        raise TransformError(f"invalid mapping destination: unknown function in {token}")
    if name == "wildcard":
        argument = func.group(2).strip()
        if not argument.isdigit():
            raise TransformError(f"invalid mapping destination: wildcard index out of range in "
                                 f"{token}")
        _check_index(int(argument), wildcards, token)


def _check_index(index: int, wildcards: int, token: str) -> None:
    if index < 1 or index > wildcards:
        raise TransformError(f"invalid mapping destination: wildcard index out of range in {token}")


def apply_mapping(source: str, destination: str, subject: str) -> str | None:
    """`subject` mapped by `source` -> `destination`; None when `source` does not match it.

    Supports what stream transforms and republish use most: `*` wildcards referenced as `$N`
    or `{{wildcard(N)}}`, and a trailing `>` carried over to a trailing `>` of the destination.
    An empty destination keeps the subject.
    """
    src_tokens = (source or FWC).split(".")
    tokens = subject.split(".")
    captured: list[str] = []
    tail: list[str] = []
    for i, token in enumerate(src_tokens):
        if token == FWC:
            if i >= len(tokens):
                return None
            tail = tokens[i:]
            break
        if i >= len(tokens) or (token != PWC and token != tokens[i]):
            return None
        if token == PWC:
            captured.append(tokens[i])
    else:
        if len(tokens) != len(src_tokens):
            return None
    if not destination:
        return subject
    out: list[str] = []
    for token in destination.split("."):
        out.extend(_map_token(token, captured, tail))
    return ".".join(out)


def _map_token(token: str, captured: list[str], tail: list[str]) -> list[str]:
    if token == FWC:
        return tail
    dollar = _DOLLAR.match(token)
    if dollar:
        return [captured[int(dollar.group(1)) - 1]]
    func = _FUNC.match(token)
    if func and func.group(1).lower() == "wildcard":
        return [captured[int(func.group(2).strip()) - 1]]
    return [token]
