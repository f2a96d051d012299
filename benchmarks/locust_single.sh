#!/usr/bin/env bash
# Run benchmarks/locustfile.py headless against ONE jetraft node (pinned to CPU 1, its own
# free port and store, stopped afterwards). Writes benchmarks/results/locust-<TAG>.md.
#   benchmarks/locust_single.sh [TAG]     knobs: USERS (20) SECONDS_ (30) plus the
#   locustfile's own (JS_STREAM, MSG_SIZE, FETCH_BATCH, ...)
set -euo pipefail
TAG=${1:-$(date +%Y%m%d-%H%M%S)}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$HERE/results/locust-$TAG"
USERS=${USERS:-20}
SECS=${SECONDS_:-30}
PYTHONPATH="$HERE/.." python - "$HERE" "$OUT" "$USERS" "$SECS" <<'PY'
import os, subprocess, sys
here, out, users, secs = sys.argv[1:]
sys.path.insert(0, here)
from jsbench_servers import Servers
with Servers(("jetraft",)) as s:
    url = s.by_label["jetraft"].url
    env = {**os.environ, "NATS_URLS": url}
    subprocess.run(["taskset", "-c", "0", "locust", "-f", os.path.join(here, "locustfile.py"),
                    "--headless", "-u", users, "-r", users, "-t", f"{secs}s",
                    "--csv", out, "--only-summary"], env=env, check=False)
rows = open(out + "_stats.csv").read().splitlines()
with open(out + ".md", "w") as f:
    f.write(f"# locust against one jetraft node ({users} users, {secs} s)\n\n")
    head = rows[0].split(",")
    keep = [head.index(k) for k in ("Type", "Name", "Request Count", "Failure Count",
            "Median Response Time", "95%", "99%", "Requests/s", "Average Content Size")]
    f.write("| " + " | ".join(head[i] for i in keep) + " |\n")
    f.write("|" + "---|" * len(keep) + "\n")
    for r in rows[1:]:
        c = r.split(",")
        f.write("| " + " | ".join(c[i] for i in keep) + " |\n")
for suffix in ("_stats.csv", "_stats_history.csv", "_failures.csv", "_exceptions.csv"):
    if os.path.exists(out + suffix):
        os.unlink(out + suffix)
print(open(out + ".md").read())
PY
