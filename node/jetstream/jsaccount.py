"""JetStream per account (pure): registry keys, which accounts have JetStream, their limits.

Every account has its own streams: the service keys them by `key(account, name)`. The global
account's key is the bare stream name, so catalogues, Raft groups and LMDB stores written
before accounts existed open unchanged; any other account's key is `<account>/<name>`. A
stream name never holds '/' (nats-server refuses path separators, config.py too), so `split`
is exact even when the account name holds one.

Limits are nats-server 2.15's (checked against the binary, tests/integration/
test_jetstream_accounts_diff.py):
* stream create/update: `max_streams` counts the account's streams; `max_mem`/`max_file` are
  checked against the account's reservations (the sum of its other streams' `max_bytes`, per
  storage type) plus this stream's `max_bytes` (1 when unset);
* consumer create: the account's `max_consumers` caps each stream's consumers (nats-server
  takes the stricter of it and the stream's own `max_consumers`);
* publish: the account's stored bytes of that storage type plus the new record's size must
  stay within `max_mem`/`max_file`, else 10002 "resource limits exceeded for account".

Tiered limits (an account JWT's `tiered_limits`, as `nsc edit account --js-tier` writes them):
the account has one set of limits per tier instead of one flat set, and a stream's replicas
pick its tier ("R1", "R3"; nats-server's `tierName`). Every check above then counts only the
streams of that tier: its stream count, its reservations, its stored bytes. A stream whose
tier the account lacks is refused with 10120 (`JSNoLimitsErr`). Flat limits are the tier ""
that every stream falls in. In a tier, a stream's bytes count once however many replicas
hold it (nats-server scales the tier's limit by the replicas); in the flat tier an R3
stream's bytes count three times, as nats-server sums its replicas' usage there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from node.jetstream.errors import ApiError

GLOBAL = "$G"
SEP = "/"
UNLIMITED = -1
FLAT = ""  # the tier of an account with flat (untiered) limits: every stream is in it


def key(account: str, name: str) -> str:
    """The registry key of stream `name` in `account`."""
    return name if account == GLOBAL else f"{account}{SEP}{name}"


def split(stream_key: str) -> tuple[str, str]:
    """(account, stream name) of a registry key."""
    account, sep, name = stream_key.rpartition(SEP)
    return (account, name) if sep else (GLOBAL, stream_key)


def account_of(stream_key: str) -> str:
    return split(stream_key)[0]


def name_of(stream_key: str) -> str:
    return split(stream_key)[1]


@dataclass(frozen=True)
class Limits:
    """An account's JetStream limits (-1: none), as `$JS.API.INFO` shows them."""

    max_memory: int = UNLIMITED
    max_storage: int = UNLIMITED
    max_streams: int = UNLIMITED
    max_consumers: int = UNLIMITED
    max_ack_pending: int = UNLIMITED
    memory_max_stream_bytes: int = UNLIMITED
    storage_max_stream_bytes: int = UNLIMITED
    max_bytes_required: bool = False

    def to_info(self) -> dict[str, Any]:
        return {"max_memory": self.max_memory, "max_storage": self.max_storage,
                "max_streams": self.max_streams, "max_consumers": self.max_consumers,
                "max_ack_pending": self.max_ack_pending,
                "memory_max_stream_bytes": self.memory_max_stream_bytes,
                "storage_max_stream_bytes": self.storage_max_stream_bytes,
                "max_bytes_required": self.max_bytes_required}


def from_config(js: Any) -> Limits:
    """An `accountconf.JetStreamLimits` (config block or account JWT) as Limits."""
    return Limits(js.max_mem, js.max_file, js.max_streams, js.max_consumers,
                  js.max_ack_pending, js.memory_max_stream_bytes, js.store_max_stream_bytes,
                  bool(js.max_bytes_required))


def tier_name(replicas: int) -> str:
    """The tier a stream of `replicas` replicas falls in when the account is tiered."""
    return f"R{max(replicas, 1)}"


def replicas_of(cfg: Mapping[str, Any]) -> int:
    return max(int(cfg.get("num_replicas") or 1), 1)


@dataclass(frozen=True)
class Tiers:
    """An account's JetStream limits: one flat set (the tier FLAT) or one set per tier."""

    limits: Mapping[str, Limits]

    @property
    def tiered(self) -> bool:
        return FLAT not in self.limits

    def select(self, replicas: int) -> tuple[str, Limits]:
        """(tier, its limits) for a stream of `replicas` replicas; raises 10120 when the
        account has neither flat limits nor that tier (nats-server's selectLimits)."""
        if not self.tiered:
            return FLAT, self.limits[FLAT]
        tier = tier_name(replicas)
        if tier not in self.limits:
            raise ApiError.of("JSNoLimitsErr")
        return tier, self.limits[tier]

    def tier_of(self, cfg: Mapping[str, Any]) -> str:
        return tier_name(replicas_of(cfg)) if self.tiered else FLAT

    def flat(self) -> Limits:
        """What INFO shows at the top: the flat limits, all zero when tiered."""
        return self.limits.get(FLAT) or ZERO

    def reservation(self, memory: bool) -> int:
        """What `/jsz` shows as the account's reservation of one storage type: the flat
        limit (-1: none); 0 when tiered (nats-server 2.15 shows no tier's there)."""
        if self.tiered:
            return 0
        lim = self.limits[FLAT]
        return lim.max_memory if memory else lim.max_storage


ZERO = Limits(0, 0, 0, 0, 0, 0, 0, False)  # INFO for limits not set (tiered: the top level)
UNLIMITED_TIERS = Tiers({FLAT: Limits()})


def tiers_from_config(js: Any) -> Tiers:
    """An `accountconf.JetStreamLimits` (config block or account JWT) as Tiers."""
    if js.tiers:
        return Tiers({name: from_config(t) for name, t in js.tiers.items()})
    return Tiers({FLAT: from_config(js)})


def limits_for(accounts_conf: Any, account: str, operator_mode: bool) -> Tiers | None:
    """The account's limits, None when JetStream is not enabled for it.

    nats-server's rule: with no accounts configured (and no operator), the global account
    has JetStream without limits; once accounts are configured only those whose
    `jetstream` is enabled (or whose JWT grants storage) have it, the global account not."""
    configured = {} if accounts_conf is None else dict(accounts_conf.accounts)
    system = getattr(accounts_conf, "system_account", "$SYS")
    configured.pop(system, None)
    if account == GLOBAL:
        return UNLIMITED_TIERS if not configured and not operator_mode else None
    acc = configured.get(account)
    if acc is None or not acc.jetstream.enabled:
        return None
    return tiers_from_config(acc.jetstream)


# ---------------------------------------------------------------------------- checks


def check_stream(tiers: Tiers, cfg: dict[str, Any], others: dict[str, dict[str, Any]],
                 creating: bool) -> None:
    """Raise nats-server's error when the account cannot take the stream `cfg`. `others`:
    the account's other streams' configs (by name, this one left out); only those in the
    tier `cfg`'s replicas pick count."""
    tier, limits = tiers.select(replicas_of(cfg))
    others = {n: c for n, c in others.items() if tiers.tier_of(c) == tier}
    if creating and limits.max_streams > 0 and len(others) >= limits.max_streams:
        raise ApiError.of("JSMaximumStreamsLimitErr")
    memory = cfg.get("storage") == "memory"
    max_bytes = int(cfg.get("max_bytes") or -1)
    if max_bytes <= 0 and limits.max_bytes_required:
        raise ApiError.of("JSStreamMaxBytesRequired")
    per_stream = limits.memory_max_stream_bytes if memory else limits.storage_max_stream_bytes
    if max_bytes > 0 and 0 < per_stream < max_bytes:
        raise ApiError.of("JSStreamMaxStreamBytesExceeded")
    stream_consumers = int(cfg.get("max_consumers") or -1)
    if stream_consumers > 0 and 0 < limits.max_consumers < stream_consumers:
        raise ApiError.of("JSMaximumConsumersLimitErr")
    limit = limits.max_memory if memory else limits.max_storage
    if limit < 0:
        return
    if reserved(list(others.values()), memory) + (max_bytes if max_bytes > 0 else 1) > limit:
        raise ApiError.of("JSMemoryResourcesExceededErr" if memory
                          else "JSStorageResourcesExceededErr")


def consumer_cap(limits: Limits, stream_max: int) -> int:
    """The consumers one stream may hold: its own `max_consumers`, or the account's when
    that is stricter (-1: none)."""
    if stream_max <= 0 or 0 < limits.max_consumers < stream_max:
        return limits.max_consumers
    return stream_max


def reserved(cfgs: Iterable[Mapping[str, Any]], memory: bool) -> int:
    """The bytes the streams reserve (their `max_bytes`) in one storage type."""
    return sum(int(c.get("max_bytes") or 0) for c in cfgs
               if (c.get("storage") == "memory") == memory and int(c.get("max_bytes") or 0) > 0)


def publish_exceeds(limits: Limits, memory: bool, used: int, size: int) -> bool:
    """Whether storing a record of `size` bytes takes the account's tier past its limit.
    nats-server holds the tier's total to its per-stream maximum as well."""
    limit = limits.max_memory if memory else limits.max_storage
    per_stream = limits.memory_max_stream_bytes if memory else limits.storage_max_stream_bytes
    total = used + size
    return (0 < per_stream < total) or (limit >= 0 and total > limit)


# ---------------------------------------------------------------------------- the server
# The node's own `jetstream { max_mem, max_file }` (-1: not set, nothing checked; nats-server
# then takes 75% of the RAM and the free disk, which Jetraft does not estimate). Checked
# against nats-server 2.15 (tests/integration/test_jetstream_reservations_diff.py):
# * standalone, when accounts get JetStream: the sum of every account's positive
#   `max_mem` / `max_file` (all tiers) must fit in the server's, else 10028 / 10047 (a
#   configured account stops the server at start: [FTL]);
# * standalone, stream create and update: the other streams' `max_bytes` (every account's)
#   plus this one's (1 when unset) must fit, else 10028 / 10047;
# * publish: once the node's stored bytes of that storage type are past the server's
#   limit, 10023 "insufficient resources" (503) (the check is before the record is added,
#   so the last record accepted may pass it, as in nats-server).


def limits_reservation(tiers: Iterable[Tiers], memory: bool) -> int:
    """What accounts' limits reserve of the server: their tiers' positive limits."""
    return sum(v for t in tiers for lim in t.limits.values()
               if (v := lim.max_memory if memory else lim.max_storage) > 0)


def server_admits_accounts(max_mem: int, max_file: int, tiers: list[Tiers]) -> str | None:
    """None, or the error name when the accounts' limits overflow the server's."""
    if 0 <= max_mem < limits_reservation(tiers, memory=True):
        return "JSMemoryResourcesExceededErr"
    if 0 <= max_file < limits_reservation(tiers, memory=False):
        return "JSStorageResourcesExceededErr"
    return None


def check_server_stream(max_mem: int, max_file: int, cfg: Mapping[str, Any],
                        others: Iterable[Mapping[str, Any]]) -> None:
    """Raise 10028 / 10047 when the stream's `max_bytes` does not fit in what the server
    has left after the other streams' (of every account) reservations."""
    memory = cfg.get("storage") == "memory"
    limit = max_mem if memory else max_file
    if limit < 0:
        return
    max_bytes = int(cfg.get("max_bytes") or -1)
    if reserved(list(others), memory) + (max_bytes if max_bytes > 0 else 1) > limit:
        raise ApiError.of("JSMemoryResourcesExceededErr" if memory
                          else "JSStorageResourcesExceededErr")


def server_full(limit: int, used: int) -> bool:
    """Whether the node's stored bytes of one storage type are past its limit."""
    return 0 <= limit < used
