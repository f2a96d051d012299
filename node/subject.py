"""Subject syntax and wildcard matching, as nats-server defines them.

A subject is a list of non-empty tokens joined by ``.``.  In a subscription
pattern a whole token ``*`` matches exactly one token and a whole token ``>``
(only allowed last) matches one or more remaining tokens.  A ``*`` or ``>``
inside a longer token (``foo*``) is an ordinary literal character.

Published subjects are not validated by the server unless the client is
pedantic, so matching treats every token of the *published* subject as a
literal: ``PUB foo.*`` reaches ``SUB foo.*`` and ``SUB foo.>`` but not
``SUB foo.bar``.  A published subject with an empty token (``foo..bar``)
matches nothing.  These rules were read off a real nats-server 2.15 and are
pinned by differential tests in ``tests/unit/test_subject.py``.

Everything here is pure and allocation-light: these functions sit on the
hot path of permissions checks and sublist cache invalidation.
"""

from __future__ import annotations

from collections.abc import Callable

SEP = "."
PWC = "*"  # partial wildcard: exactly one token
FWC = ">"  # full wildcard: one or more trailing tokens

# nats-server rejects exactly these whitespace bytes inside subjects.
_WHITESPACE = frozenset(" \t\n\r\f")


def _has_whitespace(token: str) -> bool:
    return not _WHITESPACE.isdisjoint(token)


def valid_subject(subject: str, check_runes: bool = False) -> bool:
    """Is `subject` acceptable in a SUB (wildcards allowed)?

    `check_runes` additionally refuses NUL and U+FFFD (the mark of bytes that
    were not valid UTF-8), as nats-server does for stream configuration.
    """
    if not subject:
        return False
    if check_runes and ("\x00" in subject or "\ufffd" in subject):
        return False
    tokens = subject.split(SEP)
    last = len(tokens) - 1
    for i, token in enumerate(tokens):
        if not token or _has_whitespace(token):
            return False
        if token == FWC and i != last:
            return False
    return True


def valid_literal_subject(subject: str) -> bool:
    """A valid subject with no wildcard token: what a pedantic PUB must use."""
    if not valid_subject(subject):
        return False
    return is_literal(subject)


def valid_queue_name(queue: str) -> bool:
    """Queue group names: non-empty, no whitespace.

    nats-server puts no further limit on them (``q.*`` and ``q>`` are
    accepted and act as plain names), so neither do we.
    """
    return bool(queue) and not _has_whitespace(queue)


def is_literal(subject: str) -> bool:
    """True when no token of `subject` is a whole-token wildcard."""
    # Fast path: most subjects contain neither character at all.
    if PWC not in subject and FWC not in subject:
        return True
    for token in subject.split(SEP):
        if token == PWC or token == FWC:
            return False
    return True


def subject_matches(pattern: str, subject: str) -> bool:
    """Does subscription `pattern` receive a message published to `subject`?

    Tokens of `subject` are literals (see the module docstring).
    """
    return _match_tokens(pattern.split(SEP), subject.split(SEP))


def _match_tokens(ptoks: list[str], stoks: list[str]) -> bool:
    if "" in stoks:
        return False
    n = len(stoks)
    for i, p in enumerate(ptoks):
        if i >= n:
            return False
        if p == FWC:
            return True
        if p != PWC and p != stoks[i]:
            return False
    return len(ptoks) == n


def compile_matcher(pattern: str) -> Callable[[str], bool]:
    """A predicate equal to ``lambda s: subject_matches(pattern, s)``.

    Built for scanning many subjects against one pattern (cache
    invalidation): a dot count and a literal-prefix test reject most
    candidates before any split happens.
    """
    ptoks = pattern.split(SEP)
    if is_literal(pattern):
        return lambda s: s == pattern
    open_ended = ptoks[-1] == FWC
    dots = len(ptoks) - 1
    prefix_toks: list[str] = []
    for tok in ptoks:
        if tok in (PWC, FWC):
            break
        prefix_toks.append(tok)
    prefix = SEP.join(prefix_toks) + SEP if prefix_toks else ""

    def matcher(subject: str) -> bool:
        if not subject.startswith(prefix):
            return False
        count = subject.count(SEP)
        if count < dots if open_ended else count != dots:
            return False
        return _match_tokens(ptoks, subject.split(SEP))

    return matcher


def subset(a: str, b: str) -> bool:
    """Is every subject matched by pattern `a` also matched by pattern `b`?"""
    atoks = a.split(SEP)
    btoks = b.split(SEP)
    for i, bt in enumerate(btoks):
        if i >= len(atoks):
            return False
        at = atoks[i]
        if bt == FWC:
            return True
        if at == FWC:
            return False  # a reaches deeper than b's fixed length
        if at == PWC:
            if bt != PWC:
                return False
        elif bt != PWC and bt != at:
            return False
    return len(atoks) == len(btoks)


def subjects_collide(a: str, b: str) -> bool:
    """Is there at least one subject that both patterns match?

    The question JetStream asks when two streams claim subjects.
    """
    atoks = a.split(SEP)
    btoks = b.split(SEP)
    for at, bt in zip(atoks, btoks, strict=False):
        if at == FWC or bt == FWC:
            return True
        if at != bt and at != PWC and bt != PWC:
            return False
    return len(atoks) == len(btoks)
