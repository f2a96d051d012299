"""The audit on a store encrypted at rest (`jetstream { key, cipher }`): a real `jetraft serve`
run with a key (two streams, publishes with headers and msg ids, a pull consumer that acks),
stopped, then audited in Spark local mode with the key.

- With the key: zero findings, and the stream groups and the meta group were replayed
  (their sealed LMDB values opened, the subject/msg-id index tokens rebuilt).
- A message altered in one node's LMDB and sealed again with the store's own key (so its
  AEAD tag and its record CRC are both valid): only the replay comparison can catch it,
  and it does (store_mismatch naming that node, the group, the sequence and the field).
- A WAL entry whose sealed payload is changed and whose record CRC is fixed: a
  corrupt_record violation (the payload does not decrypt), never read as data.
- The CLI: `--config node.conf` exits 0; a wrong key, another cipher or no key at all
  exits 2 with a clear message and writes no report.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("cryptography")

from audit import model  # noqa: E402
from audit.job import run  # noqa: E402
from audit.jsstore import NodeStore, find_lmdb, prefix  # noqa: E402
from audit.keyring import Keyring  # noqa: E402
from audit.layout import LayoutError  # noqa: E402
from audit.report import build  # noqa: E402
from node.jetstream import crypt  # noqa: E402

pytestmark = pytest.mark.timeout(600)
KEY = "audit-key-5b1e0c2d9a8f7e6d5c4b3a29"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def enc_logs(tmp_path_factory) -> Path:
    from tests.audit.jslogs import make_js_logs

    root = tmp_path_factory.mktemp("audit-enc")
    store = asyncio.run(make_js_logs(root, key=KEY, cipher="aes"))["dirs"][0]
    assert (store / crypt.KEY_FILE).exists()
    return store


def _violations(report: dict) -> list[tuple]:
    return sorted((f["kind"], f.get("node"), f.get("group"), f["detail"])
                  for f in report["findings"] if f["severity"] == model.VIOLATION)


def _groups(node_dir: Path, keyring: Keyring) -> tuple[dict[str, str], int]:
    """Stream name -> group from the (sealed) catalogue, and ORDERS' applied index."""
    store = NodeStore(find_lmdb(str(node_dir)), crypt.open_readonly(str(node_dir), KEY))
    try:
        groups = {name: e["group"] for name, e in store.catalogue().items()}
        return groups, store.applied(groups["ORDERS"])
    finally:
        store.close()


def _reseal_message(node_dir: Path, group: str, seq: int) -> None:
    """Change one stored message's data, same length, and seal it again under the store's
    own LMDB key (a fresh nonce epoch the node never used): tag and CRC both valid."""
    import lmdb

    from node.jetstream.store.base import decode_record, encode_record

    own = crypt.open_readonly(str(node_dir), KEY)
    sealer = crypt.StoreCrypt(own.root, own.cipher, own.salt, 0xFFFFFFF0, own.shared).lmdb
    key = prefix(group) + seq.to_bytes(8, "big")
    aad = b"js_msgs\x00" + key
    env = lmdb.open(str(node_dir / "lmdb"), max_dbs=16)
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(b"js_msgs", txn=txn, create=False)
            msg = decode_record("x", seq, sealer.open(bytes(txn.get(key, db=db)), aad))
            altered = msg._replace(data=msg.data.swapcase())
            assert altered.data != msg.data
            txn.put(key, sealer.seal(encode_record(altered), aad), db=db)
    finally:
        env.close()


def test_encrypted_store_audits_clean_with_its_key(spark, enc_logs, tmp_path):
    n1, n2 = tmp_path / "n1", tmp_path / "n2"
    shutil.copytree(enc_logs, n1)
    shutil.copytree(enc_logs, n2)
    keyring = Keyring(KEY)
    report = build(run(spark, [str(n1), str(n2)], keyring=keyring))
    assert report["findings"] == [], report["findings"]
    groups, _ = _groups(n1, keyring)
    assert set(groups) == {"ORDERS", "EVENTS"}
    assert {"$js", groups["ORDERS"], groups["EVENTS"]} <= set(report["stats"]["replayed_groups"])
    assert report["stats"]["encrypted_nodes"] == ["n1", "n2"]


def test_a_resealed_altered_message_and_an_undecryptable_entry_are_found(spark, enc_logs,
                                                                       tmp_path):
    from tests.audit.faults import entries, rewrite

    ok, altered, torn = tmp_path / "ok", tmp_path / "altered", tmp_path / "sealbad"
    for d in (ok, altered, torn):
        shutil.copytree(enc_logs, d)
    groups, applied = _groups(ok, Keyring(KEY))
    _reseal_message(altered, groups["ORDERS"], 7)
    # One ORDERS entry in the WAL: a payload byte flipped, the record CRC fixed.
    seg = sorted((torn / "raft" / "wal").glob("wal-*.log"))[0]
    victim = entries(seg, groups["ORDERS"])[3]
    flipped = bytearray(victim.payload)
    flipped[-1] ^= 1
    rewrite(seg, victim, payload=bytes(flipped))

    report = build(run(spark, [str(ok), str(altered), str(torn)], keyring=Keyring(KEY)))
    found = _violations(report)
    assert (model.STORE_MISMATCH, "altered", groups["ORDERS"],
            "message seq 7 differs from the replay (data)") in found, found
    assert not any(f[1] == "ok" for f in found), found
    bad = [f for f in found if f[0] == model.CORRUPT_RECORD]
    assert len(bad) == 1 and bad[0][1] == "sealbad" and "does not decrypt" in bad[0][3], found
    assert not report["verdict"]["ok"]
    assert applied > 0


def test_a_wrong_key_or_cipher_is_refused_before_anything_is_read(enc_logs, tmp_path):
    for keyring, what in ((Keyring("not-the-key"), "wrong key"),
                          (Keyring(KEY, "chacha"), "cipher 'aes'")):
        with pytest.raises(LayoutError) as exc:
            run(None, [str(enc_logs)], keyring=keyring)
        assert what in str(exc.value) and "refusing" in str(exc.value)
    with pytest.raises(LayoutError, match="encrypted at rest.*--key-file"):
        run(None, [str(enc_logs)])


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "node.cli", "audit", *args],
                          capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)


def test_cli_takes_the_key_from_the_node_config_or_a_key_file(enc_logs, tmp_path):
    conf = tmp_path / "node.conf"
    conf.write_text(f'jetstream {{ store_dir: "{enc_logs}", key: "{KEY}", cipher: aes }}\n')
    wrong = tmp_path / "wrong.key"
    wrong.write_text("not-the-key\n")
    for args, needle in (([], "give its key with --key-file"),
                         (["--key-file", str(wrong)], "wrong key"),
                         (["--config", str(conf), "--cipher", "chacha"], "cipher 'aes'")):
        out = tmp_path / "refused"
        proc = _cli(str(enc_logs), "--out", str(out), *args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert needle in proc.stderr and "refusing" in proc.stderr, proc.stderr
        assert not out.exists()
    proc = _cli(str(enc_logs), "--out", str(tmp_path / "report"), "--config", str(conf),
                "--master", "local[1]")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "report" / "report.json").exists()


NEW = "audit-rotated-key-6c0f2e9b8d7a1534"


def test_a_rotated_store_audits_clean_with_the_new_key(spark, enc_logs, tmp_path):
    """Key rotation (jetstream.prev_key) re-wraps only the key file: the audit reads a rotated
    store with the new key, and one not restarted since the key changed with the config's
    prev_key, in one run (their index tokens are the same: the stores' shared secret)."""
    from audit.keyring import load_key

    rotated, pending = tmp_path / "rotated", tmp_path / "pending"
    shutil.copytree(enc_logs, rotated)
    shutil.copytree(enc_logs, pending)
    # What the node does at a start with `key: NEW, prev_key: KEY`.
    assert crypt.open_store(str(rotated), NEW, "aes", prev_key=KEY).rotated
    with pytest.raises(LayoutError, match="wrong key"):
        run(None, [str(rotated)], keyring=Keyring(KEY))
    with pytest.raises(LayoutError, match="wrong key"):
        run(None, [str(pending)], keyring=Keyring(NEW))
    conf = tmp_path / "node.conf"
    conf.write_text(f'jetstream {{ key: "{NEW}", prev_key: "{KEY}", cipher: aes }}\n')
    key, cipher, prev = load_key(None, str(conf), None)
    assert (key, cipher, prev) == (NEW, "aes", KEY)
    report = build(run(spark, [str(rotated), str(pending)],
                       keyring=Keyring(key, cipher, prev_key=prev)))
    assert report["findings"] == [], report["findings"]
    assert report["stats"]["encrypted_nodes"] == ["pending", "rotated"]
