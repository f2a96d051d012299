"""Catch-up rate of a mirror and of a source, Jetraft next to nats-server in the same run:

    python benchmarks/mirror_bench.py [N]      (from the worktree root; default N = 20000)

For each server: publish N messages of 128 B to O, then create a mirror M and a source S of O
and time until each holds N messages. Prints msgs/s and the ratio to nats-server (default
sync_interval; nats-server's sourcing is not fsynced per message, Jetraft's is: one WAL fsync
and one LMDB fdatasync per SOURCE_MSGS entry of up to 512 messages).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import nats

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.ports import free_port  # noqa: E402


async def _run(url: str, n: int) -> dict[str, float]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name="O", subjects=["o.*"])
    payload = b"x" * 128
    for at in range(0, n, 500):
        await asyncio.gather(*(js.publish(f"o.{i % 8}", payload)
                               for i in range(at, min(at + 500, n))))
    out = {}
    for name, cfg in (("mirror", {"name": "M", "mirror": {"name": "O"}}),
                      ("source", {"name": "S", "subjects": ["s.>"],
                                  "sources": [{"name": "O"}]})):
        t = time.perf_counter()
        await nc.request(f"$JS.API.STREAM.CREATE.{cfg['name']}", json.dumps(cfg).encode(),
                         timeout=10)
        while True:
            info = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{cfg['name']}", b"",
                                                timeout=10)).data)
            if info["state"]["messages"] >= n:
                break
            await asyncio.sleep(0.02)
        out[name] = n / (time.perf_counter() - t)
    await nc.close()
    return out


def _serve(argv: list[str], port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            asyncio.run(_ping(port))
            return proc
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{argv[0]} did not start")


async def _ping(port: int) -> None:
    nc = await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=1,
                            allow_reconnect=False)
    await nc.request("$JS.API.INFO", b"", timeout=2)
    await nc.close()


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    results = {}
    for label in ("nats-server", "jetraft"):
        d = tempfile.mkdtemp()
        port = free_port()
        argv = (["nats-server", "-js", "-sd", d, "-a", "127.0.0.1", "-p", str(port)]
                if label == "nats-server" else
                [sys.executable, "-m", "node.cli", "serve", "-a", "127.0.0.1", "-p", str(port),
                 "-js", "-sd", d])
        proc = _serve(argv, port)
        try:
            results[label] = asyncio.run(_run(f"nats://127.0.0.1:{port}", n))
        finally:
            proc.terminate()
            proc.wait(10)
            shutil.rmtree(d, ignore_errors=True)
    for kind in ("mirror", "source"):
        ours, theirs = results["jetraft"][kind], results["nats-server"][kind]
        print(f"{kind} catch-up of {n}: jetraft {ours:,.0f} msgs/s, nats-server "
              f"{theirs:,.0f} msgs/s, ratio {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
