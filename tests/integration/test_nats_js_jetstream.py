"""The official nats.js client (@nats-io/jetstream, kv, obj 3.4.0) runs the JetStream,
Key/Value and Object Store examples of its docs against `nats-server -js` and against
`jetraft serve -js` (single node); the two transcripts must be equal, step by step.

The scripts live in tests/js (`*_examples.mjs`); each prints one JSON object mapping a step
to what the client saw, normalised by tests/js/transcript.mjs: times, server ids, nonces and
client-made names are replaced by "<volatile>" (the list is VOLATILE there). An error is
recorded as the step's result, so one difference does not hide the steps after it.

KNOWN_DIFFS holds steps where Jetraft is known to differ (none at present): each must
still differ, so a fix shows up as a failure to be cleaned up (strict xfail)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import ServerProc, Servers
from tests.integration.test_nats_js import HAVE_JS, JS_DIR, pytestmark  # noqa: F401

SCRIPTS = ["js_examples.mjs", "kv_examples.mjs", "obj_examples.mjs"]

# Steps whose expected result is an error (on both servers); every other step must succeed,
# so two servers failing the same way cannot pass.
EXPECTED_ERRORS: dict[str, set[str]] = {
    "js_examples.mjs": {
        "streams_find_missing", "streams_delete_message_again", "consumers_info_missing",
        "streams_info_missing", "js_expect_last_msgid_wrong", "js_expect_last_sequence_wrong",
        "js_expect_stream_wrong", "js_expect_last_subject_sequence_wrong",
        "js_publish_no_stream", "consumer_get_missing"},
    "kv_examples.mjs": {"create_existing_key", "update_wrong_revision", "open_destroyed"},
    "obj_examples.mjs": {"put_after_seal", "open_destroyed"},
}

# (script, step) -> why Jetraft differs. Empty: every step matches nats-server 2.15.1.
KNOWN_DIFFS: dict[tuple[str, str], str] = {}


def _run(script: str, url: str) -> dict[str, Any]:
    done = subprocess.run(["node", script, url], cwd=JS_DIR, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"{script} against {url}:\n{done.stderr}"
    return json.loads(done.stdout)


class Transcripts(dict[str, dict[str, dict[str, Any]]]):
    """script -> {"jetraft": transcript, "nats-server": transcript}, run on first use; each
    script runs once per server, on servers of its own (fresh stores, totals from zero)."""

    def __init__(self, servers: Servers, store: Path) -> None:
        super().__init__()
        self.servers, self.store = servers, store

    def __missing__(self, script: str) -> dict[str, dict[str, Any]]:
        stem = Path(script).stem
        procs: dict[str, ServerProc] = {
            "jetraft": self.servers.jetraft(args=["-js", "-sd", str(self.store / f"ours-{stem}")]),
            "nats-server": self.servers.nats_server(
                args=["-js", "-sd", str(self.store / f"theirs-{stem}")])}
        try:
            self[script] = {name: _run(script, proc.url) for name, proc in procs.items()}
        finally:
            for proc in procs.values():
                proc.stop()
        return self[script]


@pytest.fixture(scope="module")
def transcripts(module_servers: Servers, tmp_path_factory: pytest.TempPathFactory
                ) -> Transcripts:
    return Transcripts(module_servers, tmp_path_factory.mktemp("natsjs"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_nats_js_examples_match_nats_server(transcripts: Transcripts, script: str) -> None:
    ours, theirs = transcripts[script]["jetraft"], transcripts[script]["nats-server"]
    assert list(ours) == list(theirs), "the scripts ran different steps"
    failed_theirs = {k for k, v in theirs.items() if isinstance(v, dict) and "error" in v}
    assert failed_theirs == EXPECTED_ERRORS[script], "nats-server itself: unexpected outcome"
    differ = {k: {"jetraft": ours[k], "nats-server": theirs[k]} for k in theirs
              if ours[k] != theirs[k] and (script, k) not in KNOWN_DIFFS}
    assert not differ, json.dumps(differ, indent=1)[:6000]
    for (known_script, step), why in KNOWN_DIFFS.items():
        if known_script == script:
            assert ours[step] != theirs[step], f"{step} now matches: remove it ({why})"


def test_nats_js_examples_did_the_work(transcripts: Transcripts) -> None:
    """Pins on what the scripts saw, so an empty or short session cannot pass."""
    js = transcripts["js_examples.mjs"]["jetraft"]
    assert js["core_publish_100"]["messages"] == 100
    assert js["js_publish_msgid_duplicate"] == {"duplicate": True, "seq": 2, "stream": "a"}
    assert [b["processed"] for b in js["fetch_3_batches"]] == [4, 4, 4]
    assert js["nak_then_redeliver"][1]["info"]["deliveryCount"] == 2
    assert [m[0] for m in js["ordered_consume_filtered"]] == ["work.y"] * 7
    assert [m[3] for m in js["push_consumer_consume"]] == [5, 4, 3, 2, 1, 0]
    assert js["direct_get_last_for"] == [[20, "work.y"], [21, "work.x"]]
    kv = transcripts["kv_examples.mjs"]["jetraft"]
    assert [e["operation"] for e in kv["watch_all_from_start"]] == ["PUT"] * 4 + ["DEL"]
    assert kv["per_key_ttl"]["after"] is None and kv["per_key_ttl"]["before"]["value"] == "v"
    obj = transcripts["obj_examples.mjs"]["jetraft"]
    assert "".join(obj["get_chunks"]["chunks"]) == "hello world"
    assert obj["get_blob"]["length"] == 300000
    assert obj["link"]["via_link_length"] == 300000
