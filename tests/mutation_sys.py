"""Mutation check for the system account and config reload (not collected by pytest).

Each mutant bends one guarded rule in a copy of the tree; the guarding
differential tests must then fail. Run: `nice python tests/mutation_sys.py`
(about 8 minutes on 2 cores). Results are recorded in docs/notes/sys.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = {"sys": ["tests/integration/test_sysaccount_diff.py"],
         "reload": ["tests/integration/test_reload_diff.py"],
         "claims": ["tests/integration/test_claims_limit_diff.py"],
         "act": ["tests/integration/test_activation_diff.py"],
         "chain": ["tests/unit/test_chained_imports.py",
                   "tests/integration/test_chained_imports_diff.py",
                   "tests/integration/test_accounts_wired.py"]}
AC = "node/activation.py"
SA, RL, CL, SV = "node/sysaccount.py", "node/reload.py", "node/client.py", "node/server.py"
RS, CX = "node/resolver.py", "node/crossaccount.py"
MUTANTS = [
    # The system client lives in another account: its events reach that account's users.
    (SA, 'self.client = server.internal_client(Kind.SYSTEM, "_system", system_account)',
     'self.client = server.internal_client(Kind.SYSTEM, "_system", "A" if "A" in '
     'server.accounts else system_account)', "sys"),
    # An account's own CONNZ / STATZ shows every account.
    (SA, "self.service.serve_account_kind(kind, self.account, reply, opts, self.client)",
     "self.service.serve_account_kind(kind, None, reply, opts, self.client)", "sys"),
    # The disconnect event of a failed login is not an AUTH.ERR.
    (SV, "auth_failed = not client.connected and reason == AUTH_VIOLATION",
     "auth_failed = False", "sys"),
    # A PING filtered to another cluster is answered anyway.
    (SA, "if ping and not self._selected(opts):", "if False:", "sys"),
    # Reload: connected clients are not checked against the new config.
    (RL, "if plan.auth and new.operator is None:\n                self._recheck",
     "if False:\n                self._recheck", "reload"),
    # Reload: a removed user stays connected (both guards bent).
    (RL, "if user is not None and auth.user_account(user) != client.account.name:",
     "if False:", "reload",
     [(CL, "close=True)\n            return\n        if identity.account != self.account.name:",
       "close=False)\n            return\n        if identity.account != self.account.name:")]),
    # Reload: subscriptions the new permissions deny are kept.
    (CL, "            if not perms.can_subscribe(sub.subject, sub.queue):",
     "            if False:", "reload"),
    # Reload: the new authenticator is not installed.
    (RL, "        server.auth = auth\n", "        pass\n", "reload"),
    # Reload: security settings Jetraft cannot enforce are accepted.
    (RL, "    if new.unenforced:", "    if False:", "reload"),
    # Reload: a config that fails validation is applied anyway.
    (RL, "        validate_options(new)\n", "        pass\n", "reload"),
    # Reload: options nats-server cannot change are changed.
    (RL, "        if before != after:\n            raise ReloadError",
     "        if False:\n            raise ReloadError", "reload"),
    # Operator mode: a lowered account connection limit leaves the extra connections.
    (SV, "            client.over_account_limit()", "            pass", "claims"),
    # ... or closes the oldest instead of the newest.
    (SV, "key=lambda c: (c.start, c.cid), reverse=True)", "key=lambda c: (c.start, c.cid))",
     "claims"),
    # Activation tokens: a token signed by a key the exporter never listed is honoured.
    (AC, "        if claims.issuer not in exporter.signing_keys or issuer_account != exporter.key:",
     "        if False:", "act"),
    # ... an expired token is honoured.
    (AC, "        claims.check_time(now)\n", "\n", "act"),
    # ... a token made out to another account is honoured (both guards bent).
    (AC, "    if claims.kind != \"activation\" or claims.subject != importer:",
     "    if claims.kind != \"activation\":", "act",
     [(AC, "        if act.subject != claims.key:", "        if False:")]),
    # ... an account whose tokens fail nats-server's validation is loaded anyway.
    (RS, "    if issues:\n        raise JWTError", "    if False:\n        raise JWTError", "act"),
    # ... a token for a public export makes it private to the token holder (both guards).
    (AC, "if e.accounts == frozenset() and _covers(e.subject, subject)",
     "if _covers(e.subject, subject)", "act",
     [(AC, "    if find(importer, subject) is not None:\n        return",
       "    if False:\n        return")]),
    # Chained service imports: the request stops at the first exporter.
    (CX, "            account = target\n", "            break\n", "chain"),
    # ... or may come back into an account it already passed.
    (CX, "if service is None or service.account in seen:", "if service is None:", "chain"),
]


def _mutate(target: str, old: str, new: str) -> None:
    with open(target) as f:
        text = f.read()
    assert text.count(old) == 1, (target, old)
    with open(target, "w") as f:
        f.write(text.replace(old, new))


def main(only: list[str]) -> int:
    """`only`: run just the mutants of these groups (sys, reload)."""
    chosen = [m for m in MUTANTS if not only or m[3] in only]
    survived = 0
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "tree")
        for path, old, new, group, *also in chosen:
            shutil.rmtree(tree, ignore_errors=True)
            shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(
                ".git", "node_modules", "__pycache__", ".hypothesis", ".pytest_cache"))
            for p, o, n in [(path, old, new), *(also[0] if also else [])]:
                _mutate(os.path.join(tree, p), o, n)
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS[group]]
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
