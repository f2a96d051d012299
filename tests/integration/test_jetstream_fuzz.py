"""Random and mutated `$JS.API.*` requests (and acks) against a live `jetraft serve -js`.

A seeded generator takes real requests (stream/consumer create, update, info, delete, purge,
msg get/delete, direct get, consumer next, acks) and mutates them: byte flips, truncation,
JSON field type changes, huge numbers, deep nesting, invalid UTF-8, oversized subjects and
bodies. Every request waits at most REQ_TIMEOUT. Afterwards the node must be up (PING, INFO),
still answer a valid request, its log must hold no Traceback and no unhandled-exception
error, and a control stream made before the fuzz must hold exactly its messages.

Default: ~500 requests. `JETRAFT_LONG=1`: 20,000. `JETRAFT_FUZZ_SEED=<n>` replays a run;
the seed is printed in every failure message.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from tests.integration.conftest import RawConn, ServerProc, Servers

REQ_TIMEOUT = 1.0
CONCURRENCY = 25
COUNT = 20_000 if os.environ.get("JETRAFT_LONG") else 500
CONTROL_MSGS = 25
TRACE = bool(os.environ.get("JETRAFT_FUZZ_TRACE"))  # print every request (to narrow a failure)

# Log lines that mean an exception escaped a handler (not a refused request).
BAD_LOG = ("Traceback", "task failed", "Unhandled", "unhandled", "Exception in callback")

CORPUS: list[tuple[str, Any]] = [
    ("INFO", b""),
    ("STREAM.NAMES", {"offset": 0}),
    ("STREAM.LIST", {"offset": 0, "subject": "f.>"}),
    ("STREAM.CREATE.F", {"name": "F", "subjects": ["f.>"], "max_msgs": 1000}),
    ("STREAM.CREATE.G", {"name": "G", "subjects": ["g.>"], "storage": "memory",
                         "retention": "workqueue", "max_age": 60_000_000_000}),
    ("STREAM.UPDATE.F", {"name": "F", "subjects": ["f.>", "ff.*"], "max_msgs": 500,
                         "max_bytes": 1 << 20, "discard": "new", "duplicate_window": 10**9}),
    ("STREAM.INFO.F", {"subjects_filter": ">", "deleted_details": True}),
    ("STREAM.PURGE.F", {"filter": "f.a", "keep": 3}),
    ("STREAM.PURGE.G", {"seq": 4}),
    ("STREAM.MSG.GET.F", {"seq": 2}),
    ("STREAM.MSG.GET.F", {"last_by_subj": "f.b"}),
    ("STREAM.MSG.GET.F", {"next_by_subj": "f.a", "seq": 1}),
    ("STREAM.MSG.DELETE.F", {"seq": 3, "no_erase": True}),
    ("DIRECT.GET.F", {"seq": 1}),
    ("DIRECT.GET.F", {"multi_last": ["f.a", "f.b"], "batch": 3}),
    ("DIRECT.GET.F.f.a", b""),
    ("STREAM.DELETE.G", b""),
    ("CONSUMER.CREATE.F.c", {"stream_name": "F", "config": {
        "durable_name": "c", "ack_policy": "explicit", "filter_subject": "f.>",
        "max_deliver": 5, "ack_wait": 2_000_000_000, "backoff": [10**9, 2 * 10**9]}}),
    ("CONSUMER.CREATE.F.p.f.a", {"stream_name": "F", "config": {
        "name": "p", "deliver_subject": "fuzz.push", "ack_policy": "all",
        "deliver_policy": "by_start_sequence", "opt_start_seq": 2, "flow_control": True,
        "idle_heartbeat": 5_000_000_000}}),
    ("CONSUMER.CREATE.F", {"stream_name": "F", "config": {
        "ack_policy": "none", "filter_subjects": ["f.a", "f.b"], "inactive_threshold": 10**9}}),
    ("CONSUMER.DURABLE.CREATE.F.d", {"stream_name": "F", "config": {
        "durable_name": "d", "ack_policy": "explicit", "max_ack_pending": 2}}),
    ("CONSUMER.INFO.F.c", b""),
    ("CONSUMER.NAMES.F", {"offset": 0}),
    ("CONSUMER.LIST.F", {"offset": 0}),
    ("CONSUMER.DELETE.F.d", b""),
    ("CONSUMER.PAUSE.F.c", {"pause_until": "2030-01-01T00:00:00Z"}),
    ("CONSUMER.MSG.NEXT.F.c", {"batch": 2, "expires": 300_000_000, "no_wait": True}),
    ("CONSUMER.MSG.NEXT.F.c", {"batch": 1, "max_bytes": 10, "expires": 200_000_000,
                               "idle_heartbeat": 100_000_000}),
    ("CONSUMER.MSG.NEXT.F.c", b"3"),
    ("ACCOUNT.PURGE", b""),
]
ACKS = [b"+ACK", b"-NAK", b'-NAK {"delay": 1000000000}', b"+WPI", b"+TERM",
        b'+NXT {"batch": 1}', b"+TERM reason", b""]

WEIRD: list[Any] = [
    None, True, False, 0, -1, 2**63, -(2**63), 2**64 + 7, 10**40, 1.5e308, float("nan"),
    "", "x" * 300, "\u0000", "f.*", ">", "..", [], {}, [1, "a", None], {"a": {"b": []}},
]


def _mutate_value(rng: random.Random, v: Any, depth: int = 0) -> Any:
    if isinstance(v, dict) and v and depth < 4 and rng.random() < 0.6:
        out = dict(v)
        key = rng.choice(list(out))
        roll = rng.random()
        if roll < 0.15:
            del out[key]
        elif roll < 0.25:
            out[rng.choice(["bogus", "config", "name", "seq", "batch", key + "x"])] = \
                rng.choice(WEIRD)
        else:
            out[key] = _mutate_value(rng, out[key], depth + 1)
        return out
    if isinstance(v, list) and v and rng.random() < 0.5:
        out_l = list(v)
        i = rng.randrange(len(out_l))
        out_l[i] = _mutate_value(rng, out_l[i], depth + 1)
        return out_l
    if isinstance(v, int) and not isinstance(v, bool) and rng.random() < 0.5:
        return rng.choice([v + 1, -v, v * 2**40, 2**64, -1, 0])
    return rng.choice(WEIRD)


def _nested(rng: random.Random) -> bytes:
    depth = rng.choice([50, 500, 5000, 50_000])
    if rng.random() < 0.5:
        return b"[" * depth + b"]" * depth
    return b'{"config":' * depth + b"1" + b"}" * depth


def _mutate(rng: random.Random, subject: str, body: Any) -> tuple[str, bytes]:
    """One mutated request (API subject suffix, payload)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    roll = rng.random()
    if roll < 0.25 and not isinstance(body, bytes):
        raw = json.dumps(_mutate_value(rng, body), allow_nan=True).encode()
    elif roll < 0.40 and raw:
        b = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        raw = bytes(b)
    elif roll < 0.50 and raw:
        raw = raw[:rng.randrange(len(raw))]
    elif roll < 0.57:
        raw = _nested(rng)
    elif roll < 0.62:
        raw = raw[:-1] + b',"x":"\xff\xfe\xc0\x80"}' if raw.endswith(b"}") else b"\xff\xc3(" + raw
    elif roll < 0.66:
        raw = b'{"name":"' + b"A" * rng.choice([10_000, 300_000]) + b'"}'
    elif roll < 0.72:
        raw = json.dumps(rng.choice(WEIRD)).encode()
    elif roll < 0.76:
        raw = json.dumps({"seq": rng.choice([2**64, -5, 0, "1", 1.25, None, [1]]),
                          "batch": rng.choice([0, -1, 2**31, 10**12, "2"])}).encode()
    # The subject: mostly the original, sometimes a changed or extra token, or a long one.
    roll = rng.random()
    tokens = subject.split(".")
    if roll < 0.10:
        tokens[rng.randrange(len(tokens))] = rng.choice(
            ["*", ">", "", "CTRLX", "F" * 300, "f", "c", "..", "$G", "\u00e9"])
    elif roll < 0.15:
        tokens.append(rng.choice(["x", "*", ">", "F"]))
    elif roll < 0.18:
        tokens = tokens[:rng.randrange(1, len(tokens) + 1)]
    elif roll < 0.20:
        # Long, but inside the 4096-byte control line (a longer PUB line closes the
        # connection, in nats-server too: that is core protocol, not the API).
        tokens.append("s" * rng.choice([300, 1000, 3500]))
    subj = ".".join(tokens).replace(" ", "_")
    return subj, raw


def _ack_subject(rng: random.Random) -> str:
    parts = ["F", "c", "1", str(rng.randint(1, 40)), str(rng.randint(1, 40)),
             str(time.time_ns()), "0"]
    if rng.random() < 0.4:
        i = rng.randrange(len(parts))
        parts[i] = rng.choice(["-1", "18446744073709551616", "x", "", "*", "G", "CTRL"])
    if rng.random() < 0.1:
        parts = parts[:rng.randrange(len(parts))]
    return "$JS.ACK." + ".".join(parts)


async def _control(nc: Any) -> list[tuple[str, str, str]]:
    """The control stream's messages as (subject, data, headers) from STREAM.MSG.GET."""
    out = []
    for seq in range(1, CONTROL_MSGS + 2):
        reply = json.loads((await nc.request("$JS.API.STREAM.MSG.GET.CTRL",
                                             json.dumps({"seq": seq}).encode(), 5)).data)
        if "error" in reply:
            assert reply["error"]["err_code"] == 10037, reply  # no message found (past the end)
            continue
        m = reply["message"]
        out.append((m["subject"], m["data"], m.get("hdrs", "")))
    return out


async def _fuzz(node: ServerProc, seed: int, count: int) -> dict[str, int]:
    rng = random.Random(seed)
    url = f"nats://127.0.0.1:{node.port}"
    nc = await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.1,
                            error_cb=_quiet, disconnected_cb=_quiet_ev)
    js = nc.jetstream()
    tally = {"answered": 0, "timeout": 0, "no_responders": 0, "client_refused": 0, "acks": 0}
    try:
        await nc.request("$JS.API.STREAM.CREATE.CTRL", json.dumps(
            {"name": "CTRL", "subjects": ["ctl.>"]}).encode(), 5)
        for i in range(CONTROL_MSGS):
            await js.publish(f"ctl.{i % 3}", f"control {i}".encode(),
                             headers={"i": str(i)} if i % 5 == 0 else None)
        before = await _control(nc)
        assert len(before) == CONTROL_MSGS
        for subject, body in CORPUS[3:4] + CORPUS[17:19]:
            await nc.request("$JS.API." + subject, json.dumps(body).encode(), 5)
        for i in range(10):
            await js.publish(f"f.{'ab'[i % 2]}", f"fuzz {i}".encode())

        async def one(n: int) -> None:
            if rng.random() < 0.1:
                tally["acks"] += 1
                payload = rng.choice(ACKS)
                if rng.random() < 0.3:
                    payload = _nested(rng) if rng.random() < 0.3 else payload + b"\xff{"
                await nc.publish(_ack_subject(rng), payload)
                return
            subject, body = rng.choice(CORPUS)
            subj, raw = _mutate(rng, subject, body) if rng.random() < 0.85 else (
                subject, body if isinstance(body, bytes) else json.dumps(body).encode())
            if TRACE:
                print("REQ", subj[:200], raw[:300])
            try:
                await nc.request("$JS.API." + subj, raw, timeout=REQ_TIMEOUT)
                tally["answered"] += 1
            except NatsTimeout:
                tally["timeout"] += 1
            except NoRespondersError:
                tally["no_responders"] += 1
            except (ValueError, nats.errors.MaxPayloadError, nats.errors.BadSubjectError):
                tally["client_refused"] += 1

        for start in range(0, count, CONCURRENCY):
            await asyncio.gather(*(one(n) for n in range(start, min(start + CONCURRENCY, count))))
            assert node.alive(), f"seed {seed}: node died after request {start}:\n" \
                f"{node.log_text()[-4000:]}"
        await nc.flush(5)  # PING/PONG through the same connection
        info = json.loads((await nc.request("$JS.API.STREAM.INFO.F", b"", 5)).data)
        assert "error" in info or info["config"]["name"] == "F", (seed, info)
        account = json.loads((await nc.request("$JS.API.INFO", b"", 5)).data)
        assert "streams" in account or "error" in account, (seed, account)
        after = await _control(nc)
        assert after == before, f"seed {seed}: control stream changed"
    finally:
        await nc.close()
    return tally


async def _quiet(e: Exception) -> None:
    if TRACE:
        print("CLIENT ERROR", repr(e))


async def _quiet_ev() -> None:
    return None


def test_random_and_mutated_api_requests_never_hurt_the_node(
        servers: Servers, tmp_path: Path) -> None:
    seed = int(os.environ.get("JETRAFT_FUZZ_SEED", random.randrange(1 << 32)))
    node = servers.jetraft(args=["-js", "-sd", str(tmp_path / "store"), *(["-D"] if TRACE else [])])
    try:
        tally = asyncio.run(_fuzz(node, seed, COUNT))
    except BaseException as e:
        raise AssertionError(f"fuzz seed {seed} (replay: JETRAFT_FUZZ_SEED={seed}): {e!r}\n"
                             f"{node.log_text()[-4000:]}") from e
    print(f"fuzz seed {seed}: {tally}")
    assert node.alive(), f"seed {seed}"
    raw = RawConn(node.port)
    assert raw.info["jetstream"] is True, f"seed {seed}"
    raw.send(b"CONNECT {\"verbose\":false}\r\nPING\r\n")
    assert raw.read_line() == b"PONG", f"seed {seed}"
    log = node.log_text()
    bad = [ln for ln in log.splitlines() if any(b in ln for b in BAD_LOG)]
    assert not bad, f"seed {seed}: {bad[:10]}"
    assert tally["answered"] > COUNT // 4, (seed, tally)


async def _regressions(node: ServerProc) -> None:
    nc = await nats.connect(f"nats://127.0.0.1:{node.port}")

    async def api(subject: str, body: Any) -> dict[str, Any]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        try:
            return json.loads((await nc.request("$JS.API." + subject, raw, 5)).data)
        except NatsTimeout:
            return {"timeout": subject}

    try:
        # Deep nesting: an invalid-JSON error, not a task failure (RecursionError).
        for body in (b"[" * 50_000 + b"]" * 50_000, b'{"a":' * 5000 + b"1" + b"}" * 5000):
            reply = await api("STREAM.CREATE.N", body)
            assert reply["error"]["err_code"] == 10025, reply
        # Names: 255-byte stream names work (its group needed a shorter file name); a
        # durable over 255 bytes is nats-server's 10102 (it stopped the node: LMDB key size).
        long = "S" * 255
        assert (await api(f"STREAM.CREATE.{long}", {"name": long, "subjects": ["l.>"]})
                )["config"]["name"] == long
        assert (await api(f"STREAM.INFO.{long}", b""))["config"]["name"] == long
        c = "c" * 256
        reply = await api(f"CONSUMER.DURABLE.CREATE.{long}.{c}",
                          {"stream_name": long, "config": {"durable_name": c}})
        assert reply["error"]["err_code"] == 10102, reply
        # A subject or Nats-Msg-Id longer than an LMDB key holds: an error PubAck (the put
        # failed in the apply and stopped the node, and again at every restart).
        js = nc.jetstream()
        for subject, hdrs in ((f"l.{'x' * 600}", None), ("l.y", {"Nats-Msg-Id": "m" * 700})):
            with pytest.raises(nats.js.errors.APIError) as err:
                await js.publish(subject, b"hi", stream=long, headers=hdrs, timeout=5)
            assert err.value.err_code == 10077, err.value
        assert (await js.publish("l.ok", b"hi", timeout=5)).seq == 1
        # ... also when the stream's transform or a source's makes the subject that long
        # (the stored subject was not checked, and a source's index name holding the
        # transform made its progress key too long: both stopped the node at every start).
        far = "L" * 600
        reply = await api("STREAM.CREATE.TX", {"name": "TX", "subjects": ["tx.>"],
                                               "subject_transform": {"src": "tx.>",
                                                                     "dest": far + ".>"}})
        assert "error" not in reply, reply
        with pytest.raises(nats.js.errors.APIError) as err:
            await js.publish("tx.a", b"hi", stream="TX", timeout=5)
        assert err.value.err_code == 10077, err.value
        reply = json.loads((await nc.request("tx.b", b"hi", 5)).data)  # no header
        assert reply["error"]["err_code"] == 10077, reply
        reply = await api("STREAM.CREATE.SX", {"name": "SX", "sources": [{
            "name": long, "subject_transforms": [{"src": "l.>", "dest": far + ".>"}]}]})
        assert "error" not in reply, reply
        for _ in range(100):  # the copy of l.ok is skipped: no lag left, nothing stored
            info = await api("STREAM.INFO.SX", b"")
            if info.get("sources") and info["sources"][0]["lag"] == 0 \
                    and info["sources"][0]["active"] >= 0:
                break
            await asyncio.sleep(0.2)
        assert info["sources"][0]["lag"] == 0 and info["state"]["messages"] == 0, info
        assert node.alive(), node.log_text()[-3000:]
        # Ack subjects with numbers outside int64 and a NAK delay past int64: ignored / no
        # delay (they failed when the ack entry was encoded: "task failed").
        await api(f"CONSUMER.CREATE.{long}.k", {"stream_name": long, "config": {
            "name": "k", "ack_policy": "explicit"}})
        ts = time.time_ns()
        for nums, body in ((f"1.18446744073709551616.1.{ts}.0", b"+ACK"),
                           (f"1.-1.1.{ts}.0", b"+ACK"), (f"1.1.1.{ts}.0", b'-NAK {"delay": 1e40}'),
                           (f"1.1.1.{ts}.0", b'-NAK {"delay": ' + b"9" * 40 + b"}")):
            await nc.publish(f"$JS.ACK.{long}.k.{nums}", body)
        await nc.flush(5)
        # Create, purge, delete of one stream at once: a group removed while its purge was
        # being applied stopped the node (raft InvariantError).
        ops = [("STREAM.CREATE.G", {"name": "G", "subjects": ["g.>"]}),
               ("STREAM.DELETE.G", b""), ("STREAM.PURGE.G", {"seq": 4}), ("STREAM.INFO.G", b"")]
        rng = random.Random(5)
        for _ in range(15):
            await asyncio.gather(*(api(*rng.choice(ops)) for _ in range(10)))
            assert node.alive(), node.log_text()[-3000:]
        await nc.flush(5)
    finally:
        await nc.close()


def test_fuzz_findings_stay_fixed(servers: Servers, tmp_path: Path) -> None:
    node = servers.jetraft(args=["-js", "-sd", str(tmp_path / "store")])
    asyncio.run(_regressions(node))
    assert node.alive()
    bad = [ln for ln in node.log_text().splitlines() if any(b in ln for b in BAD_LOG)]
    assert not bad, bad[:10]
