"""nats-server's configuration file format, and its mapping onto `Options`.

Two layers, both pure apart from reading `include`d files (done through a
`read_file` callable so tests and tools can supply their own):

* `parse_config(text, ...)` turns the text into nested `ConfigMap`s (dicts
  that also remember where each key was written and which keys served as
  `$VARIABLES`), lists and scalars.
* `apply_config(d, opts)` maps such a dict onto a copy of `Options`,
  rejecting unknown keys the way nats-server does and recording keys that
  nats-server knows but Jetraft does not implement in `Options.unsupported`.

The grammar follows what `nats-server -t` accepts (checked by experiment):
keys and values separated by `:`, `=` or blanks; `#` and `//` comments;
blocks `{}` and arrays `[]` whose items end at `,`, `;` or a newline; bare
words classified as bool / int / float / size / datetime / string; size
suffixes K=1000 but KB=Ki=KiB=1024 (and so on up to E); `include path`.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import os
import re
from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from node.auth import CONNECTION_TYPES
from node.options import (
    ClusterOptions,
    JetStreamOptions,
    Options,
    Permissions,
    TLSOptions,
    User,
    WebsocketOptions,
)
from node.tls import CIPHER_SUITES

# Includes that include themselves would otherwise recurse forever.
MAX_INCLUDE_DEPTH = 10
# An environment variable's value is parsed as config text, and may itself
# reference variables; bound that chain.
MAX_ENV_DEPTH = 8


class ConfigError(Exception):
    """A config file that cannot be used; the message names file:line:col."""


@dataclass(frozen=True)
class Where:
    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class ConfigMap(dict):
    """A parsed block: a plain dict plus, per key, where it was written, and
    which of its keys were referenced as `$VARIABLES` (nats-server exempts
    those from the unknown-field check)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.where: dict[str, Where] = {}
        self.used_as_var: set[str] = set()


# --------------------------------------------------------------------------
# Scalars

_BOOLS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
_INT_RE = re.compile(r"-?\d+")
_FLOAT_RE = re.compile(r"-?\d+\.\d+")
_SIZE_RE = re.compile(r"(-?\d+)([kmgtpe])(b|i|ib)?", re.IGNORECASE)
_BAD_FLOAT_RE = re.compile(r"-?\d+\.\d+[a-z]+", re.IGNORECASE)
_DATETIME_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}


def _classify(word: str) -> Any:
    """The value of an unquoted word, as nats-server types it."""
    low = word.lower()
    if low in _BOOLS:
        return _BOOLS[low]
    if _INT_RE.fullmatch(word):
        return int(word)
    if _FLOAT_RE.fullmatch(word):
        return float(word)
    m = _SIZE_RE.fullmatch(word)
    if m:
        # A bare letter is decimal (1K = 1000); with B/I/IB it is binary.
        base = 1024 if m.group(3) else 1000
        return int(m.group(1)) * base ** _POWERS[m.group(2).lower()]
    if _BAD_FLOAT_RE.fullmatch(word):
        raise ValueError(f"invalid number {word!r}: floats cannot take a size suffix")
    if _DATETIME_RE.fullmatch(word):
        return _dt.datetime.strptime(word, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.UTC)
    if word.startswith("-") and not word[1:2].isdigit():
        raise ValueError(f"expected a digit after '-', got {word!r}")
    return word


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Go's time.ParseDuration ("1h30m", "500ms", "2.5s"), in seconds."""
    s = text.strip()
    sign = -1.0 if s.startswith("-") else 1.0
    body = s.lstrip("+-")
    if body == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(body):
        m = _DURATION_PART.match(body, pos)
        if not m:
            raise ValueError(f"invalid duration {text!r}")
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if not body:
        raise ValueError(f"invalid duration {text!r}")
    return sign * total


_SIZE_STR_RE = re.compile(r"\s*(\d+)\s*([kmgtpe]?)(b|i|ib)?\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """A size written as a string ("10G", "512MB"): every suffix is binary,
    as in nats-server's JetStream limits."""
    m = _SIZE_STR_RE.fullmatch(text)
    if not m or (m.group(3) and not m.group(2)):
        raise ValueError(f"invalid size {text!r}")
    power = _POWERS[m.group(2).lower()] if m.group(2) else 0
    return int(m.group(1)) * 1024**power


# --------------------------------------------------------------------------
# The parser

_BLANK = " \t\r"
_WORD_END = " \t\r\n,;}]"
_KEY_END = " \t\r\n:="  # nats-server: "a{" is a key; only blanks, : and = end one
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", '"': '"', "\\": "\\", "/": "/"}
_VAR_NAME_RE = re.compile(r"[A-Za-z0-9_]+")


def _read_text_file(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


class _Parser:
    """Recursive descent over one file's text; `include` starts a new one."""

    def __init__(
        self,
        text: str,
        file: str,
        env: Mapping[str, str],
        read_file: Callable[[str], str],
        depth: int = 0,
    ) -> None:
        self.text = text
        self.file = file
        self.env = env
        self.read_file = read_file
        self.depth = depth
        self.pos = 0
        self.line_starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]

    # ---- positions and errors

    def where(self, pos: int | None = None) -> Where:
        p = self.pos if pos is None else pos
        line = bisect_right(self.line_starts, p)
        return Where(self.file, line, p - self.line_starts[line - 1] + 1)

    def error(self, msg: str, pos: int | None = None) -> ConfigError:
        return ConfigError(f"{self.where(pos)}: {msg}")

    def peek(self, n: int = 1) -> str:
        return self.text[self.pos : self.pos + n]

    def _describe(self) -> str:
        c = self.peek()
        return "end of file" if not c else "new line" if c == "\n" else repr(c)

    # ---- blanks and comments

    def skip_blanks(self) -> bool:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in _BLANK:
            self.pos += 1
        return self.pos > start

    def at_comment(self) -> bool:
        return self.peek() == "#" or self.peek(2) == "//"

    def skip_comment(self) -> None:
        end = self.text.find("\n", self.pos)
        self.pos = len(self.text) if end < 0 else end

    def skip_space(self, also: str = "") -> None:
        """Blanks, newlines, comments and any characters in `also`."""
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in _BLANK or c == "\n" or c in also:
                self.pos += 1
            elif self.at_comment():
                self.skip_comment()
            else:
                return

    # ---- document and blocks

    def document(self, into: ConfigMap, scopes: list[ConfigMap]) -> None:
        self.body(into, scopes, closer=None)

    def body(self, m: ConfigMap, scopes: list[ConfigMap], closer: str | None) -> None:
        """Entries up to `closer`, or to the end of the file when it is None.

        At a file's top level nats-server skips braces, which is what makes
        the JSON form (one object wrapping everything) a valid config."""
        while True:
            self.skip_space(also="{}" if closer is None else "")
            c = self.peek()
            if not c:
                if closer is not None:
                    raise self.error("unexpected end of file inside a block, expected '}'")
                return
            if c == closer:
                self.pos += 1
                return
            if c in "}],;":
                raise self.error(f"unexpected {c!r}")
            self.entry(m, scopes, closer)

    def entry(self, m: ConfigMap, scopes: list[ConfigMap], closer: str | None) -> None:
        key_pos = self.pos
        key, quoted = self.key()
        blanks = self.skip_blanks()
        # nats-server lets plain whitespace, new lines included, separate a key and its value.
        while self.peek() == "\n":
            self.pos += 1
            blanks = self.skip_blanks() or True
        if not quoted and key.lower() == "include" and blanks and self.peek() not in ":=":
            self.include(m, scopes)
        else:
            c = self.peek()
            if c in ":=":
                self.pos += 1
                self.skip_blanks()
            elif not blanks and c not in "{[":
                raise self.error(f"expected ':', '=' or a blank after key {key!r}")
            # Where a value is due, '#' and '//' start it ("#abc"), not a comment.
            if self.peek() in ("", "\n"):
                raise self.error(f"expected a value for {key!r}, found {self._describe()}")
            m[key] = self.value(scopes)
            m.where[key] = self.where(key_pos)
        self.end_of_entry(closer)

    def end_of_entry(self, closer: str | None) -> None:
        """A value ends at a new line, a comment, one ',' or ';', or the
        block's closing brace (any brace at top level)."""
        self.skip_blanks()
        c = self.peek()
        if c in (",", ";"):
            self.pos += 1
            return
        if not c or c == "\n" or self.at_comment() or c == (closer or "}"):
            return
        what = "a top-level value" if closer is None else "a block entry"
        raise self.error(f"expected {what} to end with a new line, ',', ';' or comment, "
                         f"found {self._describe()}")

    def key(self) -> tuple[str, bool]:
        c = self.peek()
        if c in "\"'":
            return self.quoted(), True
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in _KEY_END:
            self.pos += 1
        if self.pos == start:
            raise self.error(f"expected a key, found {self._describe()}")
        return self.text[start : self.pos], False

    def include(self, m: ConfigMap, scopes: list[ConfigMap]) -> None:
        where = self.pos
        name = self.quoted() if self.peek() in "\"'" else self.word()
        if not name:
            raise self.error("expected a file name after 'include'")
        if self.depth >= MAX_INCLUDE_DEPTH:
            raise self.error(f"includes nested deeper than {MAX_INCLUDE_DEPTH} at {name!r}", where)
        path = name if os.path.isabs(name) else os.path.join(os.path.dirname(self.file), name)
        try:
            text = self.read_file(path)
        except OSError as e:
            msg = f"error reading include file {name!r}: {e.strerror or e}"
            raise self.error(msg, where) from None
        sub = _Parser(text, path, self.env, self.read_file, self.depth + 1)
        # The included file's keys land in the including block, in its scope.
        sub.body(m, scopes, closer=None)

    # ---- values

    def value(self, scopes: list[ConfigMap]) -> Any:
        c = self.peek()
        start = self.pos
        if c == "{":
            self.pos += 1
            child = ConfigMap()
            self.body(child, [*scopes, child], closer="}")
            return child
        if c == "[":
            return self.array(scopes)
        if c in "\"'":
            return self.quoted()
        if c == "(":
            return self.block_string()
        if c == "$":
            return self.variable(scopes)
        word = self.word()
        try:
            return _classify(word)
        except ValueError as e:
            raise self.error(str(e), start) from None

    def word(self) -> str:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in _WORD_END:
            if self.text[self.pos] == "'":
                raise self.error("unexpected ' inside an unquoted value")
            self.pos += 1
        return self.text[start : self.pos]

    def array(self, scopes: list[ConfigMap]) -> list[Any]:
        self.pos += 1
        items: list[Any] = []
        while True:
            self.skip_space()
            if self.peek() == "]":
                self.pos += 1
                return items
            if not self.peek():
                raise self.error("unexpected end of file inside an array, expected ']'")
            if self.peek() == ",":
                raise self.error("unexpected ',' in an array")
            items.append(self.value(scopes))
            self.skip_blanks()
            c = self.peek()
            if c == ",":
                self.pos += 1
            elif c != "]" and c != "\n" and not self.at_comment():
                found = self._describe()
                raise self.error(f"expected ',' or ']' after an array item, found {found}")

    def quoted(self) -> str:
        quote = self.text[self.pos]
        start = self.pos
        self.pos += 1
        out: list[str] = []
        while True:
            c = self.peek()
            if not c or c == "\n":
                raise self.error("unterminated quoted string", start)
            self.pos += 1
            if c == quote:
                return "".join(out)
            if c == "\\" and quote == '"':
                out.append(self.escape())
            else:
                out.append(c)

    def escape(self) -> str:
        c = self.peek()
        self.pos += 1
        if c in _ESCAPES:
            return _ESCAPES[c]
        if c in "xu":
            n = 2 if c == "x" else 4
            digits = self.peek(n)
            if len(digits) == n and all(d in "0123456789abcdefABCDEF" for d in digits):
                self.pos += n
                return chr(int(digits, 16))
        allowed = "\\t \\n \\r \\\" \\\\ \\xXX"
        raise self.error(f"invalid escape '\\{c}' (allowed: {allowed})", self.pos - 2)

    def block_string(self) -> str:
        # '(' ... ')' where ')' opens a line: raw multi-line text.
        start = self.pos
        m = re.compile(r"\n[ \t]*\)").search(self.text, self.pos)
        if not m:
            raise self.error("unterminated block string, expected ')' on its own line", start)
        raw = self.text[start + 1 : m.start()]
        self.pos = m.end()
        return raw[1:] if raw.startswith("\n") else raw

    def variable(self, scopes: list[ConfigMap]) -> Any:
        start = self.pos
        self.pos += 1
        m = _VAR_NAME_RE.match(self.text, self.pos)
        if not m:
            raise self.error("expected a variable name after '$'", start)
        name = m.group(0)
        self.pos = m.end()
        for scope in reversed(scopes):
            if name in scope:
                scope.used_as_var.add(name)
                return scope[name]
        if name in self.env and self.depth < MAX_INCLUDE_DEPTH + MAX_ENV_DEPTH:
            return self.env_value(name, start)
        line = self.where(start).line
        raise self.error(f"variable reference for '{name}' on line {line} can not be found", start)

    def env_value(self, name: str, start: int) -> Any:
        """An environment value is itself config text ("4222" is a number)."""
        sub = _Parser(f"v={self.env[name]}", f"${name}", self.env, self.read_file, self.depth + 1)
        holder = ConfigMap()
        try:
            sub.body(holder, [holder], closer=None)
        except ConfigError as e:
            raise self.error(f"environment variable {name}: {e}", start) from None
        return holder.get("v", "")


def parse_config(
    text: str,
    file: str = "<config>",
    env: Mapping[str, str] | None = None,
    read_file: Callable[[str], str] = _read_text_file,
) -> ConfigMap:
    """Parse nats-server config text (or its JSON form) into a `ConfigMap`.

    `env` supplies `$VARIABLES` not defined in the file (default: os.environ).
    """
    root = ConfigMap()
    parser = _Parser(text, file, os.environ if env is None else env, read_file)
    parser.document(root, [root])
    return root


def parse_config_file(path: str, env: Mapping[str, str] | None = None) -> ConfigMap:
    try:
        text = _read_text_file(path)
    except OSError as e:
        raise ConfigError(f"error opening config file {path!r}: {e.strerror or e}") from None
    parsed = parse_config(text, path, env)
    if not parsed:
        raise ConfigError(f"{path}: config has no values or is empty")
    return parsed

# --------------------------------------------------------------------------
# Mapping onto Options


@dataclass
class _Field:
    """One key of a block, with enough context for a precise error."""

    key: str  # lower-cased, as nats-server matches keys
    value: Any
    where: Where | None
    path: str  # dotted, for messages and Options.unsupported ("cluster.tls")
    name: str = ""  # as written, for messages

    def fail(self, msg: str) -> ConfigError:
        prefix = f"{self.where}: " if self.where else ""
        return ConfigError(f"{prefix}{msg}")


_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
               list: "an array", dict: "a block", ConfigMap: "a block"}


def _type_name(v: Any) -> str:
    return _TYPE_NAMES.get(type(v), type(v).__name__)


def _fields(block: Mapping[str, Any], prefix: str) -> list[_Field]:
    where = getattr(block, "where", {})
    return [_Field(k.lower(), v, where.get(k), f"{prefix}{k.lower()}", k) for k, v in block.items()]


def _used_as_var(block: Mapping[str, Any], f: _Field) -> bool:
    return any(k.lower() == f.key for k in getattr(block, "used_as_var", ()))


def _want(f: _Field, kind: type | tuple[type, ...], what: str) -> Any:
    # bool is an int in Python, but never in a config file.
    if isinstance(f.value, bool) != (kind is bool) or not isinstance(f.value, kind):
        raise f.fail(f"{f.path}: expected {what}, got {_type_name(f.value)} {f.value!r}")
    return f.value


def _int(f: _Field) -> int:
    return _want(f, int, "an integer")


def _str(f: _Field) -> str:
    return _want(f, str, "a string")


def _bool(f: _Field) -> bool:
    return _want(f, bool, "a boolean")


def _block(f: _Field) -> Mapping[str, Any]:
    return _want(f, dict, "a block { ... }")


def _duration(f: _Field) -> float:
    """A duration string ("2m", "500ms"), or a plain number of seconds."""
    if isinstance(f.value, str):
        try:
            return parse_duration(f.value)
        except ValueError as e:
            raise f.fail(f"error parsing {f.path}: {e}") from None
    return float(_want(f, (int, float), "a duration such as \"10s\""))


def _size(f: _Field) -> int:
    if isinstance(f.value, str):
        try:
            return parse_size(f.value)
        except ValueError as e:
            raise f.fail(f"error parsing {f.path}: {e}") from None
    return _int(f)


def _str_list(f: _Field, split_commas: bool = False) -> list[str]:
    v = f.value
    if isinstance(v, str):
        parts = v.split(",") if split_commas else [v]
        return [p.strip() for p in parts if p.strip()]
    items = _want(f, list, "a string or an array of strings")
    for item in items:
        if not isinstance(item, str):
            raise f.fail(f"{f.path}: expected strings, got {_type_name(item)} {item!r}")
    return list(items)


def _host_port(f: _Field, text_or_port: Any) -> tuple[str | None, int]:
    """"host:port", ":port" or a bare port number."""
    if isinstance(text_or_port, int) and not isinstance(text_or_port, bool):
        return None, text_or_port
    text = _str(f)
    host, sep, port = text.rpartition(":")
    if not sep or not port.lstrip("-").isdigit():
        raise f.fail(f"{f.path}: could not parse address string {text!r}")
    return (host.strip("[]") or None), int(port)


Handler = Callable[[Any, _Field], None]


def _apply_block(
    target: Any,
    block: Mapping[str, Any],
    prefix: str,
    handlers: Mapping[str, Handler],
    unsupported: frozenset[str],
    opts: Options,
    unknown: str = 'unknown field "{key}"',
    unenforced: frozenset[str] = frozenset(),
) -> None:
    """Dispatch each key of `block`: known keys to their handler, keys that
    nats-server accepts but Jetraft lacks to `opts.unsupported` (a warning),
    security settings Jetraft cannot enforce yet to `opts.unenforced` (the
    node refuses to start), and anything else is an error, as in nats-server
    (unless the key was a variable)."""
    for f in _fields(block, prefix):
        handler = handlers.get(f.key)
        if handler is not None:
            handler(target, f)
        elif f.key in unenforced:
            if f.path not in opts.unenforced:
                opts.unenforced.append(f.path)
            opts.extra[f.path] = f.value
        elif f.key in unsupported:
            if f.path not in opts.unsupported:
                opts.unsupported.append(f.path)
            opts.extra[f.path] = f.value
        elif not _used_as_var(block, f):
            raise f.fail(unknown.format(key=f.name or f.key))


def _setter(attr: str, conv: Callable[[_Field], Any]) -> Handler:
    def handler(target: Any, f: _Field) -> None:
        setattr(target, attr, conv(f))

    return handler


# ---- authorization


def _permission_side(f: _Field) -> tuple[list[str] | None, list[str] | None]:
    """publish/subscribe: a subject, a list, or {allow, deny}."""
    if not isinstance(f.value, dict):
        return _str_list(f), None
    allow: list[str] | None = None
    deny: list[str] | None = None
    for sub in _fields(f.value, f.path + "."):
        if sub.key == "allow":
            allow = _str_list(sub)
        elif sub.key == "deny":
            deny = _str_list(sub)
        else:
            raise sub.fail(f'Unknown field "{sub.key}" parsing {f.path}')
    return allow, deny


def _permissions(f: _Field) -> Permissions:
    perms = Permissions()
    for sub in _fields(_block(f), f.path + "."):
        if sub.key in ("publish", "pub", "import"):
            perms.publish_allow, perms.publish_deny = _permission_side(sub)
        elif sub.key in ("subscribe", "sub", "export"):
            perms.subscribe_allow, perms.subscribe_deny = _permission_side(sub)
        elif sub.key in ("allow_responses", "publish_allow_responses"):
            _allow_responses(perms, sub)
        else:
            raise sub.fail(f'Unknown field "{sub.key}" parsing permissions')
    return perms


def _allow_responses(perms: Permissions, f: _Field) -> None:
    """`true`, or {max, expires}: as nats-server, 0 keeps the default (1 reply,
    2 min) and a negative value means no limit."""
    if not isinstance(f.value, dict):
        perms.allow_responses = _bool(f)
        return
    perms.allow_responses = True
    for sub in _fields(f.value, f.path + "."):
        if sub.key in ("max", "max_msgs", "max_messages", "max_responses"):
            perms.response_max = _int(sub) or perms.response_max
        elif sub.key in ("expires", "expiration", "ttl"):
            perms.response_expires = _duration(sub) or perms.response_expires
        else:
            raise sub.fail(f'Unknown field "{sub.key}" parsing {f.path}')


_USER_HANDLERS: dict[str, Handler] = {
    "user": _setter("user", _str),
    "username": _setter("user", _str),
    "password": _setter("password", _str),
    "pass": _setter("password", _str),
    "nkey": _setter("nkey", _str),
    "permissions": _setter("permissions", _permissions),
    "permission": _setter("permissions", _permissions),
    "allowed_connection_types": _setter("allowed_connection_types", lambda f: _conn_types(f)),
    "allowed_conn_types": _setter("allowed_connection_types", lambda f: _conn_types(f)),
}
_USER_UNENFORCED = frozenset({"account", "proxy_required"})


def _conn_types(f: _Field) -> list[str]:
    types = _str_list(f)
    bad = [t for t in types if t.upper() not in CONNECTION_TYPES]
    if bad:
        raise f.fail(f"invalid connection types {json.dumps(bad)}")
    return [t.upper() for t in types]


def _users(opts: Options, f: _Field) -> list[User]:
    users = []
    for i, item in enumerate(_want(f, list, "an array of users")):
        entry = _Field(f.key, item, f.where, f"{f.path}[{i}]")
        user = User()
        _apply_block(user, _block(entry), f"{f.path}.", _USER_HANDLERS, frozenset(), opts,
                     unenforced=_USER_UNENFORCED)
        if user.nkey is None and user.user is None:
            raise entry.fail(f"{entry.path}: a user needs 'user' or 'nkey'")
        users.append(user)
    return users


def _auth_handlers(opts: Options) -> dict[str, Handler]:
    return {
        "user": _setter("user", _str),
        "username": _setter("user", _str),
        "password": _setter("password", _str),
        "pass": _setter("password", _str),
        "token": _setter("token", _str),
        "timeout": _setter("auth_timeout", _duration),
        "users": lambda o, f: setattr(o, "users", _users(opts, f)),
        # nats-server: both apply to listed users without permissions of their own.
        "permissions": _setter("default_permissions", _permissions),
        "default_permissions": _setter("default_permissions", _permissions),
        "default_permission": _setter("default_permissions", _permissions),
    }


_AUTH_UNENFORCED = frozenset({"auth_callout", "account"})


def _authorization(opts: Options, f: _Field) -> None:
    _apply_block(opts, _block(f), "authorization.", _auth_handlers(opts), frozenset(), opts,
                 unenforced=_AUTH_UNENFORCED)
    if opts.token and (opts.user or opts.password):
        raise f.fail("Cannot have a user/pass and token")
    if opts.token and opts.users:
        raise f.fail("Can not have a token and a users array")
    if opts.user and opts.users:
        raise f.fail("Can not have a single user/pass and a users array")


# ---- tls


_TLS_HANDLERS: dict[str, Handler] = {
    "cert_file": _setter("cert_file", _str),
    "key_file": _setter("key_file", _str),
    "ca_file": _setter("ca_file", _str),
    "verify": _setter("verify", _bool),
    "timeout": _setter("timeout", _duration),
    # A duration here sets a fallback delay; Jetraft treats any value as "on".
    "handshake_first": _setter("handshake_first",
                               lambda f: f.value if isinstance(f.value, bool) else bool(_str(f))),
    "min_version": _setter("min_version", lambda f: _tls_version(f)),
    "pinned_certs": _setter("pinned_certs", lambda f: [p.lower() for p in _str_list(f)]),
    "verify_and_map": lambda t, f: _verify_and_map(t, f),
    "cipher_suites": _setter("cipher_suites", lambda f: _cipher_suites(f)),
}
_TLS_UNSUPPORTED = frozenset({"insecure", "certs", "handshake_first_fallback"})
# Each restricts who may connect or how: ignoring one would let in what it keeps out.
_TLS_UNENFORCED = frozenset({
    "verify_cert_and_check_known_urls", "curve_preferences",
    "cert_store", "cert_match", "cert_match_by", "cert_match_skip_invalid",
    "ca_certs_match", "ocsp_peer", "connection_rate_limit",
})


def _cipher_suites(f: _Field) -> list[str]:
    names = [n.upper() for n in _str_list(f)]
    for name in names:
        if name not in CIPHER_SUITES:
            raise f.fail(f"unrecognized cipher {name!r} (or one OpenSSL no longer offers)")
    return names


def _verify_and_map(tls: TLSOptions, f: _Field) -> None:
    # As in nats-server, verify_and_map implies verify.
    tls.verify_and_map = _bool(f)
    tls.verify = tls.verify or tls.verify_and_map


def _tls_version(f: _Field) -> str:
    text = str(f.value) if isinstance(f.value, float) else _str(f)
    if text not in ("1.2", "1.3"):
        raise f.fail(f"unsupported TLS version {text!r} (Jetraft accepts 1.2 and 1.3)")
    return text


def _tls_options(opts: Options, f: _Field) -> TLSOptions:
    tls = TLSOptions()
    _apply_block(tls, _block(f), f.path + ".", _TLS_HANDLERS, _TLS_UNSUPPORTED, opts,
                 unknown='error parsing tls config, unknown field "{key}"',
                 unenforced=_TLS_UNENFORCED)
    if tls.cert_file and not tls.key_file:
        raise f.fail("missing 'key_file' in TLS configuration")
    if tls.key_file and not tls.cert_file:
        raise f.fail("missing 'cert_file' in TLS configuration")
    return tls


# ---- jetstream


def _jetstream_flag(js: JetStreamOptions, f: _Field) -> None:
    if isinstance(f.value, str):
        if f.value.lower() not in ("enabled", "disabled"):
            raise f.fail(f"Expected 'enabled' or 'disabled' for string value, got {f.value!r}")
        js.enabled = f.value.lower() == "enabled"
    else:
        js.enabled = _bool(f)


def _sync_interval(f: _Field) -> str:
    if isinstance(f.value, str) and f.value.lower() == "always":
        return "always"
    if not isinstance(f.value, str):
        raise f.fail(f'invalid use of field "{f.key}": {f.key} should be a duration or "always"')
    _duration(f)  # validate; keep the text as written
    return f.value


_JS_HANDLERS: dict[str, Handler] = {
    "enabled": _jetstream_flag,
    "enable": _jetstream_flag,
    "store_dir": _setter("store_dir", _str),
    "storedir": _setter("store_dir", _str),
    "store": _setter("store_dir", _str),
    "max_mem": _setter("max_mem", _size),
    "max_memory": _setter("max_mem", _size),
    "max_memory_store": _setter("max_mem", _size),
    "max_mem_store": _setter("max_mem", _size),
    "max_file": _setter("max_file", _size),
    "max_file_store": _setter("max_file", _size),
    "max_store": _setter("max_file", _size),
    "sync_interval": _setter("sync_interval", _sync_interval),
    "sync": _setter("sync_interval", _sync_interval),
    "unique_tag": _setter("unique_tag", _str),
    "domain": _setter("domain", lambda f: _js_domain(f)),
    "key": _setter("key", _str),
    "ek": _setter("key", _str),
    "encryption_key": _setter("key", _str),
    "cipher": _setter("cipher", lambda f: _cipher(f)),
    "prev_key": _setter("prev_key", _str),
    "prev_ek": _setter("prev_key", _str),
    "prev_encryption_key": _setter("prev_key", _str),
    "audit_archive": _setter("audit_archive", _bool),  # jetraft's: keep old WAL segments
    "strict": _setter("strict", _bool),
    "max_buffered_msgs": _setter("max_buffered_msgs", _int),
    "max_buffered_size": _setter("max_buffered_size", _size),
    "request_queue_limit": _setter("request_queue_limit", _int),
}
_JS_UNSUPPORTED = frozenset({
    "max_outstanding_catchup", "tpm", "extension_hint", "max_catchup",
})

# The `limits {}` keys outside the block, where nats-server ignores them: a limit the
# operator meant but neither server would hold fails closed ([FTL]).
_JS_UNENFORCED = frozenset({
    "max_ack_pending", "max_request_batch", "max_ha_assets", "duplicate_window",
})


def _ns(f: _Field) -> int:
    return int(_duration(f) * 1_000_000_000)


# `jetstream { limits {} }`: server-wide caps and defaults for streams and consumers.
# max_ha_assets: replicated streams and consumers per server (placement.py), clustered only
# (a single node holds no replicated asset, as a standalone nats-server).
_JS_LIMITS: dict[str, Handler] = {
    "max_ack_pending": lambda d, f: d.__setitem__("max_ack_pending", _int(f)),
    "max_ha_assets": lambda d, f: d.__setitem__("max_ha_assets", _int(f)),
    "max_request_batch": lambda d, f: d.__setitem__("max_request_batch", _int(f)),
    "duplicate_window": lambda d, f: d.__setitem__("duplicate_window", _ns(f)),
}


def _js_limits(js: Any, f: _Field, opts: Options) -> None:
    if not isinstance(f.value, dict):
        raise f.fail(f'invalid use of field "{f.key}": expected a map')
    _apply_block(js.limits, f.value, f.path + ".", _JS_LIMITS, frozenset(), opts)


def _js_domain(f: _Field) -> str:
    from node.jetstream.domain import domain_error  # pure

    name = _str(f)
    err = domain_error(name)
    if err is not None:
        raise f.fail(err)
    return name


def _cipher(f: _Field) -> str:
    from node.jetstream.crypt import parse_cipher  # pure; no crypto library imported

    name = parse_cipher(_str(f))
    if name is None:
        raise f.fail(f"Unknown cipher type: {f.value!r}".replace("'", '"'))
    return name


def _jetstream(opts: Options, f: _Field) -> None:
    js = opts.jetstream
    if isinstance(f.value, dict):
        js.enabled = True  # a block turns JetStream on unless it says otherwise
        handlers = {**_JS_HANDLERS, "limits": lambda t, lf: _js_limits(t, lf, opts)}
        _apply_block(js, f.value, "jetstream.", handlers, _JS_UNSUPPORTED, opts,
                     unenforced=_JS_UNENFORCED)
        if js.cipher is not None and not js.key:
            # nats-server then stores in the clear; asking for a cipher and getting none
            # would fail open.
            raise f.fail("jetstream.cipher is set but jetstream.key is not: nothing would "
                         "be encrypted")
        if js.prev_key is not None and not js.key:
            # nats-server accepts it and ignores it; a rotation to no key (decrypting the
            # store) is not built, so the node would not do what this asks.
            raise f.fail("jetstream.prev_key is set but jetstream.key is not: a store is "
                         "never converted to unencrypted")
    else:
        _jetstream_flag(js, f)


# ---- cluster and websocket


def _listen_into(target: Any, f: _Field) -> None:
    host, port = _host_port(f, f.value)
    if host is not None:
        target.host = host
    target.port = port


def _cluster_name(f: _Field) -> str:
    name = _str(f)
    if " " in name:
        raise f.fail("cluster name cannot contain spaces")
    return name


def _cluster_authorization(opts: Options, c: Any, f: _Field) -> None:
    handlers: dict[str, Handler] = {
        "user": _setter("user", _str),
        "username": _setter("user", _str),
        "password": _setter("password", _str),
        "pass": _setter("password", _str),
        "token": _setter("token", _str),
        "timeout": _setter("auth_timeout", _duration),
    }
    # Per-route users and permissions would need route permissions: refused, not ignored.
    unenforced = frozenset({"users", "permissions", "nkeys", "accounts"})
    _apply_block(c, _block(f), f.path + ".", handlers, frozenset(), opts,
                 unenforced=unenforced)
    if c.token and (c.user or c.password):
        raise f.fail("cluster.authorization: token cannot be combined with user/password")


def _cluster_tls(opts: Options, c: Any, f: _Field) -> None:
    c.tls = _tls_options(opts, f)
    # gRPC's TLS has no hooks for these: refused rather than silently unchecked.
    for key in ("pinned_certs", "verify_and_map", "cipher_suites", "min_version"):
        if getattr(c.tls, key):
            opts.unenforced.append(f"cluster.tls.{key}")


def _route_url(i: int, f: _Field, route: Any) -> str:
    if not isinstance(route, str):
        raise f.fail(f"cluster.routes[{i}]: expected a URL string, got {route!r}")
    return route


_CLUSTER_HANDLERS: dict[str, Handler] = {
    "name": _setter("name", _cluster_name),
    "listen": _listen_into,
    "host": _setter("host", _str),
    "net": _setter("host", _str),
    "port": _setter("port", _int),
    "routes": _setter("routes", lambda f: list(_want(f, list, "an array of route URLs"))),
    "advertise": _setter("advertise", _str),
    "cluster_advertise": _setter("advertise", _str),
    "no_advertise": _setter("no_advertise", _bool),
    "connect_retries": _setter("connect_retries", _int),
    "raft_port": _setter("raft_port", _int),
    "raft_lane": _setter("raft_lane", lambda f: _raft_lane(f)),
}
_CLUSTER_UNSUPPORTED = frozenset({
    "connect_backoff", "pool_size", "compression", "ping_interval",
    "ping_max", "write_deadline", "write_timeout",
})
# Route permissions and per-account routes change who may receive what: refused.
_CLUSTER_UNENFORCED = frozenset({"permissions", "accounts", "pinned_accounts"})


def _raft_lane(f: _Field) -> str:
    v = _str(f)
    if v not in RAFT_LANES:
        raise f.fail(f"cluster raft_lane must be one of {', '.join(RAFT_LANES)}, got {v!r}")
    return v


RAFT_LANES = ("auto", "direct", "grpc")


def _cluster(opts: Options, f: _Field) -> None:
    handlers = dict(_CLUSTER_HANDLERS)
    handlers["authorization"] = lambda c, sub: _cluster_authorization(opts, c, sub)
    handlers["tls"] = lambda c, sub: _cluster_tls(opts, c, sub)
    _apply_block(opts.cluster, _block(f), "cluster.", handlers, _CLUSTER_UNSUPPORTED, opts,
                 unenforced=_CLUSTER_UNENFORCED)
    for i, route in enumerate(opts.cluster.routes):
        _route_url(i, f, route)


def _websocket(opts: Options, f: _Field) -> None:
    ws = opts.websocket or WebsocketOptions()
    handlers: dict[str, Handler] = {
        "listen": _listen_into,
        "host": _setter("host", _str),
        "net": _setter("host", _str),
        "port": _setter("port", _int),
        "no_tls": _setter("no_tls", _bool),
        "compression": _setter("compression", _bool),
        "tls": lambda w, sub: setattr(w, "tls", _tls_options(opts, sub)),
        "same_origin": _setter("same_origin", _bool),
        "allowed_origins": _setter("allowed_origins", _str_list),
        "no_auth_user": _setter("no_auth_user", _str),
        # 0 keeps our default (nats-server's 0 is no limit without TLS: we keep one).
        "handshake_timeout": _setter("handshake_timeout", lambda f: _duration(f) or None),
    }
    unsupported = frozenset({"advertise", "headers"})
    unenforced = frozenset({
        "authorization", "jwt_cookie",
        "username_cookie", "password_cookie", "token_cookie",
    })
    _apply_block(ws, _block(f), "websocket.", handlers, unsupported, opts, unenforced=unenforced)
    for key in ("pinned_certs", "verify_and_map"):  # checked on the client port's TLS only
        if ws.tls is not None and getattr(ws.tls, key):
            opts.unenforced.append(f"websocket.tls.{key}")
    opts.websocket = ws


# ---- top level


def _http(opts: Options, f: _Field) -> None:
    host, port = _host_port(f, f.value)
    if host is not None:
        opts.http_host = host
    opts.http_port = port


def _server_name(f: _Field) -> str:
    name = _str(f)
    if " " in name:
        raise f.fail("server name cannot contain spaces")
    return name


def _lame_duck_duration(f: _Field) -> float:
    seconds = _duration(f)
    if seconds < 30:
        raise f.fail(f"invalid lame_duck_duration of {f.value}, minimum is 30 seconds")
    return seconds


def _store_dir(opts: Options, f: _Field) -> None:
    opts.jetstream.store_dir = _str(f)


def _top_handlers() -> dict[str, Handler]:
    handlers: dict[str, Handler] = {
        "listen": _listen_into,
        "port": _setter("port", _int),
        "host": _setter("host", _str),
        "net": _setter("host", _str),
        "http": _http,
        "http_port": _setter("http_port", _int),
        "monitor_port": _setter("http_port", _int),
        "server_name": _setter("server_name", _server_name),
        "max_payload": _setter("max_payload", _size),
        "max_pending": _setter("max_pending", _size),
        "max_control_line": _setter("max_control_line", _size),
        "max_connections": _setter("max_connections", _int),
        # Per connection, as nats-server (0: none); each account's limit applies too.
        "max_subscriptions": _setter("max_subscriptions", lambda f: _int(f) or -1),
        "max_subs": _setter("max_subscriptions", lambda f: _int(f) or -1),
        "max_sub_tokens": _setter("max_sub_tokens", _int),
        "max_subscription_tokens": _setter("max_sub_tokens", _int),
        "max_conn": _setter("max_connections", _int),
        "ping_interval": _setter("ping_interval", _duration),
        "ping_max": _setter("ping_max", _int),
        "write_deadline": _setter("write_deadline", _duration),
        "lame_duck_duration": _setter("lame_duck_duration", _lame_duck_duration),
        "lame_duck_grace_period": _setter("lame_duck_grace_period", _duration),
        "authorization": _authorization,
        "no_auth_user": _setter("no_auth_user", _str),
        "tls": lambda o, f: setattr(o, "tls", _tls_options(o, f)),
        "jetstream": _jetstream,
        "store_dir": _store_dir,
        "storedir": _store_dir,
        "server_tags": _setter("server_tags", lambda f: _str_list(f, split_commas=True)),
        "cluster": _cluster,
        "websocket": _websocket,
        "ws": _websocket,
        "debug": _setter("debug", _bool),
        "trace": _setter("trace", _bool),
        "logfile": _setter("log_file", _str),
        "log_file": _setter("log_file", _str),
        "pidfile": _setter("pid_file", _str),
        "pid_file": _setter("pid_file", _str),
        "ports_file_dir": _setter("ports_file_dir", _str),
    }
    # Read as a whole by node/accountconf.py in _apply_accounts (they refer to each other).
    handlers.update(dict.fromkeys(_ACCOUNT_KEYS, _read_later))
    return handlers


def _read_later(target: Any, f: _Field) -> None:
    """Keys _apply_accounts reads with the whole config in hand."""


# nats-server accepts these; Jetraft records them and warns at start.
UNSUPPORTED_BLOCKS = frozenset({"leafnodes", "leaf", "gateway", "mqtt"})
# Trust settings Jetraft does not enforce yet: a config using them stops the node
# at start (accounts, mappings and operator mode are enforced: see _ACCOUNT_KEYS).
UNENFORCED_BLOCKS = frozenset({
    "trusted", "trusted_keys", "resolver_tls", "resolver_pinned_accounts",
})
# Read by node/accountconf.py and node/resolver.py; enforced by node/crossaccount.py
# and node/operatorauth.py (which refuses, [FTL], the resolvers it cannot run).
_ACCOUNT_KEYS = frozenset({"accounts", "system_account", "system", "mappings", "maps",
                           "no_system_account", "no_system", "no_sys_acc",
                           "resolver", "account_resolver", "accounts_resolver", "operator",
                           "operators", "root_operators", "root_operator", "resolver_preload"})
_TOP_UNSUPPORTED = UNSUPPORTED_BLOCKS | frozenset({
    "client_advertise", "logtime", "logtime_utc", "trace_verbose",
    "disable_sublist_cache", "no_sublist_cache", "https", "https_port", "http_base_path",
    "logfile_size_limit", "log_size_limit", "logfile_max_num", "log_max_num", "syslog",
    "remote_syslog", "prof_port", "prof_block_rate", "max_traced_msg_len",
    "write_timeout",
    "no_header_support", "trusted",
    "trusted_keys", "resolver_tls", "resolver_preload", "resolver_pinned_accounts", "ocsp",
    "ocsp_cache", "allow_non_tls", "default_js_domain", "reconnect_error_reports",
    "connect_error_reports", "server_metadata", "proxies", "max_closed_clients",
})


def apply_config(d: Mapping[str, Any], opts: Options | None = None) -> Options:
    """A copy of `opts` (default: `Options()`) with config dict `d` applied."""
    out = copy.deepcopy(opts) if opts is not None else Options()
    _apply_block(out, d, "", _top_handlers(), _TOP_UNSUPPORTED, out, unenforced=UNENFORCED_BLOCKS)
    _apply_accounts(d, out)
    return out


def _apply_accounts(d: Mapping[str, Any], out: Options) -> None:
    """Accounts hook: `accounts`, `mappings`, `system_account` and operator
    mode need the whole config (users, other accounts), so they are read
    after the per-key pass. Imported late: those modules import this one."""
    from node.accountconf import parse_accounts_config
    from node.resolver import parse_operator_config

    out.accounts = parse_accounts_config(d, out.users)
    out.mappings = out.accounts.global_mappings
    out.operator = parse_operator_config(d)


def load_options(path: str, opts: Options | None = None,
                 env: Mapping[str, str] | None = None) -> Options:
    """Read and apply the config file at `path`; raises ConfigError."""
    out = apply_config(parse_config_file(path, env), opts)
    out.config_file = path
    return out


def validate_options(opts: Options) -> None:
    """Checks nats-server makes at start (not under -t): raise ConfigError."""
    if opts.max_payload > opts.max_pending:
        raise ConfigError(f"max_payload ({opts.max_payload}) cannot be higher than "
                          f"max_pending ({opts.max_pending})")
    for name in ("port", "http_port"):
        port = getattr(opts, name)
        if not -1 <= port <= 65535:
            raise ConfigError(f"{name} {port} is out of range")
    _check_system_account(opts)
    if opts.accounts is not None and opts.accounts.accounts:
        from node.accountconf import validate_accounts_at_start  # imports this module

        opts.accounts.no_auth_user = opts.no_auth_user
        validate_accounts_at_start(opts.accounts, {u.user for u in opts.users if u.user})
    elif opts.no_auth_user and opts.users and opts.no_auth_user not in {
        u.user for u in opts.users
    }:
        raise ConfigError(f'no_auth_user: "{opts.no_auth_user}" not present as user in '
                          "authorization block")
    if opts.websocket and opts.websocket.port and not opts.websocket.no_tls \
            and opts.websocket.tls is None:
        raise ConfigError("websocket requires TLS configuration unless no_tls is true")
    for tls in (opts.tls, opts.websocket.tls if opts.websocket else None, opts.cluster.tls):
        _check_tls_files(tls)
    ctls = opts.cluster.tls
    if ctls is not None and not (ctls.cert_file and ctls.ca_file):
        # Membership by certificate needs a CA to check peers against: no CA, no cluster.
        raise ConfigError("cluster.tls needs cert_file, key_file and ca_file "
                          "(nodes verify each other's certificates)")
    if (opts.cluster.password or "").startswith("$2"):
        # Each node proves it knows the secret before a peer sends it anything
        # (node/cluster/security.py): a hash cannot prove that.
        raise ConfigError("cluster.authorization: use a plain password or a token "
                          "(nodes prove to each other that they know it), not a bcrypt hash")
    if opts.cluster.routes and not opts.cluster.port:
        raise ConfigError("routes need a cluster listener (cluster { listen } or --cluster)")
    _check_raft_lane(opts.cluster)


def _check_raft_lane(c: ClusterOptions) -> None:
    """A lane setting the node cannot honour stops it (fail closed, not a quiet gRPC)."""
    if not -1 <= c.raft_port <= 65535:
        raise ConfigError(f"cluster raft_port {c.raft_port} is out of range")
    if c.raft_lane == "direct" and c.raft_port < 0:
        raise ConfigError("cluster raft_lane: direct needs the direct lane "
                          "(raft_port -1 turns it off)")


def _check_tls_files(tls: TLSOptions | None) -> None:
    # nats-server loads the certificates while reading the config; fail as early.
    if tls is None:
        return
    for name in ("cert_file", "key_file", "ca_file"):
        path = getattr(tls, name)
        if path and not os.path.isfile(path):
            raise ConfigError(f"tls {name} {path!r}: no such file")


def _check_system_account(opts: Options) -> None:
    """A `system_account` named in the config must exist (nats-server will not start
    otherwise: fail closed). Operator mode names it by key, resolved elsewhere."""
    from node.accountconf import DEFAULT_SYSTEM_ACCOUNT  # imports this module

    conf = opts.accounts
    if conf is None or opts.operator is not None or conf.no_system_account:
        return
    name = conf.system_account
    if name != DEFAULT_SYSTEM_ACCOUNT and name not in conf.accounts:
        raise ConfigError("error resolving system account: account missing")
