"""Bytes flipped in `data.mdb` on disk: reads answer with a clear error, never with the damaged
message as data, and the node keeps serving everything else.

A real `jetraft serve -js` stores messages, is stopped, a byte inside one stored message is
flipped in the LMDB file (every copy LMDB left of that page: the live one is among them), and
the node starts again on it. Then nats-py reads the message through STREAM.MSG.GET
(`js.get_msg`) and DIRECT.GET (`js.get_msg(direct=True)`, and the raw request with
last-by-subject); a consumer created across it gets an answer.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import nats
import pytest

from tests.integration.conftest import ServerProc, Servers

N = 20
BAD = 7  # the sequence whose bytes are flipped


def _payload(seq: int) -> bytes:
    return f"MSG-{seq:04d}-".encode() + b"x" * 200


def _start(servers: Servers, store: Path) -> ServerProc:
    return servers.jetraft(args=["-js", "-sd", str(store)])


def _flip(data_mdb: Path, marker: bytes, at: int) -> int:
    """XOR one byte `at` bytes into every occurrence of `marker`; returns the count."""
    raw = bytearray(data_mdb.read_bytes())
    hits = 0
    start = raw.find(marker)
    while start >= 0:
        raw[start + at] ^= 0x5A
        hits += 1
        start = raw.find(marker, start + 1)
    data_mdb.write_bytes(bytes(raw))
    return hits


async def _fill(url: str) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        await js.add_stream(name="I", subjects=["i.*"], allow_direct=True)
        for seq in range(1, N + 1):
            ack = await js.publish(f"i.{seq}", _payload(seq))
            assert ack.seq == seq
    finally:
        await nc.close()


@pytest.mark.parametrize("where", ["payload", "subject"])
async def test_flipped_bytes_in_data_mdb_are_refused_not_served(
        servers: Servers, tmp_path: Path, where: str) -> None:
    store = tmp_path / "store"
    node = _start(servers, store)
    await _fill(node.url)
    assert node.stop(signal.SIGTERM) == 0
    # The payload's marker, or the subject's last byte (the record keeps the subject next
    # to the payload: `i.7` then `MSG-0007-`).
    marker, at = (_payload(BAD)[:9], 5) if where == "payload" else (
        f"i.{BAD}".encode() + _payload(BAD)[:9], 2)
    hits = _flip(store / "lmdb" / "data.mdb", marker, at)
    assert hits >= 1

    node = _start(servers, store)  # the store opens
    nc = await nats.connect(node.url)
    js = nc.jetstream()
    try:
        # STREAM.MSG.GET: an API error naming the stream, the sequence and the cause.
        with pytest.raises(nats.js.errors.APIError) as err:
            await js.get_msg("I", BAD)
        assert err.value.code == 500 and err.value.err_code == 10051, err.value
        assert "corrupt record (crc mismatch)" in err.value.description
        assert f"message {BAD}" in err.value.description

        # DIRECT.GET by sequence: a 500 status, no data.
        with pytest.raises(nats.js.errors.APIError) as err:
            await js.get_msg("I", BAD, direct=True)
        assert err.value.code == 500, err.value
        raw = await nc.request("$JS.API.DIRECT.GET.I", json.dumps({"seq": BAD}).encode())
        assert raw.headers and raw.headers.get("Status") == "500", raw.headers
        assert raw.data == b"" and b"MSG-" not in raw.data
        # DIRECT.GET last-by-subject (the `.<subject>` form) hits the same record.
        raw = await nc.request(f"$JS.API.DIRECT.GET.I.i.{BAD}", b"")
        assert raw.headers and raw.headers.get("Status") == "500", raw.headers
        # MSG.GET last_by_subj too.
        reply = json.loads((await nc.request(
            "$JS.API.STREAM.MSG.GET.I", json.dumps({"last_by_subj": f"i.{BAD}"}).encode())).data)
        assert reply["error"]["err_code"] == 10051, reply

        # Every other message is served intact, by both paths.
        for seq in [s for s in range(1, N + 1) if s != BAD]:
            assert (await js.get_msg("I", seq)).data == _payload(seq)
            assert (await js.get_msg("I", seq, direct=True)).data == _payload(seq)

        # A consumer across the damaged message: the request is answered (today with the
        # store's error; never a timeout), and whatever it delivers is intact.
        try:
            psub = await js.pull_subscribe("i.*", "c", stream="I")
        except nats.js.errors.APIError as exc:
            assert exc.err_code == 10051 and "corrupt record" in exc.description, exc
        else:
            try:
                for m in await psub.fetch(N, timeout=2):
                    assert m.data == _payload(m.metadata.sequence.stream)
            except nats.errors.TimeoutError:
                pass

        # The node is up and the stream takes new messages.
        ack = await js.publish("i.new", b"after")
        assert ack.seq == N + 1
        info = await js.stream_info("I")
        assert info.state.last_seq == N + 1
    finally:
        await nc.close()
    assert node.alive()
    assert "[FTL]" not in node.log_text()
