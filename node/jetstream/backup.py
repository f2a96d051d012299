"""STREAM.SNAPSHOT and STREAM.RESTORE in the node: the async edge around snapshot.py.

    out = await snapshot_request(svc, call, reply, body)   # reply, then chunks to the client
    out = await restore_request(svc, call, reply, body)    # reply, then chunks from the client

`svc` is the JetStreamService. SNAPSHOT answers with the config and state, then streams
chunks to the deliver subject with ack replies (nats-server's protocol, Jetraft's bytes).
RESTORE collects the chunks in a temporary file under the store dir, checks the whole file,
then creates the stream through the catalogue and proposes RESTORE_MSGS, CONSUMER_UPSERT and
CONSUMER_STATE entries: a restore is as durable as any publish.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import time
from typing import Any

from node.jetstream import (
    advisories,
    api,
    cluster_meta,
    consumer_config,
    gojson,
    jsaccount,
    ops,
    replies,
    requests,
    snapshot,
)
from node.jetstream import config as stream_config
from node.jetstream.crypt import read_file
from node.jetstream.errors import ApiError
from node.subject import valid_subject

RESTORE_IDLE_S = 30.0  # a restore upload with no chunk for this long is dropped



async def snapshot_request(svc: Any, call: api.Call, reply: str, body: bytes
                           ) -> dict[str, Any]:
    """Reply with the stream's config and state, then stream the snapshot's chunks to
    the deliver subject (snapshot.py has the byte format)."""
    if requests.is_empty_request(body):
        raise ApiError.of("JSBadRequestErr")
    sm = svc._stream(svc._key(call))
    try:
        req = gojson.decode(body, snapshot.SNAPSHOT_REQUEST)
    except gojson.GoJsonError as exc:
        raise ApiError.of("JSInvalidJSONErr", err=str(exc)) from exc
    deliver = req.get("deliver_subject") or ""
    if not valid_subject(deliver):
        raise ApiError.of("JSSnapshotDeliverSubjectInvalidErr")
    with sm.lock:
        state = sm.stream.state(len(sm.stream.consumers))
        cfg = stream_config.to_wire(sm.stream.cfg)
        consumers = [] if req.get("no_consumers") else [
            {"name": n, "config": consumer_config.to_wire(c.cfg),
             "state": c.state.encode().decode()}
            for n, c in sorted(sm.stream.consumers.items())]
        header = {"config": cfg, "consumers": consumers, "last_seq": sm.stream.last_seq,
                  "last_ts": sm.stream.last_ts}
    client = svc._requester(reply, call.account)
    svc._spawn(_send_snapshot(svc, sm, deliver, header, req.get("chunk_size") or 0,
                                    state, client))
    return {"type": snapshot.SNAPSHOT_TYPE, "config": level_only(cfg), "state": state}

async def _send_snapshot(svc: Any, sm: Any, deliver: str, header: dict[str, Any],
                         chunk_size: int, state: dict[str, Any],
                         client: dict[str, Any]) -> None:
    """Chunks with an ack reply (`$JS.SNAPSHOT.ACK.<stream>.<id>.<size>.<n>`) except the
    last, then an empty message; waits a little while more than the window is unacked,
    as nats-server does. Everything goes through the stream's account's client."""
    start = svc._now()
    account, name = jsaccount.split(sm.name)
    own = svc._client(sm.name)
    svc._advise(advisories.snapshot_event("snapshot_create", name, *svc._stamp(),
                                           state=state, client=client), account)
    token = nuid()
    ack_prefix = snapshot.ack_subject(name, token)
    out = [0]

    def on_ack(_sub: Any, subject: str, *_: Any) -> None:
        try:
            out[0] -= int(subject.split(".")[-2])
        except ValueError:
            pass

    ack_sub = own.subscribe_internal(ack_prefix + ".>", on_ack)
    try:
        chunks = snapshot.SnapshotWriter(header).chunks(
            _snapshot_msgs(sm, header["last_seq"]), chunk_size or snapshot.DEFAULT_CHUNK)
        ahead = next(chunks, None)
        index = 0
        while ahead is not None:
            chunk, ahead = ahead, next(chunks, None)
            index += 1
            if out[0] > snapshot.WINDOW:
                await asyncio.sleep(0.01)
            ack = f"{ack_prefix}.{len(chunk)}.{index}" if ahead is not None else None
            own.publish(deliver, ack, chunk)
            out[0] += len(chunk)
            await asyncio.sleep(0)
        own.publish(deliver, None, b"")
        event_id, end = svc._stamp()
        svc._advise(advisories.snapshot_event("snapshot_complete", name, event_id, end,
                                               start=start, end=end, client=client), account)
    finally:
        own.remove_sub(ack_sub)

def _snapshot_msgs(sm: Any, last: int) -> Any:
    """The stream's messages up to `last`, read 1,000 at a time under the machine's lock
    (a message removed while the snapshot streams is left out)."""
    at = 1
    while True:
        with sm.lock:
            seqs = []
            for seq in sm.store.seqs(at):
                if seq > last or len(seqs) >= 1000:
                    break
                seqs.append(seq)
            msgs = [m for m in (sm.store.load(s) for s in seqs) if m is not None]
        for m in msgs:
            yield ops.RestoredMsg(m.seq, m.ts_ns, m.subject, m.hdr, m.data)
        if len(seqs) < 1000:
            return
        at = seqs[-1] + 1

async def restore_request(svc: Any, call: api.Call, reply: str, body: bytes
                          ) -> dict[str, Any]:
    """Answer with the subject the chunks go to; they are written to a temporary file,
    and the empty message at the end restores the stream (`_finish_restore`)."""
    try:
        if requests.is_empty_request(body):
            raise ApiError.of("JSBadRequestErr")
        if svc._key(call) in svc.streams:
            raise ApiError.of("JSStreamNameExistRestoreFailedErr")
    except ApiError as err:
        return {**replies.error_reply("stream_restore_response", err),
                "deliver_subject": ""}
    key = svc._key(call)
    own = svc._client(key)  # the chunks come in, and the answer goes out, in the account
    deliver = snapshot.restore_subject(call.stream, nuid())
    # the file name holds no client text (a subject token may hold a path separator)
    path = os.path.join(svc.store_dir, f"restore-{secrets.token_hex(8)}")
    raw_sink = open(path, "wb", buffering=0)  # noqa: SIM115 - closed by the last chunk or timer
    # An encrypted store seals the upload too: it sits in the store dir until restored.
    codec = svc.env.files if svc.env is not None else None
    sink: Any = raw_sink if codec is None else codec.writer(raw_sink)
    assert svc.loop is not None
    loop = svc.loop
    state: dict[str, Any] = {"sub": None, "timer": None, "bytes": 0}
    client = svc._requester(reply, call.account)
    start = svc._now()
    svc._advise(advisories.snapshot_event("restore_create", call.stream, *svc._stamp(),
                                           client=client), call.account)

    def give_up() -> None:
        """No chunk for RESTORE_IDLE_S: drop the partial upload (nats-server stalls it)."""
        raw_sink.close()
        own.remove_sub(state["sub"])
        with contextlib.suppress(OSError):
            os.unlink(path)
        svc.log.warn(f"JetStream restore of {call.stream!r} stalled: dropped")

    def on_chunk(_sub: Any, _subject: str, chunk_reply: str | None, hdr: bytes | None,
                 data: bytes) -> None:
        state["timer"].cancel()
        if data:
            sink.write(data)
            state["bytes"] += len(data)
            if chunk_reply:
                own.publish(chunk_reply, None, b"")
            state["timer"] = loop.call_later(RESTORE_IDLE_S, give_up)
            return
        if sink is not raw_sink:
            sink.close()  # the last sealed chunk
        raw_sink.close()
        own.remove_sub(state["sub"])
        svc._spawn(_finish_restore(svc, key, path, chunk_reply, {
            "start": start, "bytes": state["bytes"], "client": client}))

    state["sub"] = own.subscribe_internal(deliver, on_chunk)
    state["timer"] = loop.call_later(RESTORE_IDLE_S, give_up)
    return {"type": snapshot.RESTORE_TYPE, "deliver_subject": deliver}

async def _finish_restore(svc: Any, key: str, path: str, reply: str | None,
                          done: dict[str, Any]) -> None:
    kind = "stream_create_response"
    account, name = jsaccount.split(key)
    try:
        out = await _restore_from(svc, key, path)
        svc._advise(advisories.stream_action("create", name, *svc._stamp()), account)
    except ApiError as err:
        out = replies.error_reply(kind, err)
    except (snapshot.SnapshotError, OSError, ValueError, KeyError) as exc:
        out = replies.error_reply(kind, ApiError.of("JSStreamRestoreErrF", err=str(exc)))
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    # nats-server sends the complete advisory for a failed restore too (checked, 2.15.1)
    event_id, end = svc._stamp()
    svc._advise(advisories.snapshot_event(
        "restore_complete", name, event_id, end, start=done["start"], end=end,
        bytes=done["bytes"], client=done["client"]), account)
    if reply:
        svc._client(key).publish(reply, None, _dumps(out))

async def _restore_from(svc: Any, key: str, path: str) -> dict[str, Any]:
    """Check the whole file first (a damaged backup restores nothing), then create the
    stream (`key`: in its account) through the catalogue, within the account's limits,
    and propose its messages and consumers as entries."""
    account, name = jsaccount.split(key)
    codec = svc.env.files if svc.env is not None else None
    reader = snapshot.SnapshotReader()
    with open(path, "rb") as raw:
        f = read_file(codec, raw)
        while block := f.read(1 << 20):
            reader.feed(block)
            reader.take()  # checked now, proposed on the second pass
    reader.finish()
    header = reader.header or {}
    cfg = stream_config.from_wire(header["config"])
    if cfg["name"] != name:
        raise ApiError.of("JSStreamRestoreErrF", err="snapshot is of another stream")
    async with svc._meta_lock:
        if key in svc.streams:
            raise ApiError.of("JSStreamNameExistRestoreFailedErr")
        configs = svc._configs(account)
        stored, _created = stream_config.check_create(name, cfg, False, configs,
                                                      limits=svc.server_limits)
        svc.check_limits(account, stored, configs, creating=True)
        now = time.time_ns()
        assert svc.mr is not None
        entry = cluster_meta.create(key, stream_config.to_wire(stored), now, [])
        del entry["peers"]  # as the single-node STREAM.CREATE writes it
        await svc.mr.propose(svc.meta_group, _dumps(entry))
        await svc._open_stream(key)
    sm = svc._stream(key)
    reader = snapshot.SnapshotReader()
    last_ts = 0
    with open(path, "rb") as raw:
        f = read_file(codec, raw)
        while block := f.read(1 << 20):
            reader.feed(block)
            msgs = reader.take()
            for i in range(0, len(msgs), 256):
                await svc._propose(sm, ops.RestoreMsgs(time.time_ns(),
                                                        tuple(msgs[i:i + 256])))
                last_ts = msgs[min(i + 256, len(msgs)) - 1].ts_ns
    # nats-server's restored stream keeps the last sequence but reports the time of the
    # last message it holds (checked, 2.15.1)
    await svc._propose(sm, ops.RestoreMsgs(time.time_ns(), (), header["last_seq"],
                                            last_ts or header["last_ts"]))
    for c in header.get("consumers", []):
        await svc._propose(sm, ops.ConsumerUpsert(time.time_ns(), c["name"],
                                                   _dumps(c["config"])))
        await svc._propose(sm, ops.ConsumerState(time.time_ns(), c["name"],
                                                  c["state"].encode()))
    svc._start_push(key)
    info = svc._stream_reply("stream_create_response", sm)
    return {"type": info["type"], "config": info["config"], "created": info["created"],
            "state": info["state"], "ts": info["ts"]}


def sweep_uploads(store_dir: str) -> None:
    """Partial STREAM.RESTORE uploads left by a crash: nothing refers to them any more."""
    for entry in os.listdir(store_dir):
        if entry.startswith("restore-"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(store_dir, entry))


def level_only(cfg: dict[str, Any]) -> dict[str, Any]:
    """A config as nats-server shows it in a snapshot reply: metadata `_nats.req.level` only."""
    meta = {k: v for k, v in (cfg.get("metadata") or {}).items()
            if not k.startswith("_nats.") or k == "_nats.req.level"}
    return {**cfg, "metadata": meta}


def nuid() -> str:
    """A 22-character id in nats-server's nuid alphabet (snapshot tokens, pin ids)."""
    alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    return "".join(secrets.choice(alphabet) for _ in range(22))


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
