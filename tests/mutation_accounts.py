"""Mutation check for the accounts building blocks (not collected by pytest).

Each mutant disables or bends one guarded rule in a copy of the tree; the
guarding tests must then fail. Run: `nice python tests/mutation_accounts.py`
(about 25 minutes on 2 cores). Results are recorded in docs/notes/acct.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNIT = ["tests/unit/test_jwt.py", "tests/unit/test_resolver.py", "tests/unit/test_mapping.py",
        "tests/unit/test_accountconf.py"]
INTEG = {"jwt": ["tests/integration/test_jwt_diff.py"],
         "acc": ["tests/integration/test_accounts_config_diff.py"],
         "map": ["tests/integration/test_mapping_diff.py"],
         "imp": ["tests/integration/test_imports_diff.py"],
         # The wiring (branch accwire): only the node-level differential tests run,
         # so a kill shows that a test against the running node guards the check.
         "wire": ["tests/integration/test_accounts_wired.py",
                  "tests/integration/test_operator_wired.py"]}
J, A, R, M = "node/jwt.py", "node/accountconf.py", "node/resolver.py", "node/mapping.py"
C, X, U, S = "node/client.py", "node/crossaccount.py", "node/auth.py", "node/server.py"
OP = "node/operatorauth.py"
MUTANTS = [
    (J, "ts is not None and issued_at <= ts", "ts is not None and issued_at < ts", "jwt"),
    (J, "if not verify_signature(claims.issuer, prefix, signed, signature):", "if False:", "jwt"),
    (J, 'elif not verify_nonce(user.key, nonce, signature or ""):', "elif False:", "jwt"),
    (J, "if not operator.trusts(account.claims.issuer):", "if False:", "jwt"),
    (J, "if self.expires and now >= self.expires:", "if False:", "jwt"),
    (J, "if self.not_before and now < self.not_before:", "if False:", "jwt"),
    (J, "if not _in_src(user.src, client_ip):", "if False:", "jwt"),
    (J, "if not _in_times(user.times, user.times_location, now):", "if False:", "jwt"),
    (J, "connection_type not in user.allowed_connection_types", "False", "jwt"),
    (J, "if issuer != account.key and issuer not in account.signing_keys:", "if False:", "jwt"),
    (J, "if user.issuer_account and user.issuer_account != account.key:", "if False:", "jwt"),
    (J, "if issuer != account.key and not user.issuer_account:", "if False:", "jwt"),
    (J, "if any(user.claims.nats.get(k) not in", "if False and any(user.claims.nats.get(k) not in",
     "jwt"),
    (J, "if account.limits.disallow_bearer:", "if False:", "jwt"),
    (J, "if nkeys.crc16_checksum(body) != crc:", "if False:", "jwt"),
    (J, "if body[0] != prefix:", "if False:", "jwt"),
    (J, "if len(token) > max_bytes:", "if False:", "jwt"),
    (J, "if self.strict_signing_key_usage:", "if False:", "jwt"),
    (J, "            elif fail_on_bad:", "            elif False:", "jwt"),
    (J, "        if allow and not new_allow:", "        if False:", "jwt"),
    (J, "    raise AuthError(f\"user JWT generated invalid permissions: unknown macro",
     "    return \" \"  # (f\"user JWT generated invalid permissions: unknown macro", "jwt"),
    (A, "if source.stream_export_for(acc.name, si.subject) is None:", "if False:", "acc"),
    (A, "if target.service_export_for(acc.name, vi.subject) is None:", "if False:", "acc"),
    (A, "if any(_stream_cycle(accounts, added, si.account, local, {acc.name}) for local in walks):",
     "if False:", "acc"),
    (A, "if _service_cycle(added, vi.account, vi.local_subject, {acc.name}):", "if False:", "acc"),
    (A, "if any(s.account == si.account and s.subject == si.subject for s in added[acc.name]):",
     "if False:", "acc"),
    (A, "    if exact:\n", "    if False:\n", "acc"),
    (A, "                        and s.account == imp.account), None)", "), None)", "acc"),
    (A, "return accounts is None or account in accounts", "return True", "acc"),
    (A, "    return len(stoks) == len(ptoks)", "    return True", "acc"),
    (A, "            if u.name in seen:", "            if False:", "acc"),
    (A, "if source is None or source.stream_export_for(importer, subject) is None:",
     "if source is None:", "imp"),
    (A, "            if export is not None:", "            if True:", "imp"),
    (M, "fnv1a32(_b(key)) % op.number", "fnv1a32(_b(key) + b'x') % op.number", "map"),
    (M, "            roll -= d.weight", "            pass", "map"),
    (M, "        if op.fn is Fn.TAIL:", "        if False:", "map"),
    (M, "    if strict and used < pwcs:", "    if False:", "acc"),
    (M, "            if index > pwcs:", "            if False:", "acc"),
    (M, "if totals[cluster] > 100:", "if False:", "acc"),
    (M, "    if not _GO_INT.fullmatch(t):", "    if False:", "acc"),
    (R, "if claims.claims.issued_at < old.claims.issued_at:", "if False:", "jwt"),
    (R, "if cfg.trusts(claims.claims.issuer) is None:", "if False:", "jwt"),
    (R, "decode_public_key(account_key, PREFIX_ACCOUNT)  # never", "pass  # never", "jwt"),
    (R, "if expected_key is not None and claims.key != expected_key:", "if False:", "jwt"),
    (R, "    if has_accounts:", "    if False:", "jwt"),
    (R, "if claims is not None and claims.key != account_key:", "if False:", "jwt"),
    (R, "            claims.claims.check_time(now)\n", "            pass\n", "jwt"),
    # Account JWT over its imports/exports limit (test_operator_wired, branch trace).
    (R, "import_token_issues(claims) + limit_issues(claims)", "import_token_issues(claims)",
     "wire"),
    # ---- wiring: each guarded check of the node, against its node-level test
    (C, "        if not self.connected and not self._admit_before_connect():\n            return\n"
        "        if self.tracing:\n            self._trace_pub",
     "        if False:\n            return\n        if self.tracing:\n            self._trace_pub",
     "wire"),  # PUB before CONNECT
    (J, 'elif not verify_nonce(user.key, nonce, signature or ""):', "elif False:",
     "wire"),  # CONNECT without signature, replayed nonce signature
    (J, "if issuer != account.key and issuer not in account.signing_keys:", "if False:",
     "wire"),  # user JWT signed by a non-account key
    (J, "if not operator.trusts(account.claims.issuer):", "if False:", "wire",
     [(R, "if cfg.trusts(claims.claims.issuer) is None:", "if False:")]),  # other operator
    (J, "if self.expires and now >= self.expires:", "if False:", "wire"),  # expired JWT
    (J, "ts is not None and issued_at <= ts", "False", "wire"),  # revoked user
    (J, "if not verify_signature(claims.issuer, prefix, signed, signature):", "if False:",
     "wire"),  # tampered JWT
    (OP, "nonce.encode(), operator=self.cfg", "b'fixed', operator=self.cfg", "wire"),
    (C, "            self._expiry_timer = self.loop.call_later(delay, self._auth_expired)",
     "            pass", "wire"),  # expiry while connected
    (C, "            if 0 <= limit <= account.connections + account.remote_connections:",
     "            if False:", "wire"),
    (C, "        if 0 <= limit <= len(self.subs) and sid not in self.subs:", "        if False:",
     "wire"),
    (C, "        self.parser.max_payload = _tighter(self.server.options.max_payload, max_payload)",
     "        pass", "wire"),
    # fast path bypass: the PUB fast path (Account.fast_publisher) skips the router
    ("node/account.py",
     "# read per message: a reload may add or drop it\n            if router is not None:",
     "# read per message: a reload may add or drop it\n            if False:", "wire"),
    (U, "    return _Account(user.user, user.password, user.nkey, compiled, types, user.account)",
     "    return _Account(user.user, user.password, user.nkey, compiled, types)", "wire"),
    (U, "                self._by_nkey[au.nkey] = _account_user(au)", "                pass",
     "wire"),
    (U, "                self._by_name[au.user] = _account_user(au)", "                pass",
     "wire"),
    (U, 'self._no_auth = self._named_user(options.no_auth_user, "no_auth_user")',
     "self._no_auth = None", "wire"),
    (X, "        if route.singleton and consume:", "        if False:", "wire"),
    (X, "            reply = self._open_response(account, reply, service.export) if reply "
        "else None",
     "            pass", "wire"),
    (X, "        if mappings and not premapped:\n", "        if False:\n", "wire"),
    (X, "                deliveries.append((importer, delivery.subject))",
     "                pass", "wire"),
    (S, "            account.router = router if router.needs_router(account.name) else None",
     "            account.router = None", "wire"),
    (S, "conf.accounts.items():\n            self.register_account(Account(name, acc.limits, "
        "acc.mappings or None))", "conf.accounts.items():\n            self.register_account("
        "Account(name))", "wire"),
    # full resolver: claim updates reach the node; revoked users connected go
    ("node/claimsservice.py", "            server.refresh_operator_account(data[\"account\"])",
     "            pass", "wire"),
    (C, "        if not identity.recheck():", "        if False:", "wire"),
    (S, "            client.account_changed(account)", "            pass", "wire"),
]


def _mutate(target: str, old: str, new: str) -> None:
    with open(target) as f:
        text = f.read()
    assert text.count(old) == 1, (target, old)
    with open(target, "w") as f:
        f.write(text.replace(old, new))


def main(only: list[str]) -> int:
    """`only`: run just the mutants whose original text contains one of these."""
    chosen = [m for m in MUTANTS
              if not only or any(o in m[1] or o == m[3] for o in only)]
    survived = 0
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "tree")
        for path, old, new, group, *also in chosen:
            shutil.rmtree(tree, ignore_errors=True)
            shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(
                ".git", "node_modules", "__pycache__", ".hypothesis", ".pytest_cache"))
            # A check guarded twice (defence in depth) is mutated in both places.
            for p, o, n in [(path, old, new), *(also[0] if also else [])]:
                _mutate(os.path.join(tree, p), o, n)
            # The wiring group runs every test (no -x) and names all that fail.
            unit, stop = ([], []) if group == "wire" else (UNIT, ["-x"])
            cmd = [sys.executable, "-m", "pytest", "-q", *stop, "-p", "no:cacheprovider",
                   *unit, *INTEG[group]]
            proc = subprocess.run(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": tree},
                                  capture_output=True, text=True)
            killed = proc.returncode != 0
            survived += not killed
            by = ", ".join(ln.split("::", 1)[-1].split(" - ")[0] for ln in proc.stdout.splitlines()
                           if ln.startswith(("FAILED ", "ERROR ")) and "::" in ln)
            print("KILLED  " if killed else "SURVIVED", path, old[:70].strip(), "<-", by,
                  flush=True)
    print(f"killed {len(chosen) - survived} / {len(chosen)}")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
