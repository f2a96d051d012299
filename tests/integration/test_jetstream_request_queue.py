"""`jetstream { request_queue_limit }` as nats-server 2.15 answers it.

nats-server drops API requests once its queue reaches the limit (info-type requests have a
queue of their own), unanswered, and warns `JetStream API [info ]queue limit reached,
dropping N requests`; Jetraft drops a request that would bring the requests it is serving
to the limit (node/jetstream/apiqueue.py). How many get through depends on each server's
speed; the test compares that both drop (each queue), both warn, and both answer again
once the burst is over.

Mutation (docs/notes/acctlim.md): `ApiQueues.done` not called when a request is served ->
the queue never empties and the request after the burst is not answered.
"""

from __future__ import annotations

import asyncio
import json

import nats

from tests.integration.conftest import Servers

CONF = 'jetstream: { store_dir: "%s", request_queue_limit: 5 }\n'


async def _burst(nc: nats.NATS, subject: str, n: int = 200) -> tuple[int, int]:
    got = await asyncio.gather(*[nc.request(subject, b"", timeout=0.5) for _ in range(n)],
                               return_exceptions=True)
    dropped = sum(isinstance(g, Exception) for g in got)
    return n - dropped, dropped


async def test_a_full_api_queue_drops_requests_as_nats_server(servers: Servers) -> None:
    for name, start in (("nats-server", servers.nats_server), ("jetraft", servers.jetraft)):
        store = servers.workdir / name
        store.mkdir()
        proc = start(CONF % store)
        nc = await nats.connect(proc.url)
        try:
            made = await nc.request("$JS.API.STREAM.CREATE.S",
                                    json.dumps({"name": "S", "subjects": ["s"]}).encode(),
                                    timeout=5)
            assert b"error" not in made.data, (name, made.data)
            for subject in ("$JS.API.INFO", "$JS.API.STREAM.MSG.GET.S"):
                _answered, dropped = await _burst(nc, subject)
                assert dropped > 0, (name, subject)
                # one warning: both queues' share a format nats-server rate-limits
                assert "[WRN] JetStream API info queue limit reached, dropping " \
                       in proc.log_text(), name
                await asyncio.sleep(0.2)
                again = await nc.request(subject, b"", timeout=5)  # served again
                assert again.data.startswith(b"{"), (name, subject, again.data)
        finally:
            await nc.close()
        proc.stop()
