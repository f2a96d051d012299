"""A node config rendered by the Helm chart runs as a real `jetraft serve -c` process.

Only the listen addresses, the store directory, the routes and the TLS mount paths are
pointed at loopback / tmp (tests/deploy/chart.py `loopback_config`); the Secret-backed
credentials come through the same environment variables the StatefulSet sets. A nats-py
client then uses JetStream on it. When the cluster package exists (branch `routes`),
all three rendered nodes start and route to each other.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nats
import pytest

from tests import certs
from tests.deploy.chart import loopback_config, render
from tests.ports import free_port

LAUNCH = "import sys; from node.cli import main; sys.exit(main(sys.argv[1:]))"
ENV = {"JETRAFT_USER": "alice", "JETRAFT_PASSWORD": "s3cret",
       "JETRAFT_CLUSTER_USER": "route", "JETRAFT_CLUSTER_PASSWORD": "r0ute-s3cret"}
HAS_CLUSTER = importlib.util.find_spec("node.cluster") is not None


def _start(conf: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-c", LAUNCH, "serve", "-c", str(conf)],
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **ENV}, start_new_session=True)


def _wait_ready(proc: subprocess.Popen[bytes], log: Path, timeout: float = 40) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "Server is ready" in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise AssertionError(f"node exited {proc.returncode}:\n{log.read_text()}")
        time.sleep(0.05)
    raise AssertionError(f"not ready in {timeout}s:\n{log.read_text()}")


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.mark.parametrize(("tls", "route_tls"), [(False, False), (True, False), (False, True)],
                         ids=["plain", "client-mutual-tls", "cluster-tls"])
async def test_rendered_config_serves_a_nats_client(tmp_path: Path, tls: bool,
                                                     route_tls: bool) -> None:
    if (tls or route_tls) and not certs.available():
        pytest.fail("openssl is needed for the TLS cases (.ci/run installs it)")
    if route_tls and not HAS_CLUSTER:
        pytest.skip("no node/cluster in this checkout: cluster TLS is not implemented")
    values = {"replicas": "3", "auth.enabled": "true", "auth.secretName": "jr-auth",
              "jetstream.uniqueTag": "az", "serverTags.zones": "{a,b,c}"}
    if HAS_CLUSTER:
        values |= {"cluster.auth.enabled": "true", "cluster.auth.secretName": "jr-route"}
    if tls:
        values |= {"tls.client.enabled": "true", "tls.client.secretName": "jr-tls",
                   "tls.client.mode": "mutual"}
    configs = render(values, release="jr", namespace="msg").configs()
    pods = sorted(configs)
    ports = {p: {"client": free_port(), "monitor": free_port(), "cluster": free_port()}
             for p in pods}
    tls_dir = tmp_path / "tls-secret"
    ssl_ctx = None
    if tls:
        # The Secret's layout (tls.crt, tls.key, ca.crt) in a local directory.
        pki = certs.make_pki(tmp_path / "pki")
        tls_dir.mkdir()
        for src, dst in ((pki.server_cert, "tls.crt"), (pki.server_key, "tls.key"),
                         (pki.ca, "ca.crt")):
            shutil.copy(src, tls_dir / dst)
        ssl_ctx = ssl.create_default_context(cafile=str(pki.ca))
        ssl_ctx.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    route_dir = tmp_path / "route-tls-secret"
    if route_tls:
        values |= {"tls.cluster.enabled": "true", "tls.cluster.secretName": "jr-route-tls"}
        configs = render(values, release="jr", namespace="msg").configs()
        # One certificate for every node, as a Secret shared by the pods would hold: valid
        # for the address the nodes dial (here loopback; in Kubernetes the pods' names).
        route_dir.mkdir()
        certs.make_ca(route_dir, "ca")
        certs.make_leaf(route_dir, "node", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                        "extendedKeyUsage=serverAuth,clientAuth\n")
        for src, dst in (("node.pem", "tls.crt"), ("node.key", "tls.key"), ("ca.pem", "ca.crt")):
            shutil.copy(route_dir / src, route_dir / dst)
    run = pods if HAS_CLUSTER else pods[:1]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for p in run:
            text = loopback_config(configs[p], tmp_path / p / "js", ports, p)
            text = text.replace("/etc/jetraft/tls/client", str(tls_dir))
            text = text.replace("/etc/jetraft/tls/cluster", str(route_dir))
            conf = tmp_path / f"{p}.conf"
            conf.write_text(text)
            procs.append(_start(conf, tmp_path / f"{p}.log"))
        for p, proc in zip(run, procs, strict=True):
            _wait_ready(proc, tmp_path / f"{p}.log")
        # The readiness probe: a clustered node says 503 until JetStream's meta group
        # has a leader and it caught up; Kubernetes sends clients only after that.
        await _ready(ports, run)
        first = ports[pods[0]]
        scheme = "tls" if tls else "nats"
        url = f"{scheme}://127.0.0.1:{first['client']}"
        nc = await nats.connect(url, user="alice", password="s3cret", tls=ssl_ctx,
                                connect_timeout=5, allow_reconnect=False)
        try:
            assert nc.connected_server_version is not None
            assert nc._server_info["server_name"] == pods[0]
            js = nc.jetstream()
            await js.add_stream(name="HELM", subjects=["helm.>"])
            acks = [await js.publish("helm.x", f"m{i}".encode()) for i in range(5)]
            assert [a.seq for a in acks] == [1, 2, 3, 4, 5]
            msg = await js.get_msg("HELM", 3)
            assert msg.data == b"m2"
        finally:
            await nc.close()
        if HAS_CLUSTER:
            await _routes_up(ports, pods)
            for p in run:
                log = (tmp_path / f"{p}.log").read_text()
                want = "(tls, peer id" if route_tls else "(nats-route, peer id"
                assert want in log, log
            await _core_across_nodes(pods, ports, scheme, ssl_ctx)
        # The Secret's credentials are required: no password, no connection.
        with pytest.raises(Exception):  # noqa: B017 - nats-py raises several kinds
            bad = await nats.connect(url, tls=ssl_ctx, connect_timeout=3,
                                     allow_reconnect=False, max_reconnect_attempts=0)
            await bad.close()
        # The probes' endpoints.
        for path in ("/healthz", "/healthz?js-enabled-only=true"):
            body = await asyncio.to_thread(_get, f"http://127.0.0.1:{first['monitor']}{path}")
            assert json.loads(body) == {"status": "ok"}
    finally:
        _stop(procs)
    for proc in procs:
        assert proc.returncode == 0, "a rendered node did not stop cleanly on SIGTERM"


async def _ready(ports: dict[str, dict[str, int]], pods: list[str]) -> None:
    deadline = time.monotonic() + 60
    for p in pods:
        while True:
            try:
                await asyncio.to_thread(_get, f"http://127.0.0.1:{ports[p]['monitor']}/healthz")
                break
            except OSError:  # urllib's HTTPError (503) is one
                assert time.monotonic() < deadline, f"{p} never became ready"
                await asyncio.sleep(0.3)


async def _routes_up(ports: dict[str, dict[str, int]], pods: list[str]) -> None:
    """Every rendered node routes to the two others (authenticated by the Secret's route
    user), as /routez shows."""
    deadline = time.monotonic() + 30
    while True:
        counts = []
        for p in pods:
            body = await asyncio.to_thread(_get, f"http://127.0.0.1:{ports[p]['monitor']}/routez")
            counts.append(json.loads(body)["num_routes"])
        if counts == [len(pods) - 1] * len(pods):
            return
        assert time.monotonic() < deadline, f"routes per node: {counts}"
        await asyncio.sleep(0.3)


async def _core_across_nodes(pods: list[str], ports: dict[str, dict[str, int]], scheme: str,
                             ssl_ctx: ssl.SSLContext | None) -> None:
    async def conn(p: str) -> nats.NATS:
        return await nats.connect(f"{scheme}://127.0.0.1:{ports[p]['client']}", user="alice",
                                  password="s3cret", tls=ssl_ctx, allow_reconnect=False)

    sub_nc, pub_nc = await conn(pods[2]), await conn(pods[0])
    try:
        sub = await sub_nc.subscribe("across")
        await sub_nc.flush()
        deadline = time.monotonic() + 10
        while True:  # interest reaches node 0 a moment after the SUB
            await pub_nc.publish("across", b"hello")
            try:
                msg = await sub.next_msg(timeout=0.5)
                break
            except nats.errors.TimeoutError:
                assert time.monotonic() < deadline, "no message across the rendered routes"
        assert msg.data == b"hello"
    finally:
        await sub_nc.close()
        await pub_nc.close()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()
