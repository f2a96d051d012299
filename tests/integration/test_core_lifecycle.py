"""Process lifecycle and connection health: signals, lame duck, ports and
pid files, fatal start errors, reconnects, slow consumers, stale clients."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import time
import urllib.request

import nats
import pytest


def varz(proc) -> dict:
    with urllib.request.urlopen(proc.http + "/varz", timeout=10) as r:
        return json.loads(r.read())


def test_log_format_and_sigterm_exit(servers, tmp_path):
    pid_file = tmp_path / "j.pid"
    proc = servers.jetraft(args=["-P", str(pid_file), "--ports_file_dir", str(tmp_path)])
    log = proc.log_text()
    line = re.compile(r"^\[\d+\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} \[INF\] ", re.M)
    assert line.search(log)
    assert f"Listening for client connections on 127.0.0.1:{proc.port}" in log
    assert int(pid_file.read_text()) == proc.proc.pid
    ports = list(tmp_path.glob(f"*_{proc.proc.pid}.ports"))
    assert len(ports) == 1
    assert json.loads(ports[0].read_text())["nats"] == [proc.url]
    assert proc.stop(signal.SIGTERM) == 0
    assert not ports[0].exists()  # removed at exit, like nats-server
    assert "Server Exiting.." in proc.log_text()


def test_port_in_use_is_fatal(servers):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = servers.jetraft_argv(port)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "[FTL]" in done.stderr + done.stdout


def test_unsupported_config_block_warns(servers):
    proc = servers.jetraft(config="leafnodes {\n  port: 7422\n}\n")
    assert re.search(r"\[WRN\] .*leafnodes", proc.log_text())


def test_jetstream_is_advertised_only_with_js(servers, tmp_path, raw):
    # INFO invites clients to use JetStream only when the $JS.API answers (-js).
    plain = servers.jetraft()
    info = raw(plain.port).info
    assert info["server_name"] and "jetstream" not in info and "api_lvl" not in info
    proc = servers.jetraft(args=["-js", "-sd", str(tmp_path / "js")])
    assert re.search(r"\[INF\] JetStream started", proc.log_text())
    info = raw(proc.port).info
    assert info["jetstream"] is True and info["api_lvl"] == 5


async def test_reconnect_after_restart_on_same_port(servers):
    first = servers.jetraft()
    reconnected = asyncio.Event()

    async def on_reconnect():
        reconnected.set()

    nc = await nats.connect(first.url, reconnect_time_wait=0.2, max_reconnect_attempts=-1,
                            reconnected_cb=on_reconnect)
    sub = await nc.subscribe("again")
    await nc.flush()
    assert first.stop() == 0
    servers.jetraft(port=first.port)
    await asyncio.wait_for(reconnected.wait(), 30)
    await nc.publish("again", b"after-restart")
    await nc.flush()
    assert (await sub.next_msg(timeout=10)).data == b"after-restart"
    await nc.close()


async def test_lame_duck_mode(servers):
    proc = servers.jetraft(options={"lame_duck_duration": 2.0, "lame_duck_grace_period": 0.5})
    told = asyncio.Event()

    async def ldm():
        told.set()

    clients = [await nats.connect(proc.url, allow_reconnect=False, lame_duck_mode_cb=ldm)
               for _ in range(3)]
    # The operator's way in: `jetraft signal ldm` sends SIGUSR2 to the node.
    done = subprocess.run(["jetraft", "signal", "ldm", "--pid", str(proc.proc.pid)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    await asyncio.wait_for(told.wait(), 10)
    proc.wait_for_log("Entering lame duck mode, stop accepting new clients", 10)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proc.port), timeout=2).close()
    for _ in range(200):
        if all(c.is_closed for c in clients):
            break
        await asyncio.sleep(0.05)
    assert all(c.is_closed for c in clients)
    assert await asyncio.to_thread(proc.wait, 20) == 0
    assert "Closing existing clients" in proc.log_text()


def test_max_connections_matches_nats_server(servers, raw):
    conf = "max_connections: 1\n"
    for proc in servers.both(conf).values():
        first = raw(proc.port)
        first.exchange(b'CONNECT {"verbose":false}\r\n')
        second = raw(proc.port)
        assert second.read_to_close() == b"-ERR 'maximum connections exceeded'\r\n", proc.name


def test_stale_connection_matches_nats_server(servers, raw):
    conf = 'ping_interval: "300ms"\nping_max: 2\n'
    outs = {}
    for name, proc in servers.both(conf).items():
        c = raw(proc.port)
        c.send(b'CONNECT {"verbose":false}\r\n')
        outs[name] = c.read_to_close(timeout=20)
    assert outs["jetraft"] == outs["nats-server"] == \
        b"PING\r\nPING\r\n-ERR 'Stale Connection'\r\n"


async def test_slow_consumer_is_cut_off_others_unaffected(servers):
    proc = servers.jetraft(config="max_payload: 65536\nmax_pending: 1048576\n")
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(("127.0.0.1", proc.port))
    slow.sendall(b'CONNECT {"verbose":false}\r\nSUB firehose 1\r\nPING\r\n')
    fast = await nats.connect(proc.url, allow_reconnect=False)
    got = []
    done = asyncio.Event()
    n, size = 4000, 4096

    async def on_msg(msg):
        got.append(msg.data)
        if len(got) == n:
            done.set()

    await fast.subscribe("firehose", cb=on_msg, pending_msgs_limit=n * 2,
                         pending_bytes_limit=1 << 30)
    await fast.flush()
    pub = await nats.connect(proc.url, allow_reconnect=False)
    await asyncio.sleep(0.2)  # the slow SUB is in place (its PING was answered)
    for i in range(n):
        await pub.publish("firehose", i.to_bytes(4, "big") * (size // 4))
        if i % 64 == 63:
            await pub.flush()  # paced, so the reading subscriber keeps up
    await asyncio.wait_for(done.wait(), 60)
    assert [int.from_bytes(d[:4], "big") for d in got] == list(range(n))
    assert varz(proc)["slow_consumers"] >= 1
    assert "Slow Consumer Detected" in proc.log_text()
    slow.settimeout(10)
    closed = False
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if not slow.recv(1 << 20):
                closed = True
                break
    except ConnectionError:
        closed = True
    assert closed
    slow.close()
    await pub.close()
    await fast.close()


async def test_write_deadline_cuts_off_a_stuck_reader(servers):
    # max_pending is far away: only the write deadline can end this client.
    proc = servers.jetraft(config="write_deadline: \"1s\"\nmax_pending: 1GB\n")
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect(("127.0.0.1", proc.port))
    stuck.sendall(b'CONNECT {"verbose":false}\r\nSUB stuck 1\r\nPING\r\n')
    pub = await nats.connect(proc.url, allow_reconnect=False)
    await asyncio.sleep(0.2)
    chunk = b"x" * 65536
    deadline = time.monotonic() + 30
    while "WriteDeadline of 1s Exceeded" not in proc.log_text():
        assert time.monotonic() < deadline, "the stuck reader was never cut off"
        for _ in range(16):
            await pub.publish("stuck", chunk)
        await pub.flush()
        await asyncio.sleep(0.05)
    assert varz(proc)["slow_consumers"] >= 1
    assert pub.is_connected  # the publisher is not the one cut off
    await pub.close()
    stuck.close()
