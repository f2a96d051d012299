"""Subject mappings (transforms) as nats-server 2.15 applies them.

A *transform* rewrites a published subject that matches its source pattern
into a destination built from literal tokens, the source's `*` tokens
(`$1`, `{{wildcard(1)}}`), the tail matched by `>`, and mapping functions:
`partition`, `split`, `splitFromLeft/Right`, `sliceFromLeft/Right`,
`left`, `right` and `random`. A *mapping* is one source with one or more
weighted destinations, optionally scoped to a cluster; a `MappingTable` is an
account's ordered list of mappings, of which the first match applies (only
once: mappings are not applied recursively).

Behaviour was read off nats-server 2.15 (`nats-server -t` for validation,
a running server for results) and is pinned by `tests/unit/test_mapping.py`
and `tests/integration/test_mapping_diff.py`. Facts worth knowing:

* `partition(n, i...)` is FNV-1a 32 over the named wildcard tokens
  concatenated with no separator, modulo n; with no token list it hashes
  the whole subject.
* Wildcard indexes name the i-th `*` of the source; an index the source
  does not have but that is not above the count (0, negatives) falls back
  to the subject's first token, as the server's lookup does.
* Weights are percentages; when a mapping's weights sum to less than 100
  the rest of the traffic keeps its subject.

Everything is pure. Randomness (weights and `random(n)`) comes from the
`rng` the caller passes in, so tests seed it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from enum import Enum

from node.subject import FWC, PWC, SEP, subject_matches, subset

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193

_ERR_DEST = "invalid mapping destination"
ERR_BAD_SUBJECT = "invalid subject"
ERR_INVALID_TRANSFORM = f"{_ERR_DEST}: invalid transform"
ERR_UNKNOWN_FUNCTION = f"{_ERR_DEST}: unknown function"
ERR_INDEX_OUT_OF_RANGE = f"{_ERR_DEST}: wildcard index out of range"
ERR_NOT_ENOUGH_ARGS = f"{_ERR_DEST}: not enough arguments passed to the function"
ERR_TOO_MANY_ARGS = f"{_ERR_DEST}: too many arguments passed to the function"
ERR_INVALID_ARG = f"{_ERR_DEST}: function argument is invalid or in the wrong format"
ERR_IMPORT_FUNCTION = (f"{_ERR_DEST}: the only mapping function allowed for import transforms "
                       "is {{Wildcard()}}")
ERR_NOT_ALL_WILDCARDS = f"{_ERR_DEST}: not using all of the token wildcard(s)"
# Jetraft's own: nats-server 2.15 accepts an empty destination at load, then
# panics on the first message that matches it. We refuse it at load.
ERR_EMPTY_DESTINATION = f"{_ERR_DEST}: empty destination"


class MappingError(ValueError):
    """A transform or mapping nats-server would refuse; str() is its text."""


class Fn(Enum):
    LITERAL = "literal"
    TAIL = "tail"  # the destination's ">"
    WILDCARD = "wildcard"
    PARTITION = "partition"
    SPLIT_FROM_LEFT = "splitfromleft"
    SPLIT_FROM_RIGHT = "splitfromright"
    SLICE_FROM_LEFT = "slicefromleft"
    SLICE_FROM_RIGHT = "slicefromright"
    SPLIT = "split"
    LEFT = "left"
    RIGHT = "right"
    RANDOM = "random"


# Function names are matched as nats-server does: an unanchored search for
# "{{ name ( args ) }}", the first letter of each word in either case, and
# in this order (so "{{splitFromLeft(...)}}" is never taken for "split").
def _fn_re(name: str) -> re.Pattern[str]:
    words = re.findall(r"[A-Z][a-z]*", name)
    pattern = "".join(f"[{w[0].lower()}{w[0]}]{w[1:]}" for w in words)
    return re.compile(r"\{\{\s*" + pattern + r"\s*\((.*)\)\s*\}\}")


_FUNCTION_ORDER: tuple[tuple[Fn, re.Pattern[str]], ...] = (
    (Fn.WILDCARD, _fn_re("Wildcard")),
    (Fn.PARTITION, _fn_re("Partition")),
    (Fn.SPLIT_FROM_LEFT, _fn_re("SplitFromLeft")),
    (Fn.SPLIT_FROM_RIGHT, _fn_re("SplitFromRight")),
    (Fn.SLICE_FROM_LEFT, _fn_re("SliceFromLeft")),
    (Fn.SLICE_FROM_RIGHT, _fn_re("SliceFromRight")),
    (Fn.RIGHT, _fn_re("Right")),
    (Fn.LEFT, _fn_re("Left")),
    (Fn.SPLIT, _fn_re("Split")),
    (Fn.RANDOM, _fn_re("Random")),
)
_INDEX_INT_FNS = frozenset({Fn.SPLIT_FROM_LEFT, Fn.SPLIT_FROM_RIGHT, Fn.SLICE_FROM_LEFT,
                            Fn.SLICE_FROM_RIGHT, Fn.LEFT, Fn.RIGHT})
_ARG_SPLIT = re.compile(r",\s*")
_GO_INT = re.compile(r"[+-]?[0-9]+")
_WHITESPACE = frozenset(" \t\n\r\f")


@dataclass(frozen=True)
class Op:
    """One destination token: what to emit for it."""

    fn: Fn
    text: str = ""  # LITERAL: the token; SPLIT: the separator
    indexes: tuple[int, ...] = ()  # wildcard numbers (1-based) as written
    number: int = 0  # partitions, offset or slice size


def fnv1a32(data: bytes) -> int:
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h


def _atoi(text: str, limit: int) -> int | None:
    """Go's strconv.Atoi after trimming spaces; None if not a number in range."""
    t = text.strip(" ")
    if not _GO_INT.fullmatch(t):
        return None
    n = int(t)
    return n if -limit - 1 <= n <= limit else None


def _err(reason: str, token: str = "") -> MappingError:
    return MappingError(f"{reason} in {token}" if token else reason)


def _parse_function(token: str) -> Op:
    """A `{{...}}` destination token as an Op, or the server's error."""
    for fn, regex in _FUNCTION_ORDER:
        m = regex.search(token)
        if m:
            return _function_op(fn, _ARG_SPLIT.split(m.group(1)), token)
    raise _err(ERR_UNKNOWN_FUNCTION, token)


def _function_op(fn: Fn, args: list[str], token: str) -> Op:
    if fn is Fn.WILDCARD:
        if args == [""]:
            raise _err(ERR_NOT_ENOUGH_ARGS, token)
        if len(args) > 1:
            raise _err(ERR_TOO_MANY_ARGS, token)
        return Op(fn, indexes=(_index(args[0], token),))
    if fn is Fn.PARTITION:
        count = _int_arg(args[0], token)
        return Op(fn, indexes=tuple(_index(a, token) for a in args[1:]), number=count)
    if fn is Fn.RANDOM:
        if len(args) != 1:
            raise _err(ERR_NOT_ENOUGH_ARGS, token)  # sic: nats-server's text
        return Op(fn, number=_int_arg(args[0], token))
    if len(args) < 2:
        raise _err(ERR_NOT_ENOUGH_ARGS, token)
    if len(args) > 2:
        raise _err(ERR_TOO_MANY_ARGS, token)
    index = _index(args[0], token)
    if fn is Fn.SPLIT:
        if " " in args[1] or SEP in args[1]:
            raise _err(ERR_INVALID_ARG, token)
        return Op(fn, text=args[1], indexes=(index,))
    assert fn in _INDEX_INT_FNS, fn
    return Op(fn, indexes=(index,), number=_int_arg(args[1], token))


def _index(text: str, token: str) -> int:
    n = _atoi(text, INT64_MAX)
    if n is None:
        raise _err(ERR_INVALID_ARG, token)
    return n


def _int_arg(text: str, token: str) -> int:
    n = _atoi(text, INT32_MAX)
    if n is None:
        raise _err(ERR_INVALID_ARG, token)
    return n


def _parse_token(token: str) -> Op:
    if len(token) > 1 and token[0] == "$":
        n = _atoi(token[1:], INT64_MAX)
        # "$foo" is an ordinary literal: other features use "$" tokens.
        return Op(Fn.LITERAL, text=token) if n is None else Op(Fn.WILDCARD, indexes=(n,))
    if len(token) > 4 and token.startswith("{{") and token.endswith("}}"):
        return _parse_function(token)
    if token == FWC:
        return Op(Fn.TAIL)
    return Op(Fn.LITERAL, text=token)


def _subject_shape(subject: str) -> tuple[bool, list[str], int, bool]:
    """(valid, tokens, number of '*', ends in '>') as the server's subjectInfo."""
    if not subject:
        return False, [], 0, False
    tokens = subject.split(SEP)
    pwcs, fwc = 0, False
    for t in tokens:
        if not t or fwc:
            return False, [], 0, False
        if t == PWC:
            pwcs += 1
        elif t == FWC:
            fwc = True
    return True, tokens, pwcs, fwc


def _precheck_destination(dest: str) -> None:
    """Token checks the server makes on a mapping destination first."""
    after_fwc = False
    for t in dest.split(SEP):
        if not t or after_fwc:
            raise _err(ERR_INVALID_TRANSFORM, t)
        if len(t) > 4 and t.startswith("{{") and t.endswith("}}"):
            if not any(regex.search(t) for _, regex in _FUNCTION_ORDER):
                raise _err(ERR_UNKNOWN_FUNCTION, t)
            continue
        if t == FWC:
            after_fwc = True
        elif not _WHITESPACE.isdisjoint(t):
            raise MappingError(ERR_INVALID_TRANSFORM)


@dataclass(frozen=True)
class Transform:
    """A compiled source -> destination rewrite."""

    src: str
    dest: str
    ops: tuple[Op, ...]
    src_len: int  # tokens in the source, ">" included
    positions: tuple[tuple[int, int], ...]  # wildcard number -> token position

    def position(self, wildcard: int) -> int:
        # Unknown numbers read token 0, as the server's map lookup does.
        for number, pos in self.positions:
            if number == wildcard:
                return pos
        return 0

    def matches(self, subject: str) -> bool:
        return subject_matches(self.src, subject)

    def apply(self, subject: str, rng: random.Random | None = None) -> str | None:
        """The rewritten subject, or None if `subject` is not a literal
        subject matching the source."""
        tokens = subject.split(SEP)
        if any(not t or t in (PWC, FWC) for t in tokens):
            return None
        if not subject_matches(self.src, subject):
            return None
        return self.render(tokens, subject, rng)

    def render(self, tokens: list[str], subject: str, rng: random.Random | None) -> str:
        parts: list[str] = []
        for op in self.ops:
            if op.fn is Fn.TAIL:
                parts.extend(tokens[self.src_len - 1:])
                break
            parts.append(self._emit(op, tokens, subject, rng))
        return SEP.join(parts)

    def _emit(self, op: Op, tokens: list[str], subject: str, rng: random.Random | None) -> str:
        if op.fn is Fn.LITERAL:
            return op.text
        if op.fn is Fn.RANDOM:
            return str(_random_below(op.number, rng))
        if op.fn is Fn.PARTITION:
            return _partition(op, [tokens[self.position(i)] for i in op.indexes], subject)
        return _token_function(op, tokens[self.position(op.indexes[0])])


def _random_below(n: int, rng: random.Random | None) -> int:
    if n <= 0:
        return 0
    return (rng or random).randrange(n)


def _partition(op: Op, key_tokens: list[str], subject: str) -> str:
    key = "".join(key_tokens) if op.indexes else subject
    if op.number <= 0:
        return "0"  # nats-server would divide by zero; never a valid config in practice
    return str(fnv1a32(_b(key)) % op.number)


def _b(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _s(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _token_function(op: Op, token: str) -> str:
    """split / splitFrom* / sliceFrom* / left / right: nats-server counts bytes."""
    if op.fn is Fn.WILDCARD:
        return token
    if op.fn is Fn.SPLIT:
        return _split(token, op.text)
    raw = _b(token)
    n, size = op.number, len(raw)
    if not 0 < n < size:
        return token  # too short to cut: kept whole
    if op.fn is Fn.SPLIT_FROM_LEFT:
        return _s(raw[:n]) + SEP + _s(raw[n:])
    if op.fn is Fn.SPLIT_FROM_RIGHT:
        return _s(raw[: size - n]) + SEP + _s(raw[size - n:])
    if op.fn is Fn.LEFT:
        return _s(raw[:n])
    if op.fn is Fn.RIGHT:
        return _s(raw[size - n:])
    if op.fn is Fn.SLICE_FROM_LEFT:
        return SEP.join(_s(raw[i : i + n]) for i in range(0, size, n))
    assert op.fn is Fn.SLICE_FROM_RIGHT, op.fn
    first = size % n
    pieces = [raw[:first]] if first else []
    pieces += [raw[i : i + n] for i in range(first, size, n)]
    return SEP.join(_s(p) for p in pieces)


def _split(token: str, separator: str) -> str:
    # Empty pieces vanish: "-a--b-" split on "-" is "a.b".
    pieces = list(token) if separator == "" else token.split(separator)
    return SEP.join(p for p in pieces if p)


def compile_transform(src: str, dest: str, strict: bool = False) -> Transform:
    """Validate and compile; raises MappingError with nats-server's text.

    `strict` is for import/export remaps: only wildcard substitution, and
    every `*` of the source must be used.
    """
    src = src or FWC
    src_ok, stokens, pwcs, src_fwc = _subject_shape(src)
    dest_ok, dtokens, dest_pwcs, dest_fwc = _subject_shape(dest)
    if not src_ok or not dest_ok or dest_pwcs > 0 or src_fwc != dest_fwc:
        raise MappingError(ERR_BAD_SUBJECT)
    ops = tuple(_parse_token(t) for t in dtokens)
    _check_ops(ops, dtokens, pwcs, src_fwc, strict, dest)
    numbers = [i for i, t in enumerate(stokens) if t == PWC]
    positions = tuple((n + 1, pos) for n, pos in enumerate(numbers))
    return Transform(src, dest, ops, len(stokens), positions)


def _check_ops(ops: tuple[Op, ...], dtokens: list[str], pwcs: int, src_fwc: bool,
               strict: bool, dest: str) -> None:
    used = 0
    for op, token in zip(ops, dtokens, strict=True):
        if op.fn in (Fn.LITERAL, Fn.TAIL):
            continue
        if strict and op.fn is not Fn.WILDCARD:
            raise _err(ERR_IMPORT_FUNCTION, token)
        if pwcs == 0 and not src_fwc:
            if op.fn not in (Fn.RANDOM, Fn.PARTITION):
                raise _err(ERR_INDEX_OUT_OF_RANGE, token)
            continue
        used += len(op.indexes)
        for index in op.indexes:
            if index > pwcs:
                raise _err(ERR_INDEX_OUT_OF_RANGE, f"{token}: [{index}]")
    if strict and used < pwcs:
        raise _err(ERR_NOT_ALL_WILDCARDS, dest)


def validate_mapping_destination(src: str, dest: str) -> Transform:
    """What a `mappings {}` entry goes through: the destination's token
    checks, then the transform itself."""
    if not dest:
        raise MappingError(ERR_EMPTY_DESTINATION)
    _precheck_destination(dest)
    return compile_transform(src, dest)


# --------------------------------------------------------------------------
# Weighted, cluster-scoped mappings


@dataclass(frozen=True)
class Destination:
    transform: Transform
    weight: int  # percent, 0..100
    cluster: str | None = None


@dataclass(frozen=True)
class Mapping:
    src: str
    destinations: tuple[Destination, ...]
    literal: bool  # no wildcard in src: compare by equality

    def choose(self, rng: random.Random | None, cluster: str | None) -> Destination | None:
        """The destination for one message, or None: keep the subject.

        Destinations scoped to our cluster replace the unscoped ones."""
        scoped = [d for d in self.destinations if cluster is not None and d.cluster == cluster]
        dests = scoped or [d for d in self.destinations if d.cluster is None]
        if len(dests) == 1 and dests[0].weight == 100:
            return dests[0]
        roll = (rng or random).randrange(100)
        for d in dests:
            if roll < d.weight:
                return d
            roll -= d.weight
        return None


def _mapping_error(src: str, reason: str, dest: str | None) -> MappingError:
    to = f' to "{dest}"' if dest is not None else ""
    return MappingError(f'Error adding mapping for "{src}"{to} : {reason}')


def build_mapping(src: str, destinations: list[tuple[str, int, str | None]],
                  single: bool = False) -> Mapping:
    """A mapping from (destination, weight percent, cluster) triples.

    `single` is the plain `src: dest` form, whose errors also name dest.
    Raises MappingError with nats-server's "Error adding mapping" text."""
    seen: set[str] = set()
    totals: dict[str | None, int] = {}
    dests: list[Destination] = []
    for dest, weight, cluster in destinations:
        assert 0 <= weight <= 100, weight
        if dest in seen:
            raise _mapping_error(src, f'duplicate entry for "{dest}"', None)
        seen.add(dest)
        totals[cluster] = totals.get(cluster, 0) + weight
        if totals[cluster] > 100:
            raise _mapping_error(src, "total weight needs to be <= 100", None)
        try:
            transform = validate_mapping_destination(src, dest)
        except MappingError as e:
            raise _mapping_error(src, str(e), dest if single else None) from None
        dests.append(Destination(transform, weight, cluster))
    literal = PWC not in src.split(SEP) and FWC not in src.split(SEP)
    return Mapping(src, tuple(dests), literal)


class MappingTable:
    """An account's mappings; the first that matches a subject applies."""

    def __init__(self, mappings: list[Mapping] | None = None) -> None:
        self.mappings: list[Mapping] = list(mappings or [])

    def __bool__(self) -> bool:
        return bool(self.mappings)

    def __len__(self) -> int:
        return len(self.mappings)

    def add(self, mapping: Mapping) -> None:
        # A later entry for the same source replaces the earlier one.
        self.mappings = [m for m in self.mappings if m.src != mapping.src] + [mapping]

    def find(self, subject: str) -> Mapping | None:
        # A published subject may carry `*` / `>` tokens (nats-py's filtered
        # CONSUMER.CREATE does): nats-server's account mappings then take them as
        # tokens of a subset match, not as literals.
        wild = _has_wildcard_token(subject)
        for m in self.mappings:
            if m.literal:
                if m.src == subject:
                    return m
            elif subset(subject, m.src) if wild else subject_matches(m.src, subject):
                return m
        return None

    def apply(self, subject: str, rng: random.Random | None = None,
              cluster: str | None = None) -> str | None:
        """The mapped subject, or None when no mapping changes `subject`.

        The result may be a subject nobody can subscribe to (a `split` that
        leaves an empty token); nats-server then delivers to no one."""
        m = self.find(subject)
        if m is None:
            return None
        d = m.choose(rng, cluster)
        if d is None:
            return None
        tokens = subject.split(SEP)
        if not all(tokens):
            return None
        # Rendered as matched (nats-server's account mapping renders the tokens it
        # matched, wildcard tokens included; stream transforms keep the literal check).
        out = d.transform.render(tokens, subject, rng)
        return None if out == subject else out


def _has_wildcard_token(subject: str) -> bool:
    if PWC not in subject and FWC not in subject:
        return False
    return any(t in (PWC, FWC) for t in subject.split(SEP))


# --------------------------------------------------------------------------
# Import remaps: wildcards written as "*" and the reverse direction


def tokenize_wildcards(subject: str) -> str:
    """"foo.*.*" -> "foo.$1.$2": an import's `to` written with plain wildcards."""
    out, n = [], 0
    for t in subject.split(SEP):
        if t == PWC:
            n += 1
            out.append(f"${n}")
        else:
            out.append(t)
    return SEP.join(out)


def _is_placeholder(token: str) -> bool:
    if len(token) > 1 and token[0] == "$" and "1" <= token[1] <= "9":
        return True
    m = _FUNCTION_ORDER[0][1].search(token)  # wildcard(...)
    return bool(m) and len(_ARG_SPLIT.split(m.group(1))) == 1 and m.group(1) != ""


def untokenize(dest: str) -> str:
    """"foo.$2.{{wildcard(1)}}" -> "foo.*.*": the pattern a remap's output matches."""
    return SEP.join(PWC if _is_placeholder(t) else t for t in dest.split(SEP))


def reverse_transform(t: Transform) -> Transform:
    """The transform that undoes a strict (import) transform: a service
    import's remap runs from the importer's subject to the exporter's."""
    if all(op.fn in (Fn.LITERAL, Fn.TAIL) for op in t.ops):
        return compile_transform(t.dest, t.src, strict=True)
    src_tokens, placeholders = [], []
    for token in t.dest.split(SEP):
        if _is_placeholder(token):
            placeholders.append(token)
            src_tokens.append(PWC)
        else:
            src_tokens.append(token)
    dest_tokens = []
    for token in t.src.split(SEP):
        if token == PWC:
            assert placeholders, "a strict transform uses every wildcard"
            dest_tokens.append(placeholders.pop(0))
        else:
            dest_tokens.append(token)
    return compile_transform(SEP.join(src_tokens), SEP.join(dest_tokens), strict=True)
