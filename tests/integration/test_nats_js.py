"""The official nats.js client runs one scripted session against nats-server
and against jetraft; both transcripts must be equal.

The npm packages are installed by `.ci/run` (`npm ci` in tests/js); without node
or them, the test is skipped with the reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

JS_DIR = Path(__file__).resolve().parent.parent / "js"
HAVE_JS = shutil.which("node") is not None and (JS_DIR / "node_modules/@nats-io").is_dir()

# CI installs the packages, so there a missing client is a failure, not a skip.
pytestmark = pytest.mark.skipif(not HAVE_JS and not os.environ.get("CI"),
                                reason="node or tests/js/node_modules missing")


def run_session(url: str) -> dict:
    done = subprocess.run(["node", "core_session.mjs", url], cwd=JS_DIR, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_nats_js_core_session_matches_nats_server(jetraft, nats_server):
    ours, theirs = run_session(jetraft.url), run_session(nats_server.url)
    assert ours == theirs
    # Pin the parts that prove the session did something, so two equal failures cannot pass.
    assert ours["reply"] == "PING"
    assert ours["queue_total"] == 50
    assert [m[0] for m in ours["gt"]] == ["js.a", "js.a.b", "js.c"]
    assert ours["gt"][1][2] == "v1"
    assert "no responders" in ours["no_responders"]
