"""`jetraft audit` as a user runs it: `spark-submit` of audit/job.py against a standalone
master and worker on loopback over damaged logs, and its HTML report in headless Chromium
(the screenshot stays in the test's tmp dir). `jetraft audit` is the same `audit.job.main`
in local mode; its exit codes 0 and 2 run in tests/audit/test_audit_encrypted.py (and here
for a bad directory), so one Spark run here shows the violation path (exit 1) and the page."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.audit.conftest import need_spark, segment
from tests.audit.faults import commit_of, entries, rewrite
from tests.ports import free_port

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), SPARK_LOCAL_IP="127.0.0.1")
    env.pop("PYSPARK_GATEWAY_PORT", None)
    return env


def _spark_bin(name: str) -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", name)


def test_bad_data_dir_is_a_usage_error(tmp_path):
    pytest.importorskip("pyspark")
    r = subprocess.run([sys.executable, "-m", "node.cli", "audit", str(tmp_path / "nope")],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "not a directory" in r.stderr


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return name
    pytest.skip("no headless Chromium (see .ci/run)")


def _check_page(page: Path, verdict: str, tmp_path: Path) -> None:
    browser = _chromium()
    base = [browser, "--headless", "--no-sandbox", "--disable-gpu",
            f"--user-data-dir={tmp_path / 'chrome'}"]
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    m = re.search(r"<div id=\"verdict\"[^>]*>([^<]*)</div>", dom)
    assert m and m.group(1).startswith(verdict), dom[:500]
    assert len(re.findall(r"<figure class=\"plot\"><img", dom)) == 4
    shot = tmp_path / "report.png"
    subprocess.run([*base, f"--screenshot={shot}", "--window-size=1200,2400", page.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.stat().st_size > 10_000  # kept: look at it with any image viewer


def _start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)  # own group: the worker's executors too


def _wait_for(log: Path, text: str, proc: subprocess.Popen, limit_s: float = 90) -> None:
    deadline = time.monotonic() + limit_s
    while text not in log.read_text(errors="replace"):
        assert proc.poll() is None, log.read_text(errors="replace")[-2000:]
        assert time.monotonic() < deadline, f"no {text!r} in {log}"
        time.sleep(0.2)


def _damage(logs: dict) -> None:
    """One committed entry's payload changed on node 3: one violation for the audit."""
    seg = segment(logs["dirs"][2])
    e = [x for x in entries(seg) if x.payload and x.index <= commit_of(seg)][5]
    rewrite(seg, e, payload=e.payload + b"!")


def test_spark_submit_reports_a_violation_and_chromium_renders_it(logs, tmp_path):
    need_spark()
    _damage(logs)
    env = _env()
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    klass = _spark_bin("spark-class")
    procs = []
    try:
        procs.append(_start([klass, "org.apache.spark.deploy.master.Master", "--host",
                             "127.0.0.1", "--port", str(port), "--webui-port",
                             str(free_port())], tmp_path / "master.log", env))
        _wait_for(tmp_path / "master.log", "I have been elected leader", procs[0])
        procs.append(_start([klass, "org.apache.spark.deploy.worker.Worker", "--host",
                             "127.0.0.1", "--port", str(free_port()), "--webui-port",
                             str(free_port()), "--cores", "1", "--memory", "1g",
                             "--work-dir", str(tmp_path / "work"), master_url],
                            tmp_path / "worker.log", env))
        _wait_for(tmp_path / "worker.log", "Successfully registered with master", procs[1])
        out = tmp_path / "report"
        r = subprocess.run([_spark_bin("spark-submit"), "--master", master_url,
                            "--conf", "spark.executor.memory=512m",
                            str(ROOT / "audit" / "job.py"), *map(str, logs["dirs"]),
                            "--out", str(out), "--acked", str(logs["acked"])],
                           env=env, capture_output=True, text=True, timeout=400)
        assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-3000:]
        assert "[audit] reading segments" in r.stdout + r.stderr  # the progress line
        assert r.stdout.splitlines()[-1].startswith("FAIL: 1 violation")  # python stderr
        # shares stdout under spark-submit: the verdict is the last line
        worker_log = (tmp_path / "worker.log").read_text(errors="replace")
        assert "Asked to launch executor" in worker_log  # the work ran on the worker
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
    _check_page(out / "report.html", "FAIL: 1 violation", tmp_path)
