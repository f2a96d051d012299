"""The official nats.js client (@nats-io/jetstream, kv, obj) through a JetStream domain:
`tests/js/domain_examples.mjs` with `{ domain: "hub" }` against `nats-server` and `jetraft
serve`, both configured with `jetstream { domain: hub }`; the transcripts must be equal step by
step (transcript.mjs masks times and ids; the script copies `domain` under `named_domain` so it
is compared)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.integration.conftest import Servers
from tests.integration.test_nats_js import JS_DIR, pytestmark  # noqa: F401

CONF = 'jetstream { store_dir: "%s", domain: hub }\n'


def _run(url: str) -> dict[str, Any]:
    done = subprocess.run(["node", "domain_examples.mjs", url], cwd=JS_DIR,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_nats_js_through_a_domain_as_nats_server(servers: Servers, tmp_path: Path) -> None:
    theirs = _run(servers.nats_server(config=CONF % (tmp_path / "theirs")).url)
    ours = _run(servers.jetraft(config=CONF % (tmp_path / "ours")).url)
    assert not [k for k, v in theirs.items() if isinstance(v, dict) and "error" in v], theirs
    assert theirs["publish"][0]["named_domain"] == "hub"
    assert theirs["info_domain"] == {"named_domain": "hub"}
    assert list(ours) == list(theirs)
    differ = {k: {"jetraft": ours[k], "nats-server": theirs[k]} for k in theirs
              if ours[k] != theirs[k]}
    assert not differ, json.dumps(differ, indent=1)[:6000]
