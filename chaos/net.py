"""Network partitions through Linux network namespaces (root only).

Each node gets a namespace with one veth into a bridge in the root namespace, where the
clients run. Cutting node i off = setting its bridge-side veth down: every packet to and
from it is dropped (its peers, and its own clients, see silence, not resets: a real
partition). There is no nft/iptables on this machine, so the cut is all-or-nothing per
node, which is what "the leader cut off from the majority" needs. Names carry a random
tag so concurrent runs do not collide; `teardown` removes everything.
"""

from __future__ import annotations

import os
import random
import subprocess


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def available() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    tag = f"jrprobe{random.randrange(1 << 16):x}"
    try:
        _ip("netns", "add", tag)
        _ip("netns", "del", tag)
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"ip netns does not work here: {e}"
    return True, ""


class Netns:
    def __init__(self, n: int) -> None:
        self.n = n
        self.tag = f"{random.randrange(1 << 20):05x}"
        self.subnet = f"10.{random.randrange(64, 250)}.{random.randrange(1, 250)}"
        self.bridge = f"jrb{self.tag}"
        self.cut: set[int] = set()
        self._made: list[tuple[str, str]] = []

    def ns(self, i: int) -> str:
        return f"jr{self.tag}n{i}"

    def veth(self, i: int) -> str:
        return f"jrv{self.tag}{i}"  # <= 15 characters, as interface names must be

    def host(self, i: int) -> str:
        return f"{self.subnet}.{10 + i}"

    def prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(i)]

    def setup(self) -> None:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made.append(("link", self.bridge))
            _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(self.n):
                ns, veth = self.ns(i), self.veth(i)
                _ip("netns", "add", ns)
                self._made.append(("netns", ns))
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                self._made.append(("link", veth))
                _ip("link", "set", veth, "master", self.bridge)
                _ip("link", "set", veth, "up")
                _ip("-n", ns, "addr", "add", f"{self.host(i)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except Exception:
            self.teardown()
            raise

    def isolate(self, i: int) -> None:
        _ip("link", "set", self.veth(i), "down")
        self.cut.add(i)

    def heal(self, i: int | None = None) -> None:
        for j in sorted(self.cut if i is None else {i}):
            _ip("link", "set", self.veth(j), "up")
            self.cut.discard(j)

    def teardown(self) -> None:
        for kind, name in reversed(self._made):
            try:
                if kind == "netns":
                    _ip("netns", "del", name)
                else:
                    _ip("link", "del", name)
            except subprocess.SubprocessError:
                pass  # a veth goes with its namespace
        self._made.clear()
