"""The audit at the end of a chaos run: `jetraft audit` (audit/, Spark local mode) over every
node's data directory, with the PubAcks of the history as its acknowledged-writes file.

- `acked_lines(events)`: one `{"stream", "seq", "data", "retried"}` line per confirmed
  publish and per acknowledged KV CAS (audit/acked.py). `retried`: an earlier attempt
  of that payload had an unknown outcome, so the audit accepts it stored more than once
  (the checker's dedup rule decides whether that is a duplicate; the audit does not
  second-guess it).
- `run_audit(workdir, node_dirs)`: writes `<run>/acked.jsonl`, runs the audit in its own
  process (its own JVM; the run's event loop never imports Spark), the report goes to
  `<run>/audit/` (report.json, report.html). Returns the verdict, counts and the violations.
- `available()`: pyspark, matplotlib and a Java runtime installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
AUDIT_TIMEOUT_S = 1800


def available() -> tuple[bool, str]:
    for mod in ("pyspark", "matplotlib"):
        if importlib.util.find_spec(mod) is None:
            return False, f"{mod} is not installed (pip install '.[audit]')"
    if shutil.which("java") is None:
        return False, "no Java runtime (apt-get install default-jre-headless)"
    return True, ""


def acked_lines(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    unsure: set[str] = set()
    out = []
    for e in events:
        if e.get("f") == "kv-cas" and e.get("type") == "ok":
            # A KV CAS is a publish to the bucket's stream; its value is unique to the
            # attempt, so it must be stored exactly once, at its revision.
            from chaos.kv_workload import STREAM

            out.append({"stream": STREAM, "seq": e["rev"], "data": e["value"],
                        "retried": False})
            continue
        if e.get("f") != "publish":
            continue
        if e.get("type") == "info":
            unsure.add(e["payload"])
        elif e.get("type") == "ok" and e.get("seq"):
            out.append({"stream": e["stream"], "seq": e["seq"], "data": e["payload"],
                        "retried": e["payload"] in unsure})
    return out


def run_audit(workdir: Path, node_dirs: list[Path], events: Iterable[dict[str, Any]]
              ) -> dict[str, Any]:
    acked = workdir / "acked.jsonl"
    with open(acked, "w", encoding="utf-8") as f:
        for line in acked_lines(events):
            f.write(json.dumps(line) + "\n")
    out_dir = workdir / "audit"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "node.cli", "audit", *map(str, node_dirs), "--out",
           str(out_dir), "--acked", str(acked)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              timeout=AUDIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"the audit did not finish in {AUDIT_TIMEOUT_S} s",
                "command": " ".join(cmd)}
    result: dict[str, Any] = {"ok": proc.returncode == 0, "exit": proc.returncode,
                              "command": " ".join(cmd), "report": str(out_dir / "report.html")}
    try:
        report = json.loads((out_dir / "report.json").read_text())
    except (OSError, ValueError):
        result["error"] = (proc.stderr or proc.stdout)[-2000:]
        result["ok"] = False
        return result
    result["verdict"] = report["verdict"]["text"]
    result["counts"] = report["counts"]
    result["violations"] = [f for f in report["findings"] if f["severity"] == "violation"][:20]
    return result
