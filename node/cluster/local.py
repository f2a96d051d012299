"""`jetraft cluster up` and `jetraft cluster status`: a cluster on loopback.

`up` starts N real node processes (`python -m node.cli serve -c <conf>`),
each with its own client, monitoring and cluster ports (free ports picked at
start), a config file and a data directory under `--dir`, every node's route
list naming all of them. It waits until each node routes to all others,
writes `<dir>/cluster.json` (what `status` reads) and prints the URLs. It
stays in the foreground until Ctrl-C (then stops the nodes) unless `--detach`.

`status` reads `<dir>/cluster.json` (or `--monitor` URLs) and asks each node's
monitoring port for /varz, /routez and, when it exists, /jsz.

The tests in tests/cluster/ start their clusters with `LocalCluster` too.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

STATE_FILE = "cluster.json"
READY_TIMEOUT = 30.0
REPO_ROOT = str(Path(__file__).resolve().parents[2])


_given: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A free port never handed out before by this process (the kernel may give
    the same ephemeral port to two bind(0) calls in a row)."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _given:
            _given.add(port)
            return port
    raise RuntimeError("no free port found")


@dataclass
class LocalNode:
    name: str
    port: int
    http_port: int
    cluster_port: int
    dir: Path
    tags: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    log_offset: int = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def route(self) -> str:
        return f"nats-route://127.0.0.1:{self.cluster_port}"

    @property
    def log_path(self) -> Path:
        return self.dir / "node.log"

    @property
    def conf_path(self) -> Path:
        return self.dir / "node.conf"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[self.log_offset:]
        except FileNotFoundError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def get(self, path: str, timeout: float = 2.0) -> Any:
        with urllib.request.urlopen(self.http + path, timeout=timeout) as r:  # noqa: S310
            return json.loads(r.read())


class LocalCluster:
    def __init__(self, directory: str | Path, n: int = 3, *, name: str = "jetraft",
                 tags: Sequence[Sequence[str]] = (), jetstream: bool = True,
                 extra_config: str = "", routes_to: str = "all",
                 cluster_extra: str = "") -> None:
        """`routes_to`: "all" (each node lists every node) or "first" (only node 1:
        the others find each other by gossip)."""
        self.dir = Path(directory)
        self.name = name
        self.jetstream = jetstream
        self.extra_config = extra_config
        self.routes_to = routes_to
        self.cluster_extra = cluster_extra  # inside cluster { } (authorization, tls)
        self.nodes = [
            LocalNode(f"n{i + 1}", free_port(), free_port(), free_port(),
                      self.dir / f"n{i + 1}", list(tags[i % len(tags)]) if tags else [])
            for i in range(n)]

    # ---- config

    def config_for(self, node: LocalNode) -> str:
        seeds = self.nodes if self.routes_to == "all" else self.nodes[:1]
        routes = ", ".join(json.dumps(s.route) for s in seeds)
        lines = [
            f"server_name: {node.name}",
            f"listen: \"127.0.0.1:{node.port}\"",
            f"http: \"127.0.0.1:{node.http_port}\"",
        ]
        if node.tags:
            lines.append("server_tags: [" + ", ".join(json.dumps(t) for t in node.tags) + "]")
        if self.jetstream:
            lines.append(f"jetstream {{ store_dir: {json.dumps(str(node.dir / 'data'))} }}")
        lines += [
            "cluster {",
            f"  name: {self.name}",
            f"  listen: \"127.0.0.1:{node.cluster_port}\"",
            f"  routes: [{routes}]",
            self.cluster_extra,
            "}",
            self.extra_config,
        ]
        return "\n".join(lines) + "\n"

    # ---- processes

    def start(self, wait: bool = True) -> LocalCluster:
        for node in self.nodes:
            self.start_node(node, wait=False)
        if wait:
            for node in self.nodes:
                self.wait_ready(node)
            self.wait_routes()
        return self

    def start_node(self, node: LocalNode, wait: bool = True, config: str | None = None) -> None:
        node.dir.mkdir(parents=True, exist_ok=True)
        node.conf_path.write_text(config if config is not None else self.config_for(node))
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        log = open(node.log_path, "ab")  # noqa: SIM115 - the child owns it
        node.log_offset = node.log_path.stat().st_size
        node.proc = subprocess.Popen(
            [sys.executable, "-m", "node.cli", "serve", "-c", str(node.conf_path)],
            stdout=log, stderr=subprocess.STDOUT, cwd=node.dir, env=env, start_new_session=True)
        log.close()
        if wait:
            self.wait_ready(node)

    def wait_ready(self, node: LocalNode, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "Server is ready" in node.log_text():
                return
            if node.proc is not None and node.proc.poll() is not None:
                raise RuntimeError(f"{node.name} exited {node.proc.returncode}:\n{node.log_text()}")
            time.sleep(0.05)
        raise TimeoutError(f"{node.name} not ready:\n{node.log_text()}")

    def wait_routes(self, nodes: Sequence[LocalNode] | None = None,
                    timeout: float = READY_TIMEOUT) -> None:
        """Until each of `nodes` (default: all alive) routes to all the others."""
        nodes = [n for n in (nodes or self.nodes) if n.alive()]
        want = {n.name for n in nodes}
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                ok = True
                for n in nodes:
                    r = n.get("/routez")
                    last = (n.name, [x["remote_name"] for x in r["routes"]])
                    if {x["remote_name"] for x in r["routes"]} | {n.name} != want:
                        ok = False
                        break
                if ok:
                    return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"routes not complete: {last}")

    def stop_node(self, node: LocalNode, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        if node.proc is None or node.proc.poll() is not None:
            return
        node.proc.send_signal(sig)
        try:
            node.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            node.proc.kill()
            node.proc.wait()

    def stop(self) -> None:
        for node in self.nodes:
            if node.alive():
                assert node.proc is not None
                node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes:
            self.stop_node(node)

    # ---- state for `status`

    def write_state(self) -> Path:
        state = {"name": self.name, "nodes": [
            {"name": n.name, "url": n.url, "monitor": n.http, "route": n.route,
             "pid": n.proc.pid if n.proc else 0, "tags": n.tags, "dir": str(n.dir)}
            for n in self.nodes]}
        path = self.dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, path)
        return path


# --------------------------------------------------------------------------
# Command line


def _parse_tags(text: str, n: int) -> list[list[str]]:
    """`az:1,az:2,az:3`: one entry per node (cycled); `+` joins tags of one node."""
    entries = [e.strip() for e in text.split(",") if e.strip()]
    return [[t for t in entries[i % len(entries)].split("+") if t] for i in range(n)] \
        if entries else []


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310
            return json.loads(r.read())
    except (OSError, urllib.error.URLError, ValueError):
        return None


def cluster_up(args: list[str], out: TextIO, err: TextIO) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="jetraft cluster up")
    p.add_argument("-n", type=int, default=3, choices=(1, 3, 5, 7))
    p.add_argument("--tags", default="", help="per-node tags: az:1,az:2,az:3 ('+' joins)")
    p.add_argument("--dir", default="jetraft-cluster")
    p.add_argument("--name", default="jetraft", help="cluster name")
    p.add_argument("--no-js", action="store_true", help="core NATS only")
    p.add_argument("--detach", action="store_true", help="leave the nodes running and exit")
    a = p.parse_args(args)
    cluster = LocalCluster(a.dir, a.n, name=a.name, tags=_parse_tags(a.tags, a.n),
                           jetstream=not a.no_js)

    stop: list[int] = []

    def interrupt(signum: int, frame: Any) -> None:
        stop.append(signum)  # a flag, not an exception: no window where it escapes

    # Also when started in the background (SIGINT ignored there) or told to stop by SIGTERM.
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        cluster.start()
    except (RuntimeError, TimeoutError) as e:
        print(f"jetraft cluster up: {e}", file=err)
        cluster.stop()
        return 1
    if stop:
        cluster.stop()
        return 1
    state = cluster.write_state()
    print(f"cluster {a.name!r}: {a.n} nodes up (state in {state})", file=out)
    for node in cluster.nodes:
        tags = f"  tags={','.join(node.tags)}" if node.tags else ""
        pid = node.proc.pid if node.proc else 0
        print(f"  {node.name}  {node.url}  monitor {node.http}  pid {pid}{tags}", file=out)
    print("servers: " + ",".join(n.url for n in cluster.nodes), file=out)
    out.flush()
    if a.detach:
        return 0
    print("Ctrl-C stops the cluster.", file=out)
    out.flush()
    while not stop and all(n.alive() for n in cluster.nodes):
        time.sleep(0.2)
    if stop:
        print("stopping the cluster", file=out)
    else:
        print("a node exited; stopping the cluster", file=err)
    cluster.stop()
    return 0


def status_rows(monitors: list[tuple[str, str]]) -> list[dict[str, str]]:
    return status_report(monitors)[0]


def status_report(monitors: list[tuple[str, str]]
                  ) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """One row per node, and one per stream Raft group (from each node's `/jsz?raft=1`)."""
    rows = []
    pages: list[tuple[str, dict[str, Any] | None]] = []
    for name, http in monitors:
        varz = _get(http + "/varz")
        if varz is None:
            rows.append({"node": name, "up": "no", "routes": "-", "url": "-", "js": "-",
                         "meta_leader": "-"})
            continue
        routez = _get(http + "/routez") or {}
        jsz = _get(http + "/jsz?raft=1")
        row = {"node": varz.get("server_name", name), "up": "yes",
               "routes": str(routez.get("num_routes", "-")),
               "url": f"{varz.get('host')}:{varz.get('port')}",
               "js": "-", "meta_leader": "-"}
        if jsz is not None:
            row["js"] = f"{jsz.get('streams', 0)} streams"
            meta = jsz.get("meta_cluster") or {}
            row["meta_leader"] = str(meta.get("leader", "-"))
        rows.append(row)
        pages.append((row["node"], jsz))
    return rows, stream_rows(pages)


def stream_rows(pages: list[tuple[str, dict[str, Any] | None]]) -> list[dict[str, str]]:
    """Each stream group's leader and, per replica, how many committed entries it has not
    applied yet (the leader's commit minus the replica's applied). Pure: takes the nodes'
    `/jsz?raft=1` pages. Peers are named through `meta_cluster` (its own `peer`, and the
    names of the others in `replicas`); an unknown peer shows as its id."""
    names: dict[str, str] = {}
    for node, page in pages:
        meta = (page or {}).get("meta_cluster") or {}
        if meta.get("peer"):
            names[str(meta["peer"])] = node
        for rep in meta.get("replicas") or []:
            names.setdefault(str(rep.get("peer", "")), str(rep.get("name", "")))

    def name_of(peer: str) -> str:
        for short, node in names.items():
            if short and peer.startswith(short):
                return node
        return peer or "-"

    groups: dict[str, dict[str, dict[str, Any]]] = {}
    for node, page in pages:
        for group, st in ((page or {}).get("raft") or {}).items():
            if group != "$js" and isinstance(st, dict):
                groups.setdefault(group, {})[node] = st
    out = []
    for group in sorted(groups):
        members = groups[group]
        leaders = [n for n, st in members.items() if st.get("state") == "leader"]
        leader = max(leaders, key=lambda n: members[n].get("term", 0)) if leaders else ""
        if not leader:  # no page from the leader: name it from what the others believe
            believed = {str(st.get("leader", "")) for st in members.values()} - {""}
            leader = name_of(believed.pop()) if len(believed) == 1 else "-"
        commit = members[leader].get("commit", 0) if leader in members else \
            max(st.get("commit", 0) for st in members.values())
        lag = ",".join(f"{n}={max(commit - st.get('applied', 0), 0)}"
                       for n, st in sorted(members.items()) if n != leader)
        parts = group.split(".")  # js.<stream>.<created>
        stream = ".".join(parts[1:-1]) if len(parts) >= 3 and parts[0] == "js" else group
        out.append({"stream": stream, "leader": leader, "lag": lag or "-", "group": group})
    return out


NODE_COLS = [("node", "NODE"), ("up", "UP"), ("url", "CLIENT URL"), ("routes", "ROUTES"),
             ("js", "JETSTREAM"), ("meta_leader", "META LEADER")]
STREAM_COLS = [("stream", "STREAM"), ("leader", "LEADER"), ("lag", "REPLICA LAG"),
               ("group", "RAFT GROUP")]


def format_table(rows: list[dict[str, str]],
                 cols: list[tuple[str, str]] = NODE_COLS) -> str:
    widths = {k: max(len(h), *(len(r[k]) for r in rows)) if rows else len(h) for k, h in cols}
    lines = ["  ".join(h.ljust(widths[k]) for k, h in cols)]
    for r in rows:
        lines.append("  ".join(r[k].ljust(widths[k]) for k, _ in cols))
    return "\n".join(line.rstrip() for line in lines)


def cluster_status(args: list[str], out: TextIO, err: TextIO) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="jetraft cluster status")
    p.add_argument("--dir", default="jetraft-cluster")
    p.add_argument("--monitor", default="", help="monitoring URLs, comma separated "
                   "(instead of --dir's cluster.json)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(args)
    if a.monitor:
        monitors = [(u, u.rstrip("/")) for u in a.monitor.split(",") if u.strip()]
    else:
        path = Path(a.dir) / STATE_FILE
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            print(f"jetraft cluster status: cannot read {path}: {e} "
                  "(start one with `jetraft cluster up`, or pass --monitor)", file=err)
            return 1
        monitors = [(n["name"], n["monitor"]) for n in state["nodes"]]
    rows, streams = status_report(monitors)
    if a.json:
        print(json.dumps({"nodes": rows, "streams": streams}, indent=2), file=out)
    else:
        print(format_table(rows), file=out)
        if streams:
            print("\n" + format_table(streams, STREAM_COLS), file=out)
    return 0 if all(r["up"] == "yes" for r in rows) else 3


def cluster_down(args: list[str], out: TextIO, err: TextIO) -> int:
    """Stop a detached cluster: SIGTERM to the pids in cluster.json."""
    import argparse

    p = argparse.ArgumentParser(prog="jetraft cluster down")
    p.add_argument("--dir", default="jetraft-cluster")
    a = p.parse_args(args)
    path = Path(a.dir) / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"jetraft cluster down: cannot read {path}: {e}", file=err)
        return 1
    for n in state["nodes"]:
        try:
            os.kill(int(n["pid"]), signal.SIGTERM)
            print(f"stopped {n['name']} (pid {n['pid']})", file=out)
        except (OSError, ValueError):
            print(f"{n['name']} (pid {n['pid']}) was not running", file=out)
    return 0


def main(args: list[str], out: TextIO, err: TextIO) -> int:
    if not args or args[0] in ("-h", "--help"):
        print("usage: jetraft cluster up [-n 3|5] [--tags az:1,az:2,...] [--dir DIR] "
              "[--no-js] [--detach]\n       jetraft cluster status [--dir DIR | --monitor URLS] "
              "[--json]\n       jetraft cluster down [--dir DIR]", file=out)
        return 0 if args else 2
    if args[0] == "up":
        return cluster_up(args[1:], out, err)
    if args[0] == "status":
        return cluster_status(args[1:], out, err)
    if args[0] == "down":
        return cluster_down(args[1:], out, err)
    print(f"jetraft cluster: unknown command {args[0]!r} (up, status)", file=err)
    return 2
