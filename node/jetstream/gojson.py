"""Decode API request JSON the way nats-server's Go decoder does, errors included.

nats-server decodes each request into a Go struct with unknown fields refused. Clients see the
decoder's error text inside `invalid JSON: ...` (err_code 10025), so to answer as it does we
decode against a schema of Go types and produce the same texts:

- a syntax error stops everything: `invalid character 'x' looking for beginning of value at
  offset N` or `unexpected EOF`;
- an unknown field or a value of the wrong type is remembered and decoding goes on; the first
  one remembered is the error (Go's `saveError`);
- an enum whose own unmarshaller refuses the value stops decoding at once (Go returns a custom
  unmarshaller's error immediately), with the raw JSON quoted: `can not unmarshal "\\"bogus\\""`;
- keys match exactly first, then case-insensitively (Go's `EqualFold`); `null` leaves a plain
  field at its zero value but is handed to an enum's unmarshaller, which refuses it.

A schema is a dict `json name -> GoType`. The decoded value is plain Python data with the
canonical json names as keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

# Not strict (`jetstream { strict: false }`): a list that collects the unknown-field errors a
# decode in this context skipped, for the caller to log; None (the default): they refuse.
LENIENT: ContextVar[list[str] | None] = ContextVar("gojson_lenient", default=None)

_INT_RANGES = {
    "int64": (-(1 << 63), (1 << 63) - 1),
    "time.Duration": (-(1 << 63), (1 << 63) - 1),
    "int": (-(1 << 63), (1 << 63) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "uint64": (0, (1 << 64) - 1),
}


class GoJsonError(Exception):
    """The text nats-server puts after `invalid JSON: `."""


class _Int(int):
    raw: str


class _Float(float):
    raw: str


def _parse_int(text: str) -> _Int:
    value = _Int(int(text))
    value.raw = text
    return value


def _parse_float(text: str) -> _Float:
    value = _Float(float(text))
    value.raw = text
    return value


@dataclass(frozen=True)
class GoType:
    """One Go type: `kind` is a scalar name (`string`, `bool`, `int64`, `int32`, `int`,
    `uint64`, `time.Duration`, `any`), `slice`, `map` (of strings), `struct` or `enum`."""

    kind: str
    elem: GoType | None = None
    fields: dict[str, GoType] = field(default_factory=dict)
    name: str = ""  # Go's spelling of the type, used in error texts
    parse: Callable[[Any, str], Any] | None = None  # enum: raw value, raw json -> value


def scalar(kind: str) -> GoType:
    return GoType(kind, name=kind)


def slice_of(elem: GoType) -> GoType:
    return GoType("slice", elem=elem, name="[]" + elem.name)


def struct(name: str, fields: dict[str, GoType]) -> GoType:
    return GoType("struct", fields=fields, name=name)


def enum(name: str, parse: Callable[[Any, str], Any]) -> GoType:
    return GoType("enum", name=name, parse=parse)


STRING = scalar("string")
BOOL = scalar("bool")
MAP_STRING = GoType("map", elem=STRING, name="map[string]string")


def go_quote(text: str) -> str:
    """Go's %q for the ASCII texts that reach it here."""
    return json.dumps(text)


def decode(body: bytes, root: GoType) -> dict[str, Any]:
    """Decode `body` into a dict keyed by the schema's json names, or raise GoJsonError."""
    value = _syntax(body)
    state = _State(root.name)
    out = state.convert(value, root, [], top=True)
    if state.saved is not None:
        raise GoJsonError(state.saved)
    return {} if out is None else out  # Go: `null` into a struct leaves it zero


def _syntax(body: bytes) -> Any:
    try:
        text = body.decode()
    except UnicodeDecodeError as exc:
        raise GoJsonError("invalid character in string literal") from exc
    try:
        return json.loads(text, parse_int=_parse_int, parse_float=_parse_float)
    except json.JSONDecodeError as exc:
        raise GoJsonError(_syntax_text(text, exc)) from exc
    except RecursionError as exc:  # deep nesting: Go's decoder stops at a depth too
        raise GoJsonError("exceeded max depth") from exc


def _syntax_text(text: str, exc: json.JSONDecodeError) -> str:
    pos = exc.pos
    if pos >= len(text.rstrip()):
        return "unexpected EOF" if LENIENT.get() is None else "unexpected end of JSON input"
    char = text[pos]
    offset = len(text[: pos + 1].encode())
    if exc.msg.startswith("Expecting property name"):
        where = "looking for beginning of object key string"
    elif exc.msg.startswith("Expecting ':'"):
        where = "after object key"
    elif exc.msg.startswith("Expecting ',' delimiter"):
        where = "after object key:value pair" if _in_object(text, pos) else "after array element"
    else:
        where = "looking for beginning of value"
    if LENIENT.get() is not None:
        # not strict, nats-server decodes with json.Unmarshal, whose syntax errors name no
        # offset (its strict json.Decoder's do)
        return f"invalid character {_char(char)} {where}"
    return f"invalid character {_char(char)} {where} at offset {offset}"


def _in_object(text: str, pos: int) -> bool:
    depth_chars = [c for c in text[:pos] if c in "{}[]"]
    stack: list[str] = []
    for c in depth_chars:
        if c in "{[":
            stack.append(c)
        elif stack:
            stack.pop()
    return bool(stack) and stack[-1] == "{"


def _char(c: str) -> str:
    if c == "'":
        return "'\\''"
    if c == '"':
        return "'\"'"
    return f"'{c}'"


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def _raw(value: Any) -> str:
    return getattr(value, "raw", json.dumps(value))


class _State:
    def __init__(self, root_name: str) -> None:
        self.root = root_name.rsplit(".", 1)[-1]
        self.root_full = root_name
        self.saved: str | None = None

    def save(self, text: str) -> None:
        if self.saved is None:
            self.saved = text

    def type_error(self, value: Any, t: GoType, path: list[str], number_text: bool) -> None:
        what = _json_kind(value)
        if number_text:
            what = f"number {_raw(value)}"
        if not path:
            self.save(f"json: cannot unmarshal {what} into Go value of type {self.root_full}")
        elif path[-1].isdigit():
            self.save(f"json: cannot unmarshal {what} into {self.root}.{'.'.join(path)} "
                      f"of type {t.name}")
        else:
            self.save(f"json: cannot unmarshal {what} into Go struct field "
                      f"{self.root}.{'.'.join(path)} of type {t.name}")

    def convert(self, value: Any, t: GoType, path: list[str], top: bool = False) -> Any:
        if t.kind == "enum":
            assert t.parse is not None
            return t.parse(value, _raw(value) if value is not None else "null")
        if value is None:
            return None
        handler = {"struct": self._struct, "slice": self._slice, "map": self._map}.get(t.kind)
        if handler is not None:
            return handler(value, t, path)
        return self._scalar(value, t, path)

    def _scalar(self, value: Any, t: GoType, path: list[str]) -> Any:
        if t.kind == "any":
            return value
        if t.kind == "string":
            if isinstance(value, str):
                return value
        elif t.kind == "bool":
            if isinstance(value, bool):
                return value
        elif isinstance(value, int | float) and not isinstance(value, bool):
            low, high = _INT_RANGES[t.kind]
            if isinstance(value, float) or not low <= value <= high:
                self.type_error(value, t, path, number_text=True)
                return None
            return int(value)
        self.type_error(value, t, path, number_text=False)
        return None

    def _struct(self, value: Any, t: GoType, path: list[str]) -> Any:
        if not isinstance(value, dict):
            self.type_error(value, t, path, number_text=False)
            return None
        out: dict[str, Any] = {}
        folded = {name.casefold(): name for name in t.fields}
        for key, item in value.items():
            name = key if key in t.fields else folded.get(key.casefold())
            if name is None:
                skipped = LENIENT.get()
                if skipped is None:
                    self.save(f"json: unknown field {go_quote(key)}")
                else:
                    skipped.append(f"json: unknown field {go_quote(key)}")
                continue
            converted = self.convert(item, t.fields[name], path + [name])
            if converted is not None:
                out[name] = converted
        return out

    def _slice(self, value: Any, t: GoType, path: list[str]) -> Any:
        if not isinstance(value, list):
            self.type_error(value, t, path, number_text=False)
            return None
        assert t.elem is not None
        items = [self.convert(item, t.elem, path + [str(i)]) for i, item in enumerate(value)]
        return [item for item in items if item is not None]

    def _map(self, value: Any, t: GoType, path: list[str]) -> Any:
        if not isinstance(value, dict):
            self.type_error(value, t, path, number_text=False)
            return None
        assert t.elem is not None
        out = {}
        for key, item in value.items():
            converted = self.convert(item, t.elem, path + [key])
            if converted is not None:
                out[key] = converted
        return out
