#!/bin/sh
# Mutation check of the cluster membership guards (docs/notes/routes.md).
# Each mutant is applied in place, the refusal test run, and the file restored.
# A mutant is KILLED when the test fails. Run from the repo root.
set -u
run() {  # file, python-expression-replacement (old|||new), test
  file=$1; old=$2; new=$3; test=$4
  cp "$file" /tmp/mutant.bak
  python - "$file" "$old" "$new" <<'PY'
import sys
p, old, new = sys.argv[1:]
s = open(p).read()
assert old in s, f"mutation anchor not found: {old!r}"
open(p, "w").write(s.replace(old, new, 1))
PY
  if PYTHONPATH=$PWD timeout 300 python -m pytest -x -q "$test" >/tmp/mutant.out 2>&1; then
    echo "SURVIVED: $file: $new  ($test)"
  else
    echo "KILLED:   $file: $new  ($test)"
  fi
  cp /tmp/mutant.bak "$file"
}
S=node/cluster/security.py
V=node/cluster/service.py
T=tests/cluster/test_security.py
run $S "        if self.auth.allows(presented):" "        if True:" "$T::test_no_credentials_cannot_join"
run $S "        return hmac.compare_digest(self.prove(nonce, addr), proof)" "        return True" "$T::test_wrong_cluster_password_cannot_join"
run $V "        if self.auth.required and not await self._acceptor_proves(addr, ctrl):" "        if False:" "$T::test_wrong_cluster_password_cannot_join"
run $S "root_certificates=_read(c.tls.ca_file), require_client_auth=True)" "root_certificates=_read(c.tls.ca_file), require_client_auth=False)" "$T::test_certificate_from_another_ca_cannot_join"
