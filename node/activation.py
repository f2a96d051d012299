"""Operator mode: activation tokens for imports of token-required exports.

An account JWT's export with `token_req: true` admits no importer by itself
(node/resolver.py builds it private to nobody). An importer's import carries
`token`: an activation JWT the exporter signed. It is honoured when
- it is a valid NATS JWT of type `activation` (signature, expiry, not-before),
- it was issued by the exporter account, or by one of the exporter's signing
  keys with `issuer_account` naming the exporter,
- its `sub` is the importing account,
- its subject contains the import's subject, and its kind (when given) is
  the import's type,
and the exporter has a token-required export of that type covering the subject.
An account JWT whose import tokens fail the static checks (all but the issuer's
trust and the expiry) is refused whole, as nats-server refuses it
(`import_token_issues`, called where account JWTs are verified).

A grant is an extra export of exactly the imported subject, private to the
importer (`_Grant*`), appended to the exporter's AccountConfig: the routing
core's exact-subject rule then admits that importer for that subject only,
never the rest of the export. Grants are recomputed from the JWTs every time
an account JWT changes (`apply_activations`), so a withdrawn or replaced token
stops granting at once. Anything that does not verify grants nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from node.accountconf import AccountsConfig, ServiceExport, StreamExport
from node.jwt import AccountClaims, JWTError, decode
from node.subject import valid_subject


class _GrantStreamExport(StreamExport):
    """A token-required stream export, granted to one importer for one subject."""


class _GrantServiceExport(ServiceExport):
    """A token-required service export, granted to one importer for one subject."""


def _covers(pattern: str, subject: str) -> bool:
    """Every subject `subject` matches is matched by `pattern`."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s):
            return False
        if tok != "*" and tok != s[i]:
            return False
        if tok == "*" and s[i] == ">":
            return False
    return len(p) == len(s)


def import_token_issues(claims: AccountClaims) -> list[str]:
    """nats-server's blocking validation of an account JWT's import tokens: an
    account with any of these is refused as a whole (its users cannot log in).
    Expiry is not among them: an expired token just grants nothing."""
    issues = []
    for imp in claims.imports:
        token = imp.get("token")
        if token is None:
            continue
        subject, account, kind = imp.get("subject"), imp.get("account"), imp.get("type")
        try:
            act = decode(token, activation=True) if isinstance(token, str) else None
        except (JWTError, ValueError):
            act = None
        if act is None or act.kind != "activation":
            issues.append(f"import {subject!r} contains an invalid activation token")
            continue
        if act.subject != claims.key:
            issues.append(f"activation token doesn't match account it is being included in, "
                          f"{subject!r}")
        if act.issuer != account and act.nats.get("issuer_account") != account:
            issues.append(f"activation token doesn't match account for import {subject!r}")
        granted = act.nats.get("subject")
        if not (isinstance(granted, str) and isinstance(subject, str)
                and _covers(granted, subject)):
            issues.append(f"activation token import subject {act.nats.get('subject')!r} "
                          f"doesn't match import {subject!r}")
        token_kind = act.nats.get("kind")
        if token_kind not in (None, "", kind):
            issues.append(f"mismatch between token import type {token_kind} and type of "
                          f"import {kind}")
    return issues


def verify_activation(token: str, importer: str, exporter: AccountClaims, subject: str,
                      kind: str, now: float) -> bool:
    """Whether `token` lets account `importer` import `subject` (of `kind`) from
    `exporter`. Never raises: anything malformed is simply not a grant."""
    try:
        claims = decode(token, activation=True)
        claims.check_time(now)
    except (JWTError, ValueError):
        return False
    if claims.kind != "activation" or claims.subject != importer:
        return False
    issuer_account = claims.nats.get("issuer_account") or ""
    if claims.issuer != exporter.key:
        if claims.issuer not in exporter.signing_keys or issuer_account != exporter.key:
            return False
    granted = claims.nats.get("subject")
    if not isinstance(granted, str) or not valid_subject(granted) or not _covers(granted, subject):
        return False
    token_kind = claims.nats.get("kind") or claims.nats.get("import_type")
    return token_kind in (None, "", kind)


def apply_activations(conf: AccountsConfig, lookup: Callable[[str], AccountClaims | None],
                      now: float) -> None:
    """Recompute every activation grant of `conf`'s accounts from their JWTs."""
    for acc in conf.accounts.values():
        acc.stream_exports = [e for e in acc.stream_exports
                              if not isinstance(e, _GrantStreamExport)]
        acc.service_exports = [e for e in acc.service_exports
                               if not isinstance(e, _GrantServiceExport)]
    for importer in list(conf.accounts):
        claims = lookup(importer)
        if claims is None:
            continue
        for imp in claims.imports:
            _grant(conf, lookup, importer, imp, now)


def _grant(conf: AccountsConfig, lookup: Callable[[str], AccountClaims | None], importer: str,
           imp: dict[str, Any], now: float) -> None:
    token, exporter_key = imp.get("token"), imp.get("account")
    subject, kind = imp.get("subject"), imp.get("type")
    if not (isinstance(token, str) and isinstance(exporter_key, str)
            and isinstance(subject, str) and kind in ("stream", "service")):
        return
    exporter_conf = conf.accounts.get(exporter_key)
    exporter = lookup(exporter_key)
    if exporter_conf is None or exporter is None:
        return
    if not verify_activation(token, importer, exporter, subject, kind, now):
        return
    find = exporter_conf.stream_export_for if kind == "stream" \
        else exporter_conf.service_export_for
    if find(importer, subject) is not None:
        return  # already admitted (a public export): a private grant would shut others out
    # Only an export that asks for a token is opened by one (built private to nobody).
    exports: list[Any] = exporter_conf.stream_exports if kind == "stream" \
        else exporter_conf.service_exports
    base = next((e for e in exports if e.accounts == frozenset() and _covers(e.subject, subject)
                 and not isinstance(e, _GrantStreamExport | _GrantServiceExport)), None)
    if base is None:
        return
    grant_cls = _GrantStreamExport if kind == "stream" else _GrantServiceExport
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    fields.update(subject=subject, accounts=frozenset({importer}))
    exports.append(grant_cls(**fields))
