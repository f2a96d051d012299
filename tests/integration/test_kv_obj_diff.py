"""Key/Value and Object Store side by side with nats-server 2.15: what the older scripts
(test_nats_js_jetstream.py's kv/obj examples, test_jetstream_serve.py's KV script,
test_jetstream_objects.py, test_jetstream_mirrors.py's KV mirror) leave out.

One `nats-server -js` and one `jetraft serve -js` for the whole module; each test runs the
same script against both at once (buckets named per test, so the tests share nothing but
the servers) and compares every step: replies, errors (exception, code, err_code,
description), headers, revisions, the JSON of stream info and of stored messages.

- nats-py (`_kv_cas`, `_kv_reads`, `_kv_ttl`): CAS and its errors, value and bucket size
  limits, keys that are not valid subjects, history after deletes and purges, keys with
  filters, every watch mode, gets by revision, direct gets (headers), republish, and
  purge_deletes; per-key TTLs, purges with a TTL, and the subject delete markers that TTL and
  max_age expiry leave (the whole stream is compared message by message, headers included).
- nats.js (tests/js/kv_diff.mjs, obj_diff.mjs): the same areas as nats.js sends them (it puts
  `previousSeq` on deletes and purges, makes mirrored and sourced buckets itself, reads status
  through getters), and objects of every size around a chunk, replace with a revision,
  links to deleted objects and to links, renames, seal, missing buckets.
- a raw publish with a fast-batch reply subject (`.$FI`) to a plain stream.

Allowed to differ (ALLOWED_TO_DIFFER and tests/js/transcript.mjs VOLATILE): times, server
ids and names, the cluster name. KNOWN_DIFFS: steps where Jetraft differs on purpose; each
must still differ (a fix shows up as a failure to clean up).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import pytest
from nats.js.api import RePublish

from tests.integration.conftest import ServerProc, Servers
from tests.integration.jsdiff import assert_same_steps, kv_history, kv_keys
from tests.integration.test_nats_js import HAVE_JS, JS_DIR

ALLOWED_TO_DIFFER = {"created", "ts", "first_ts", "last_ts", "time", "leader", "mtime",
                     "last_active", "Nats-Time-Stamp", "cluster", "server_id"}

# (script, step) -> why Jetraft differs.
KNOWN_DIFFS: dict[tuple[str, str], str] = {
    ("obj_diff.mjs", "batched_put_get"):
        "fast-batch publishing (ADR-50, nats.js `allowBatched`) is not implemented: Jetraft "
        "refuses every `.$FI` publish with 10205 'batch publish is disabled' (nats-server "
        "does so only without allow_batched) instead of storing it as a plain publish",
}

Script = Callable[[str], Awaitable[list[Any]]]
# As test_nats_js.py: CI installs the packages, so there a missing client is a failure.
NEEDS_JS = pytest.mark.skipif(not HAVE_JS and not os.environ.get("CI"),
                              reason="node or tests/js/node_modules missing")


@pytest.fixture(scope="module")
def servers_pair(module_servers: Servers, tmp_path_factory: pytest.TempPathFactory
                 ) -> dict[str, ServerProc]:
    store = tmp_path_factory.mktemp("kvobj")
    return {"nats-server": module_servers.nats_server(args=["-js", "-sd", str(store / "theirs")]),
            "jetraft": module_servers.jetraft(args=["-js", "-sd", str(store / "ours")])}


async def _both(pair: dict[str, ServerProc], script: Script) -> tuple[list[Any], list[Any]]:
    """(ours, theirs): the script against both servers at once (the sleeps overlap)."""
    ours, theirs = await asyncio.gather(script(pair["jetraft"].url),
                                        script(pair["nats-server"].url))
    return ours, theirs


# ----------------------------------------------------------------------------- helpers


def _error(exc: BaseException) -> dict[str, Any]:
    out: dict[str, Any] = {"exception": type(exc).__name__}
    for attr in ("code", "err_code", "description"):
        if getattr(exc, attr, None) is not None:
            out[attr] = getattr(exc, attr)
    return out


def _entry(e: Any) -> Any:
    if e is None:
        return None
    return {"key": e.key, "value": e.value, "revision": e.revision, "delta": e.delta,
            "operation": e.operation}


def _plain(value: Any) -> Any:
    """KV entries and lists of them as dicts; anything else as it is."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if hasattr(value, "key") and hasattr(value, "revision"):
        return _entry(value)
    return value


class Steps(list[Any]):
    async def run(self, name: str, call: Awaitable[Any]) -> None:
        """The step's result, or the error it raised (so a difference hides no later step)."""
        try:
            self.append((name, _plain(await call)))
        except Exception as exc:  # noqa: BLE001 - the error is the step's result
            self.append((name, _error(exc)))


async def _api(nc: Any, subject: str, body: Any = b"") -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return json.loads((await nc.request("$JS.API." + subject, data, timeout=10)).data)


async def _stored(nc: Any, stream: str) -> list[Any]:
    """Every message the stream holds (STREAM.MSG.GET by sequence), headers decoded, and a
    404 for each sequence in between: the whole store, compared message by message."""
    state = (await _api(nc, "STREAM.INFO." + stream))["state"]
    out: list[Any] = []
    for seq in range(state["first_seq"], state["last_seq"] + 1):
        got = await _api(nc, "STREAM.MSG.GET." + stream, {"seq": seq})
        msg = got.get("message")
        if msg is None:
            out.append((seq, got["error"]["err_code"]))
            continue
        out.append((seq, msg["subject"], base64.b64decode(msg.get("hdrs", "")).decode(),
                    base64.b64decode(msg.get("data", ""))))
    return out


async def _state(nc: Any, stream: str) -> dict[str, Any]:
    state = (await _api(nc, "STREAM.INFO." + stream))["state"]
    state.pop("consumer_count", None)  # watchers nats-py leaves behind go in their own time
    return state  # type: ignore[no-any-return]


async def _direct(nc: Any, stream: str, subject: str) -> tuple[dict[str, str], bytes]:
    msg = await nc.request(f"$JS.API.DIRECT.GET.{stream}.{subject}", b"", timeout=10)
    return {str(k): v for k, v in (msg.headers or {}).items()}, msg.data


async def _watched(kv: Any, **kwargs: Any) -> list[Any]:
    """A watch's entries up to the one nothing is pending after (the bucket's last message
    is a put, so every mode ends with it; bounded). Not `watch_initial`'s count: with
    ignore_deletes the skipped deletes never come, and it would wait out its bound."""
    watcher = await kv.watchall(**kwargs)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    got: list[Any] = []
    try:
        while not (got and got[-1]["delta"] == 0) and (left := deadline - loop.time()) > 0:
            try:
                entry = await watcher.updates(timeout=left)
            except Exception:  # noqa: BLE001 (nats.errors.TimeoutError: compare what came)
                break
            if entry is not None:  # nats-py's "caught up" marker, wherever it was queued
                got.append(_entry(entry))
        return got
    finally:
        await watcher.stop()


# ----------------------------------------------------------------------------- nats-py


async def _kv_cas(url: str) -> list[Any]:
    """Create/update/delete/purge and the revisions and errors each gives; the size limits."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    s = Steps()
    try:
        kv = await js.create_key_value(bucket="py_cas", history=5, description="d",
                                       max_value_size=200, max_bytes=4096)
        await s.run("stream info", _api(nc, "STREAM.INFO.KV_py_cas"))
        await s.run("put", kv.put("a", b"1"))
        await s.run("create existing", kv.create("a", b"2"))
        await s.run("update wrong revision", kv.update("a", b"2", last=7))
        await s.run("update", kv.update("a", b"2", last=1))
        await s.run("delete wrong revision", kv.delete("a", last=1))
        await s.run("delete", kv.delete("a", last=2))
        await s.run("get deleted", kv.get("a"))
        await s.run("update deleted with 0", kv.update("a", b"x", last=0))
        await s.run("create over delete", kv.create("a", b"3"))
        await s.run("purge", kv.purge("a"))
        await s.run("create over purge", kv.create("a", b"4"))
        await s.run("history after purge", kv_history(kv, "a"))
        await s.run("expected subject seq on another key", js.publish(
            "$KV.py_cas.b", b"x", headers={"Nats-Expected-Last-Subject-Sequence": "6"}))
        await s.run("expected subject seq for another subject", js.publish(
            "$KV.py_cas.b", b"x", headers={"Nats-Expected-Last-Subject-Sequence": "6",
                                         "Nats-Expected-Last-Subject-Sequence-Subject":
                                             "$KV.py_cas.a"}))
        await s.run("value over max", kv.put("big", b"x" * 201))
        await s.run("value at max", kv.put("exact", b"x" * 200))
        await s.run("key with empty token", kv.put("a..b", b"x", validate_keys=False))
        await s.run("key with a space", kv.put("a b", b"x", validate_keys=False))
        await s.run("key with *", kv.put("a.*", b"x", validate_keys=False))
        await s.run("key with >", kv.put("a.>", b"x", validate_keys=False))
        await s.run("invalid key checked", kv.put("a b", b"x"))
        filled: Any = None
        for i in range(60):
            try:
                await kv.put(f"fill{i}", b"y" * 60)
            except Exception as exc:  # noqa: BLE001 - the error is the result
                filled = (i, _error(exc))
                break
        s.append(("fill to max_bytes", filled))
        await s.run("state full", _state(nc, "KV_py_cas"))
        await s.run("stored", _stored(nc, "KV_py_cas"))
    finally:
        await nc.close()
    return s


async def _kv_reads(url: str) -> list[Any]:
    """History, keys and watches after deletes and purges; gets; republish; purge_deletes."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    s = Steps()
    try:
        republished = await nc.subscribe("rp.>")
        kv = await js.create_key_value(bucket="py_reads", history=4, direct=True,
                                       republish=RePublish(src=">", dest="rp.>"))
        await s.run("stream info", _api(nc, "STREAM.INFO.KV_py_reads"))
        for key, value in [("a.1", b"1"), ("a.2", b"2"), ("b.1", b"3"), ("a.1", b"4"),
                           ("c", b"5")]:
            await kv.put(key, value)
        await kv.delete("a.2")
        await kv.purge("b.1")
        await kv.put("a.1", b"6")
        seen = []
        for _ in range(8):
            m = await republished.next_msg(timeout=10)
            seen.append((m.subject, dict(m.headers or {}), m.data))
        s.append(("republished", seen))
        await s.run("keys", kv_keys(kv))
        await s.run("keys two filters", kv.keys(filters=["a.*", "c"]))
        for key in ("a.1", "a.2", "b.1"):
            await s.run(f"history {key}", kv_history(kv, key))
        for name, kwargs in [("last values", {}), ("include_history", {"include_history": True}),
                             ("ignore_deletes", {"ignore_deletes": True}),
                             ("meta_only", {"meta_only": True}),
                             ("headers_only", {"headers_only": True})]:
            await s.run(f"watch {name}", _watched(kv, **kwargs))
        await s.run("get by revision", kv.get("a.1", revision=4))
        await s.run("get revision of another key", kv.get("a.1", revision=3))
        await s.run("get deleted key's old revision", kv.get("a.2", revision=2))
        await s.run("direct last", _direct(nc, "KV_py_reads", "$KV.py_reads.a.1"))
        await s.run("direct deleted", _direct(nc, "KV_py_reads", "$KV.py_reads.a.2"))
        await s.run("direct missing", _direct(nc, "KV_py_reads", "$KV.py_reads.zz"))
        status = await kv.status()
        s.append(("status", (status.bucket, status.values, status.history, status.ttl)))
        await s.run("purge_deletes", kv.purge_deletes(olderthan=0))
        await s.run("stored after purge_deletes", _stored(nc, "KV_py_reads"))
        await s.run("keys after purge_deletes", kv_keys(kv))
    finally:
        await nc.close()
    return s


async def _kv_ttl(url: str) -> list[Any]:
    """Per-key TTLs (create, purge with a TTL, raw `Nats-TTL`), max_age, and the subject
    delete markers expiry leaves: a value or a KV delete leaves one, a KV purge or an
    expiring marker none. (~8 s: the windows are wide enough for a loaded machine.)"""
    nc = await nats.connect(url)
    js = nc.jetstream()
    s = Steps()
    try:
        kv = await js.create_key_value(bucket="py_ttl", history=3, limit_marker_ttl=3.0)
        await s.run("stream info", _api(nc, "STREAM.INFO.KV_py_ttl"))
        await s.run("create with ttl", kv.create("k", b"v", msg_ttl=1.0))
        await s.run("create with ttl under a second", kv.create("k2", b"v", msg_ttl=0.5))
        await s.run("put", kv.put("p", b"v"))
        await s.run("purge with ttl", kv.purge("p", msg_ttl=1.0))
        await s.run("create with long ttl", kv.create("long", b"v", msg_ttl=60))
        for name, ttl in (("never", "never"), ("negative", "-5"), ("zero", "0")):
            await s.run(f"ttl {name}", js.publish(f"$KV.py_ttl.{name}", b"v",
                                                  headers={"Nats-TTL": ttl}))
        aged = await js.create_key_value(bucket="py_aged", history=2, ttl=2.0,
                                         limit_marker_ttl=3.0)
        await aged.put("v", b"1")
        await aged.put("d", b"1")
        await aged.delete("d")
        await aged.put("p", b"1")
        await aged.purge("p")
        await s.run("purge api filter", _api(nc, "STREAM.PURGE.KV_py_aged",
                                             {"filter": "$KV.py_aged.v"}))
        await aged.put("q", b"1")
        await s.run("purge api keep", _api(nc, "STREAM.PURGE.KV_py_aged",
                                           {"filter": "$KV.py_aged.q", "keep": 1}))
        await s.run("aged stored before", _stored(nc, "KV_py_aged"))
        # Markers live 3 s (TTLs under that are raised to it), or as long as max_age lets
        # them. d, d's delete, p's purge and q go by max_age (2 s): markers for d and q,
        # from 2 to 4 s. k and p's purge (TTL 1 s, raised to 3 s) go at 3 s: a marker for k,
        # from 3 to 6 s. Each is looked at in the middle of its window (load moves timers).
        await asyncio.sleep(3.0)
        await s.run("aged stored at 3 s", _stored(nc, "KV_py_aged"))
        await asyncio.sleep(1.5)
        await s.run("ttl stored at 4.5 s", _stored(nc, "KV_py_ttl"))
        await s.run("get expired", kv.get("k"))
        await s.run("history expired", kv.history("k"))
        await asyncio.sleep(3.0)
        await s.run("keys", kv.keys())
        await s.run("ttl state at 7.5 s", _state(nc, "KV_py_ttl"))
        await s.run("aged state at 7.5 s", _state(nc, "KV_py_aged"))
        await s.run("ttl stored at 7.5 s", _stored(nc, "KV_py_ttl"))
    finally:
        await nc.close()
    return s


async def _sourced_headers(url: str) -> list[Any]:
    """What a source and a mirror store of messages published with `Nats-Expected-*`
    headers (what nats.js puts on a KV create over a delete): the origin keeps them, the
    copies do not (case-sensitive prefix)."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    s = Steps()
    try:
        await _api(nc, "STREAM.CREATE.HO", {"name": "HO", "subjects": ["ho.>"],
                                            "allow_msg_ttl": True, "allow_rollup_hdrs": True})
        for subject, hdrs in [
                ("ho.a", {"Nats-Expected-Stream": "HO", "X-A": "1"}),
                ("ho.a", {"Nats-Expected-Last-Sequence": "1"}),
                ("ho.a", {"Nats-Expected-Last-Subject-Sequence": "2", "X-B": "2"}),
                ("ho.b", {"Nats-Expected-Last-Subject-Sequence": "3",
                          "Nats-Expected-Last-Subject-Sequence-Subject": "ho.a"}),
                ("ho.c", {"Nats-Msg-Id": "m1", "Nats-Expected-Last-Msg-Id": ""}),
                ("ho.c", {"Nats-Expected-Last-Msg-Id": "m1"}),
                ("ho.d", {"nats-expected-last-sequence": "6", "Nats-Expected-Foo": "x",
                          "Nats-TTL": "1h"}),
                ("ho.e", {"Nats-Rollup": "sub", "X-Nats-Expected-Stream": "y"})]:
            await s.run(f"publish {sorted(hdrs)}", js.publish(subject, b"d", headers=hdrs))
        await _api(nc, "STREAM.CREATE.HS", {"name": "HS", "subjects": ["hs.>"],
                                            "sources": [{"name": "HO"}], "allow_msg_ttl": True})
        await _api(nc, "STREAM.CREATE.HM", {"name": "HM", "mirror": {"name": "HO"},
                                            "allow_msg_ttl": True})
        for name in ("HS", "HM"):
            for _ in range(100):
                if (await _api(nc, "STREAM.INFO." + name))["state"]["messages"] == 8:
                    break
                await asyncio.sleep(0.1)
        for name in ("HO", "HS", "HM"):
            # the source header's last word is an id the server makes up
            await s.run(f"stored {name}", _stored(nc, name))
            s[-1] = (s[-1][0], [m[:2] + (re.sub(r"(Nats-Stream-Source: .*) \S+\r\n",
                                                r"\1 ID\r\n", m[2]),) + m[3:]
                                if len(m) == 4 else m for m in s[-1][1]])
    finally:
        await nc.close()
    return s


async def _fast_batch_refused(url: str) -> list[Any]:
    """Publishes whose reply subject ends in `.$FI` (a fast batch's) to a stream without
    allow_batched: refused, nothing stored; `$FI` alone or `.$FIX` are plain replies."""
    nc = await nats.connect(url)
    s = Steps()
    try:
        await _api(nc, "STREAM.CREATE.FBR", {"name": "FBR", "subjects": ["fbr.>"]})
        inbox = await nc.subscribe("_FI.>")
        for reply in ["_FI.b1.10.fail.1.0.$FI", "_FI.b1.10.fail.2.1.$FI",
                      "_FI.b2.10.maybe.1.0.$FI", "_FI.x.$FI", "_FI.b1.10.fail.1.0.$FIX",
                      "_FI.$FI.b"]:
            await nc.publish("fbr.a", b"x", reply=reply)
            await s.run(reply, inbox.next_msg(timeout=10))
            got = s[-1][1]
            s[-1] = (reply, (got.subject, json.loads(got.data)) if hasattr(got, "data") else got)
        await s.run("stored", _stored(nc, "FBR"))
    finally:
        await nc.close()
    return s


async def test_kv_cas_and_limits_match_nats_server(servers_pair: dict[str, ServerProc]) -> None:
    ours, theirs = await _both(servers_pair, _kv_cas)
    assert_same_steps(ours, theirs, ALLOWED_TO_DIFFER)
    got = dict(theirs)
    assert got["update"] == 2 and got["create over purge"] == 6
    assert got["create existing"]["exception"] == "KeyWrongLastSequenceError"
    assert got["value over max"]["err_code"] == 10054
    assert got["fill to max_bytes"][1]["err_code"] == 10077


async def test_kv_reads_and_watches_match_nats_server(servers_pair: dict[str, ServerProc]
                                                      ) -> None:
    ours, theirs = await _both(servers_pair, _kv_reads)
    assert_same_steps(ours, theirs, ALLOWED_TO_DIFFER)
    got = dict(theirs)
    assert len(got["watch include_history"]) == 7
    assert [e["operation"] for e in got["history a.2"]] == [None, "DEL"]
    assert got["direct deleted"][0]["KV-Operation"] == "DEL"


async def test_kv_ttls_and_markers_match_nats_server(servers_pair: dict[str, ServerProc]
                                                     ) -> None:
    ours, theirs = await _both(servers_pair, _kv_ttl)
    assert_same_steps(ours, theirs, ALLOWED_TO_DIFFER)
    got = dict(theirs)
    markers = [m for m in got["aged stored at 3 s"] if len(m) == 4]
    assert [m[1] for m in markers] == ["$KV.py_aged.d", "$KV.py_aged.q"]  # none for the purge of p
    assert all("Nats-Marker-Reason: MaxAge" in m[2] for m in markers)
    assert [m[1] for m in got["ttl stored at 4.5 s"] if len(m) == 4 and "Marker" in m[2]] == [
        "$KV.py_ttl.k"]  # none for the purge of p


async def test_sourced_and_mirrored_headers_match_nats_server(
        servers_pair: dict[str, ServerProc]) -> None:
    ours, theirs = await _both(servers_pair, _sourced_headers)
    assert_same_steps(ours, theirs, ALLOWED_TO_DIFFER)
    got = dict(theirs)
    assert "Nats-Expected-Stream: HO" in got["stored HO"][0][2]
    assert got["stored HM"][0][2] == "NATS/1.0\r\nX-A: 1\r\n\r\n"
    assert got["stored HM"][1][2] == ""  # nothing left: no header block


async def test_fast_batch_publish_refused_as_nats_server(servers_pair: dict[str, ServerProc]
                                                         ) -> None:
    ours, theirs = await _both(servers_pair, _fast_batch_refused)
    assert_same_steps(ours, theirs, ALLOWED_TO_DIFFER)
    assert dict(theirs)["_FI.b1.10.fail.1.0.$FI"][1]["error"]["err_code"] == 10205
    assert len(dict(theirs)["stored"]) == 2  # the two plain replies only


# ----------------------------------------------------------------------------- nats.js


def _node(script: str, url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["node", script, url], cwd=JS_DIR, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _transcripts(script: str, pair: dict[str, ServerProc]) -> tuple[dict[str, Any],
                                                                      dict[str, Any]]:
    """(ours, theirs): the nats.js script against both servers at once."""
    procs = {name: _node(script, proc.url) for name, proc in pair.items()}
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"{script} against {name}:\n{stderr}"
        out[name] = json.loads(stdout)
    return out["jetraft"], out["nats-server"]


def _leaves(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two transcripts' values differ, one line per differing leaf."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [line for k in sorted(set(a) | set(b))
                for line in _leaves(a.get(k, "<missing>"), b.get(k, "<missing>"), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [line for i, (x, y) in enumerate(zip(a, b, strict=True))
                for line in _leaves(x, y, f"{path}[{i}]")]
    if a == b:
        return []
    return [f"{path}: jetraft {json.dumps(a)[:300]} nats-server {json.dumps(b)[:300]}"]


def _compare(script: str, ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert list(ours) == list(theirs), "the scripts ran different steps"
    differ = [line for k in theirs if (script, k) not in KNOWN_DIFFS
              for line in _leaves(ours[k], theirs[k], k)]
    assert not differ, "\n".join(differ)[:8000]
    for (known_script, step), why in KNOWN_DIFFS.items():
        if known_script == script:
            assert ours[step] != theirs[step], f"{step} now matches: remove it ({why})"


@NEEDS_JS
def test_nats_js_kv_matches_nats_server(servers_pair: dict[str, ServerProc]) -> None:
    ours, theirs = _transcripts("kv_diff.mjs", servers_pair)
    _compare("kv_diff.mjs", ours, theirs)
    assert theirs["create_over_delete"] == 4 and theirs["create_over_purge"] == 6
    assert theirs["delete_previous_seq_wrong"]["code"] == 10071
    assert theirs["fill_to_max_bytes"]["code"] == 10077
    assert [e["key"] for e in theirs["purge_with_ttl"]["after"]] == ["gone", "gone"]
    assert theirs["max_age_markers"] == [{"isUpdate": True, "key": "v", "operation": "PURGE",
                                          "revision": 4}]
    assert theirs["sourced_bucket"]["k"]["value"] == "2"
    assert theirs["sourced_bucket"]["k_headers"] == ["Nats-Stream-Source"]


@NEEDS_JS
def test_nats_js_object_store_matches_nats_server(servers_pair: dict[str, ServerProc]) -> None:
    ours, theirs = _transcripts("obj_diff.mjs", servers_pair)
    _compare("obj_diff.mjs", ours, theirs)
    sizes = {k: v["length"] for k, v in theirs.items() if k.startswith("get_")
             and isinstance(v, dict) and "length" in v}
    assert sizes["get_exact"] == 131072 and sizes["get_two_exact"] == 262144
    assert all(v["same"] for k, v in theirs.items() if k.startswith("get_")
               and isinstance(v, dict) and "same" in v)
    assert theirs["replace_previous_revision_wrong"]["code"] == 10071
    assert theirs["seal_again"]["sealed"] is True
    assert ours["batched_put_get"]["code"] == 10205  # refused at once, not a timeout

