"""Helpers for the clustered JetStream tests: clusters of real node processes with JetStream
options, readiness, and raw $JS.API requests."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.error
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nats
import pytest

from node.cluster.local import LocalCluster, LocalNode
from tests.ports import free_port, wait_listening


class JsCluster(LocalCluster):
    """A LocalCluster whose `jetstream {}` block can carry `unique_tag` and `domain`."""

    def __init__(self, directory: str | Path, n: int = 3, *, unique_tag: str = "",
                 tags: Sequence[Sequence[str]] = (), name: str = "C1", domain: str = "",
                 js_extra: str = "") -> None:
        super().__init__(directory, n, name=name, tags=tags)
        self.unique_tag = unique_tag
        self.domain = domain
        self.js_extra = js_extra  # more of the `jetstream {}` block, e.g. ", limits {...}"

    def config_for(self, node: LocalNode) -> str:
        conf = super().config_for(node)
        extra = "".join(f", {k}: {json.dumps(v)}" for k, v in
                        (("unique_tag", self.unique_tag), ("domain", self.domain)) if v)
        extra += self.js_extra
        if extra:
            store = json.dumps(str(node.dir / "data"))
            conf = conf.replace(f"jetstream {{ store_dir: {store} }}",
                                f"jetstream {{ store_dir: {store}{extra} }}")
        return conf

    @contextmanager
    def running(self) -> Iterator[JsCluster]:
        """Started, JetStream caught up on every node; stopped on the way out."""
        try:
            self.start()
            self.wait_js()
            yield self
        finally:
            self.stop()

    def wait_js(self, nodes: Sequence[LocalNode] | None = None, timeout: float = 40.0) -> None:
        """Until /healthz says every node caught up with the meta group (and its groups)."""
        deadline = time.monotonic() + timeout
        for node in nodes or [n for n in self.nodes if n.alive()]:
            while True:
                try:
                    if node.get("/healthz").get("status") == "ok":
                        break
                except (OSError, urllib.error.URLError, ValueError):
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{node.name} not healthy:\n{node.log_text()[-3000:]}")
                time.sleep(0.1)


async def connect(node: LocalNode, **kw: Any) -> nats.NATS:
    return await nats.connect(node.url, allow_reconnect=False, connect_timeout=5, **kw)


async def api(nc: nats.NATS, subject: str, body: Any = None, timeout: float = 10.0
              ) -> dict[str, Any]:
    data = b"" if body is None else json.dumps(body).encode()
    msg = await nc.request("$JS.API." + subject, data, timeout=timeout)
    return json.loads(msg.data)


async def first_create(nc: nats.NATS, subject: str, body: Any, within: float = 30.0,
                       prefix: str = "$JS.API.") -> dict[str, Any]:
    """A stream create's reply, asked again until the cluster has its meta leader (no
    responders, a timeout or an error while it forms)."""
    deadline = time.monotonic() + within
    while True:
        try:
            msg = await nc.request(prefix + subject, json.dumps(body).encode(), timeout=3)
            reply: dict[str, Any] = json.loads(msg.data)
            if "error" not in reply:
                return reply
        except Exception:  # noqa: BLE001 (no responders / timeout while forming)
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("no JetStream")
        await asyncio.sleep(0.5)


async def until(pred: Any, timeout: float = 15.0, every: float = 0.1) -> Any:
    """Await `pred()` (sync or async) until truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(every)


def errors_in_logs(cluster: LocalCluster) -> list[str]:
    bad = []
    for n in cluster.nodes:
        for line in n.log_text().splitlines():
            if "[ERR]" in line or "[FTL]" in line or "Traceback" in line:
                bad.append(f"{n.name}: {line}")
    return bad


@contextmanager
def nats_server_cluster3(tmp_path: Path, jetstream_extra: str = "") -> Iterator[list[str]]:
    """A 3-node nats-server cluster with JetStream on loopback (the oracle for cluster
    differential tests), listening when this yields its client URLs."""
    if shutil.which("nats-server") is None:
        pytest.skip("nats-server not installed")
    ports = [free_port() for _ in range(3)]
    cports = [free_port() for _ in range(3)]
    routes = ",".join(f"nats-route://127.0.0.1:{p}" for p in cports)
    procs = []
    try:
        for i in range(3):
            conf = tmp_path / f"n{i}.conf"
            conf.write_text(
                f"server_name: n{i + 1}\nlisten: 127.0.0.1:{ports[i]}\n"
                f"jetstream {{ store_dir: \"{tmp_path}/d{i}\"{jetstream_extra} }}\n"
                f"cluster {{ name: C1, listen: 127.0.0.1:{cports[i]}, routes: [{routes}] }}\n")
            procs.append(subprocess.Popen(["nats-server", "-c", str(conf)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for port in ports:
            wait_listening(port)
        yield [f"nats://127.0.0.1:{p}" for p in ports]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
