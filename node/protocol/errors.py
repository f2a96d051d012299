"""The parser's error, in a module of its own: the parser may also run compiled
(node/protocol/native.py), and both forms must raise the very same class."""

from __future__ import annotations

from typing import Any


class ProtocolError(Exception):
    """A client broke the protocol.

    message:  the text nats-server sends in -ERR '<message>' (when send_err is True);
              otherwise the reason nats-server logs before closing silently.
    send_err: whether nats-server sends -ERR before closing.
    fatal:    whether the connection must be closed (always True for parser errors).
    detail:   state, stream offset and a quoted snippet of the offending bytes, for logs.
    events:   events completed in the same feed() call before the error.
    """

    def __init__(
        self, message: str, detail: str = "", *, send_err: bool = True, fatal: bool = True
    ) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or message
        self.send_err = send_err
        self.fatal = fatal
        self.events: list[Any] = []

    def __str__(self) -> str:
        return self.detail
