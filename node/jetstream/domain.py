"""The JetStream domain (`jetstream { domain: hub }`), as nats-server 2.15 serves it. Pure.

A domain names this JetStream so that clients can address it by prefix:
`nc.jetstream(domain="hub")` sends its requests to `$JS.hub.API.<op>` instead of
`$JS.API.<op>`. nats-server does not subscribe to the prefixed subjects: it adds subject
mappings to every account (with JetStream or not, the system account too) that rewrite the
prefix onto the plain API and onto the KV and Object Store subjects, so subscribers and
advisories see `$JS.API.<op>` (checked against 2.15.1: a subscriber on `$JS.hub.API.>` gets
nothing, one on `$JS.API.>` gets the request; /accountz lists the table built below). A
mapping the account already has for one of these sources wins over the domain's.

The domain then shows in the replies and advisories that carry it (PubAck, stream info,
account info, the stream/consumer action and API audit advisories), INFO, /varz and /jsz.

Names (nats-server's start-up checks, in this order): the derived `$JS.<domain>.API.>` must be
a valid subject (no whitespace, no empty token), then the name may not contain `.`, `*` or
`>`. An empty domain is no domain.
"""

from __future__ import annotations

import json

from node.mapping import MappingTable, build_mapping
from node.subject import valid_subject

# The prefixed sources and their targets: nats-server's table, one mapping per API area.
_AREAS = ("INFO", "STREAM.>", "CONSUMER.>", "DIRECT.>", "ACCOUNT.>", "META.>", "SERVER.>")
_STORES = ("$KV.>", "$OBJ.>")


def api_prefix(domain: str) -> str:
    """The API prefix a client of this domain uses (`$JS.<domain>.API`)."""
    return f"$JS.{domain}.API"


def domain_error(domain: str) -> str | None:
    """nats-server's start-up error for a configured domain, or None when it is fine."""
    if not domain:
        return None
    derived = api_prefix(domain) + ".>"
    if not valid_subject(derived):
        # quoted as Go's %q quotes it (`\t` for a tab)
        quoted = json.dumps(derived, ensure_ascii=False)
        return f"invalid domain name: derived {quoted} is not a valid subject"
    if any(c in domain for c in ".*>"):
        return "invalid domain name: may not contain ., * or >"
    return None


def mapping_table(domain: str) -> MappingTable:
    """The mappings every account gets for `domain` (empty when there is none)."""
    table = MappingTable()
    if not domain:
        return table
    prefix = api_prefix(domain)
    for area in _AREAS:
        table.add(build_mapping(f"{prefix}.{area}", [(f"$JS.API.{area}", 100, None)],
                                single=True))
    for store in _STORES:
        table.add(build_mapping(f"{prefix}.{store}", [(store, 100, None)], single=True))
    return table


# StreamInfo's fields after `state`, in nats-server's order: `domain` goes before the first.
_AFTER_STATE = ("cluster", "mirror", "sources", "alternates", "ts")


def with_domain(info: dict[str, object], domain: str) -> dict[str, object]:
    """A stream info (STREAM.INFO, UPDATE, a LIST item) with nats-server's `domain` field
    after `state` (omitted when empty). STREAM.CREATE's reply has none (checked, 2.15.1)."""
    if not domain:
        return info
    at = next((k for k in _AFTER_STATE if k in info), None)
    out: dict[str, object] = {}
    for k, v in info.items():
        if k == "domain":
            continue
        if k == at:
            out["domain"] = domain
        out[k] = v
    out.setdefault("domain", domain)
    return out


def append_to_event(body: bytes, domain: str) -> bytes:
    """An advisory or metric JSON object with `"domain"` as its last field."""
    if not domain or not body.endswith(b"}"):
        return body
    sep = b"" if body.rstrip(b"}").rstrip().endswith(b"{") else b","
    return body[:-1] + sep + b'"domain":' + json.dumps(domain).encode() + b"}"


def merged(own: MappingTable | None, domain_table: MappingTable) -> MappingTable | None:
    """An account's mappings followed by the domain's whose source it does not map itself
    (nats-server appends them and skips the sources the account already has)."""
    if not domain_table:
        return own
    mine = list(own.mappings) if own else []
    sources = {m.src for m in mine}
    extra = [m for m in domain_table.mappings if m.src not in sources]
    if not extra:
        return own
    return MappingTable(mine + extra)
