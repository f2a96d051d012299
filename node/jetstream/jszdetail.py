"""`/jsz` in nats-server 2.15's shape for one node, and JetStream series for `/metrics`.

    body = jsz(server, query)        # ?accounts=true&streams=true&consumers=true&config=true
    lines = metric_lines(server)     # Prometheus text lines

The key order is nats-server's: memory, storage, reserved_*, accounts, ha_assets, api, server_id,
now, config, limits, streams, consumers, messages, bytes, [account_details], total. A cluster
adds `meta_cluster` after `bytes` (the cluster's jsz.py does that on top of this body).
Standalone nats-server reports `ha_assets` 0 and the account's `reserved_*` as the unsigned
-1 it uses for "no reservation".
"""

from __future__ import annotations

import copy
import time
from typing import Any

from node.jetstream import api, jsaccount
from node.jetstream.stream import rfc3339

NO_RESERVATION = 2**64 - 1
DEFAULT_MAX_CONSUMERS = 1000  # nats-server's `limits.default_max_consumers` in /jsz


def _flag(query: dict[str, str], key: str) -> bool:
    return query.get(key, "").lower() in ("1", "true")


def _totals(svc: Any, account: str | None = None) -> tuple[int, int, int, int, int, int]:
    """(memory bytes, file bytes, streams, consumers, messages, bytes), of one account's
    streams or of all."""
    memory = storage = streams = consumers = messages = 0
    for key, sm in list(svc.streams.items()):
        if account is not None and jsaccount.account_of(key) != account:
            continue
        with sm.lock:
            size = sm.store.bytes()
            streams += 1
            consumers += len(sm.stream.consumers)
            messages += sm.store.msgs()
        if sm.memory:
            memory += size
        else:
            storage += size
    return memory, storage, streams, consumers, messages, memory + storage


def _level_only(cfg: dict[str, Any]) -> dict[str, Any]:
    """/jsz shows a config's metadata with `_nats.req.level` only (as nats-server does)."""
    out = copy.deepcopy(cfg)
    meta = out.get("metadata")
    if isinstance(meta, dict):
        out["metadata"] = {k: v for k, v in meta.items()
                           if not k.startswith("_nats.") or k == "_nats.req.level"}
    return out


def _stream_detail(svc: Any, sm: Any, consumers: bool, config: bool) -> dict[str, Any]:
    info = svc._stream_reply("stream_info_response", sm)
    out: dict[str, Any] = {"name": jsaccount.name_of(sm.name), "created": info["created"],
                           "cluster": {"leader": svc.server.server_name}}
    if config:
        out["config"] = _level_only(info["config"])
    out["state"] = info["state"]
    if consumers:
        details = []
        for name in sorted(sm.stream.consumers):
            ci = svc._consumer_info("consumer_info_response", sm, name)
            ci.pop("type", None)
            if config:
                ci["config"] = _level_only(ci["config"])
            else:
                ci.pop("config", None)
            details.append(ci)
        if details:
            out["consumer_detail"] = details
    return out


def jsz(server: Any, query: dict[str, str]) -> dict[str, Any]:
    svc = server.jetstream
    now = rfc3339(time.time_ns())
    if svc is None:  # nats-server's zeroed page, `disabled` set
        from node.monitor import jsz as disabled_jsz

        return disabled_jsz(server)
    o = server.options.jetstream
    memory, storage, streams, consumers, messages, size = _totals(svc)
    api_stats = {"level": api.API_LEVEL, "total": svc.api_total, "errors": svc.api_errors}
    enabled = sorted(a for a, lim in svc.limits.items() if lim is not None)
    cfgs = list(svc._configs_all().values())
    out: dict[str, Any] = {
        "memory": memory, "storage": storage,
        "reserved_memory": jsaccount.reserved(cfgs, memory=True),
        "reserved_storage": jsaccount.reserved(cfgs, memory=False),
        "accounts": len(enabled), "ha_assets": 0, "api": api_stats,
        "server_id": server.server_id,
        "now": now,
        "config": config_block(o, svc.store_dir),
        "limits": {"default_max_consumers": DEFAULT_MAX_CONSUMERS},
        "streams": streams, "consumers": consumers, "messages": messages, "bytes": size,
    }
    want_streams = _flag(query, "streams") or _flag(query, "consumers")
    only = query.get("acc", "")
    if _flag(query, "accounts") or want_streams or only:
        names = [only] if only else enabled
        out["account_details"] = [_account_detail(svc, name, query, want_streams)
                                  for name in names if svc.limits.get(name) is not None]
    out["total"] = len(enabled)
    return out


def account_detail(svc: Any, name: str) -> dict[str, Any]:
    """One JetStream account's `/jsz` entry (`$SYS.REQ.ACCOUNT.<acc>.JSZ` answers with it)."""
    return _account_detail(svc, name, {}, want_streams=False)


def _account_detail(svc: Any, name: str, query: dict[str, str], want_streams: bool
                    ) -> dict[str, Any]:
    """One account's entry: its usage, its limits where nats-server shows the reservations
    (the unsigned -1 when it has none), its own API counters."""
    memory, storage, *_ = _totals(svc, name)
    tiers = svc.limits[name]
    reserved = [tiers.reservation(memory=m) for m in (True, False)]
    total, errors = svc.api_counts.get(name, (0, 0))
    account: dict[str, Any] = {
        "name": _name_tag(svc, name), "id": name, "memory": memory, "storage": storage,
        "reserved_memory": reserved[0] if reserved[0] >= 0 else NO_RESERVATION,
        "reserved_storage": reserved[1] if reserved[1] >= 0 else NO_RESERVATION,
        "accounts": 0, "ha_assets": 0, "api": {"level": 0, "total": total, "errors": errors}}
    if want_streams:
        details = [_stream_detail(svc, sm, _flag(query, "consumers"), _flag(query, "config"))
                   for key, sm in sorted(svc.streams.items())
                   if jsaccount.account_of(key) == name]
        if details:
            account["stream_detail"] = details
    return account


def _name_tag(svc: Any, name: str) -> str:
    """An operator-mode account's JWT name (its id is the public key), else its name."""
    conf = getattr(svc.server.options.accounts, "accounts", {}).get(name)
    return getattr(conf, "name_tag", "") or name


_DEFAULT_SYNC_NS = 120_000_000_000  # nats-server's default sync_interval (2m)


def config_block(o: Any, store_dir: str) -> dict[str, Any]:
    """The `config` of /jsz and of /varz's `jetstream`. `sync_always` is always true: Jetraft
    fsyncs before every acknowledgement, whatever `sync_interval` says (nats-server writes
    `sync_always` only for `sync_interval: always`); the interval is reported as configured."""
    return {"max_memory": o.max_mem, "max_storage": o.max_file, "store_dir": store_dir,
            "sync_interval": _sync_interval_ns(o.sync_interval), "sync_always": True,
            **({"domain": o.domain} if o.domain else {}), "strict": o.strict}


def _sync_interval_ns(value: str) -> int:
    """`sync_interval` as written ("always", or a duration node/config.py checked) -> ns."""
    from node.config import parse_duration

    return _DEFAULT_SYNC_NS if value == "always" else int(parse_duration(value) * 1e9)


def metric_lines(server: Any) -> list[str]:
    """JetStream series with the names prometheus-nats-exporter gives /jsz's figures."""
    svc = getattr(server, "jetstream", None)
    if svc is None:
        return []
    memory, storage, streams, consumers, messages, size = _totals(svc)
    sid = f'server_id="{server.server_id}"'
    lines: list[str] = []

    def series(name: str, kind: str, help_text: str, samples: list[tuple[str, int]]) -> None:
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
        lines.extend(f"{name}{{{labels}}} {value}" for labels, value in samples)

    for name, value, help_text in (
            ("streams", streams, "Streams on this server"),
            ("consumers", consumers, "Consumers on this server"),
            ("messages", messages, "Messages stored in all streams"),
            ("bytes", size, "Bytes stored in all streams"),
            ("memory", memory, "Bytes held by memory streams"),
            ("storage", storage, "Bytes held by file streams")):
        series(f"jetstream_server_total_{name}", "gauge", help_text, [(sid, value)])
    series("jetstream_server_api_requests_total", "counter", "JetStream API requests",
           [(sid, svc.api_total)])
    series("jetstream_server_api_errors_total", "counter", "JetStream API errors",
           [(sid, svc.api_errors)])
    per_stream: dict[str, list[tuple[str, int]]] = {}
    per_consumer: dict[str, list[tuple[str, int]]] = {}
    for name, sm in sorted(svc.streams.items()):
        labels = f'{sid},stream_name="{name}"'
        with sm.lock:
            state = sm.stream.state(len(sm.stream.consumers))
            names = sorted(sm.stream.consumers)
        for key in ("messages", "bytes", "first_seq", "last_seq", "consumer_count"):
            per_stream.setdefault(key, []).append((labels, int(state.get(key, 0))))
        for cname in names:
            try:
                ci = svc._consumer_info("consumer_info_response", sm, cname)
            except Exception:  # noqa: BLE001 - deleted meanwhile: no sample
                continue
            clabels = f'{labels},consumer_name="{cname}"'
            for key, value in (("num_pending", ci["num_pending"]),
                               ("num_ack_pending", ci["num_ack_pending"]),
                               ("num_redelivered", ci["num_redelivered"]),
                               ("num_waiting", ci["num_waiting"]),
                               ("delivered_consumer_seq", ci["delivered"]["consumer_seq"]),
                               ("delivered_stream_seq", ci["delivered"]["stream_seq"]),
                               ("ack_floor_consumer_seq", ci["ack_floor"]["consumer_seq"]),
                               ("ack_floor_stream_seq", ci["ack_floor"]["stream_seq"])):
                per_consumer.setdefault(key, []).append((clabels, value))
    for key, samples in per_stream.items():
        series(f"jetstream_stream_{key}", "gauge", f"Stream state: {key}", samples)
    for key, samples in per_consumer.items():
        series(f"jetstream_consumer_{key}", "gauge", f"Consumer state: {key}", samples)
    return lines
