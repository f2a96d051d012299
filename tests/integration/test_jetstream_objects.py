"""The Object Store as nats-py drives it, against `nats-server -js` and `jetraft serve -js`.

One script (create buckets, put in chunks, get through an ordered consumer, info, status,
list, watch with updates, delete, links to an object and to a bucket, seal, delete a bucket)
runs against both servers; every result and the whole JSON of the `$JS.API` replies it ends
with (bucket stream info, the meta messages) must be equal, except the values in
ALLOWED_TO_DIFFER (times and the object ids nats-py makes up).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import nats
from nats.js.api import ObjectStoreConfig

from tests.integration.conftest import Servers
from tests.integration.jsdiff import assert_same_steps

ALLOWED_TO_DIFFER = {"created", "ts", "first_ts", "last_ts", "time", "leader", "nuid",
                     "mtime", "last_active"}


async def _api(nc: Any, subject: str, body: Any = b"") -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return json.loads((await nc.request("$JS.API." + subject, data, timeout=10)).data)


def _info(info: Any) -> dict[str, Any]:
    return info.as_dict()  # type: ignore[no-any-return]


async def _meta_messages(nc: Any, stream: str, names: list[str]) -> list[Any]:
    """Each object's meta message as STREAM.MSG.GET returns it, its JSON body decoded."""
    out = []
    for name in names:
        subj = f"$O.{stream[4:]}.M." + base64.urlsafe_b64encode(name.encode()).decode()
        reply = await _api(nc, f"STREAM.MSG.GET.{stream}", {"last_by_subj": subj})
        if "message" in reply:
            reply["message"]["data"] = json.loads(base64.b64decode(reply["message"]["data"]))
        out.append(reply)
    return out


async def _script(url: str) -> list[Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    out: list[Any] = []
    try:
        obs = await js.create_object_store("files", config=ObjectStoreConfig(description="d"))
        data = bytes(range(256)) * 2000  # 512,000 bytes: four 128 KiB chunks
        out.append(("put", _info(await obs.put("big.bin", data))))
        out.append(("put small", _info(await obs.put("small", b"hello"))))
        out.append(("put empty", _info(await obs.put("empty", b""))))
        big = await obs.get("big.bin")
        out.append(("get", big.data == data, _info(big.info)))
        out.append(("get small", (await obs.get("small")).data))
        out.append(("get empty", (await obs.get("empty")).data))
        out.append(("info", _info(await obs.get_info("small"))))
        status = await obs.status()
        out.append(("status", status.bucket, status.description, status.sealed, status.size,
                    status.ttl, status.replicas))
        out.append(("list", sorted(e.name for e in await obs.list())))
        watcher = await obs.watch()
        seen = []
        while (entry := await watcher.updates(timeout=5)) is not None:
            seen.append(entry.name)
        out.append(("watch", sorted(seen)))
        await obs.put("later", b"x" * 10)
        out.append(("watch update", (await watcher.updates(timeout=5)).name))
        await obs.delete("small")
        out.append(("watch delete", _info(await watcher.updates(timeout=5))))
        await watcher.stop()
        try:
            await obs.get("small")
            out.append(("deleted get", "found"))
        except Exception as exc:  # noqa: BLE001 - the exception's type is the result
            out.append(("deleted get", type(exc).__name__))
        out.append(("deleted info", _info(await obs.get_info("small", show_deleted=True))))
        out.append(("list live", sorted(e.name for e in await obs.list(ignore_deletes=True))))
        await obs.put("big.bin", b"replaced")  # the old chunks are purged
        out.append(("replaced", (await obs.get("big.bin")).data))
        other = await js.create_object_store("other")
        await other.put("o", b"other data")
        # nats-py writes no links; the Go client's link meta, published as it does
        for lname, link in (("lnk", {"bucket": "other", "name": "o"}),
                            ("blnk", {"bucket": "other"})):
            meta = {"name": lname, "bucket": "files", "nuid": "LINK" + lname, "size": 0,
                    "chunks": 0, "digest": "", "options": {"link": link}}
            subj = "$O.files.M." + base64.urlsafe_b64encode(lname.encode()).decode()
            ack = await js.publish(subj, json.dumps(meta).encode(),
                                   headers={"Nats-Rollup": "sub"})
            out.append(("link ack", ack.stream, ack.seq))
        out.append(("get via link", (await obs.get("lnk")).data))
        out.append(("bucket link", (await obs.get_info("blnk")).options.link.bucket))
        out.append(await _meta_messages(nc, "OBJ_files", ["big.bin", "small", "lnk"]))
        info = await _api(nc, "STREAM.INFO.OBJ_files", {"subjects_filter": ">"})
        subjects = info["state"]["subjects"]  # chunk subjects end in nuids nats-py makes up
        info["state"]["subjects"] = sorted(
            (k if ".M." in k else k.rsplit(".", 1)[0], v) for k, v in subjects.items())
        out.append(info)
        await obs.seal()
        out.append(("sealed", (await obs.status()).sealed))
        try:
            await obs.put("after seal", b"no")
            out.append(("put sealed", "stored"))
        except Exception as exc:  # noqa: BLE001 - the exception's type is the result
            out.append(("put sealed", type(exc).__name__))
        out.append(("delete bucket", await js.delete_object_store("other")))
        out.append(await _api(nc, "STREAM.NAMES"))
    finally:
        await nc.close()
    return out


async def test_object_store_matches_nats_server(servers: Servers, tmp_path: Path) -> None:
    theirs = servers.nats_server(args=["-js", "-sd", str(tmp_path / "theirs")])
    ours = servers.jetraft(args=["-js", "-sd", str(tmp_path / "ours")])
    their, mine = await _script(theirs.url), await _script(ours.url)
    assert_same_steps(mine, their, ALLOWED_TO_DIFFER)
    assert their[3][1] is True and their[5] == ("get empty", b"")
    assert ("sealed", True) in their and ("put sealed", "BadRequestError") in their
