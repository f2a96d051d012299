#!/usr/bin/env bash
# Run benchmarks/locustfile.py headless against a local 3-node jetraft cluster (an R3
# stream, user i connected to node i mod 3, so publishes and pulls also go through
# non-leaders), then the same load against a 3-node nats-server cluster (sync_interval:
# always, nats-server's equal-durability setting) for the ratio. Free ports, temporary
# stores, everything stopped afterwards. Writes benchmarks/results/locust-cluster-<TAG>.md.
#   benchmarks/locust_cluster.sh [TAG]     knobs: USERS (30) SECONDS_ (30) TARGETS
#   ("jetraft nats-always"; add nats for the default sync) plus the locustfile's own
#   (MSG_SIZE, FETCH_BATCH, ...)
set -euo pipefail
TAG=${1:-$(date +%Y%m%d-%H%M%S)}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$HERE/results/locust-cluster-$TAG"
USERS=${USERS:-30}
SECS=${SECONDS_:-30}
TARGETS=${TARGETS:-"jetraft nats-always"}
PYTHONPATH="$HERE/.." python - "$HERE" "$OUT" "$USERS" "$SECS" "$TARGETS" <<'PY'
import os, shutil, subprocess, sys, tempfile
from pathlib import Path
here, out, users, secs, targets = sys.argv[1:]
sys.path.insert(0, here)
from js_cluster_bench import nats_cluster, wait_js_meta
from node.cluster.local import LocalCluster

KEEP = ("Type", "Name", "Request Count", "Failure Count", "Median Response Time", "95%",
        "99%", "Requests/s", "Average Content Size")


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def locust(urls, csv):
    env = {**os.environ, "NATS_URLS": ",".join(urls), "JS_REPLICAS": "3"}
    subprocess.run(["locust", "-f", os.path.join(here, "locustfile.py"), "--headless",
                    "-u", users, "-r", users, "-t", f"{secs}s", "--csv", csv,
                    "--only-summary"], env=env, check=False, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    rows = open(csv + "_stats.csv").read().splitlines()
    fails = open(csv + "_failures.csv").read().splitlines()[1:] \
        if os.path.exists(csv + "_failures.csv") else []
    for suffix in ("_stats.csv", "_stats_history.csv", "_failures.csv", "_exceptions.csv"):
        if os.path.exists(csv + suffix):
            os.unlink(csv + suffix)
    return rows, fails


def table(rows):
    head = rows[0].split(",")
    keep = [head.index(k) for k in KEEP]
    lines = ["| " + " | ".join(head[i] for i in keep) + " |", "|" + "---|" * len(keep)]
    for r in rows[1:]:
        c = r.split(",")
        lines.append("| " + " | ".join(c[i] for i in keep) + " |")
    return "\n".join(lines)


report = [f"# locust against 3-node clusters ({users} users, {secs} s, R3 stream, users "
          "spread over the 3 nodes)\n"]
for target in targets.split():
    tmp = Path(tempfile.mkdtemp(prefix="locust-cl-"))
    procs, jet = [], None
    try:
        if target == "jetraft":
            jet = LocalCluster(tmp, 3, name="C1")
            jet.start()
            urls = [n.url for n in jet.nodes]
        else:
            procs, urls = nats_cluster(tmp, target == "nats-always")
        wait_js_meta(urls)
        before = uptime()
        rows, fails = locust(urls, f"{out}-{target}")
        after = uptime()
    finally:
        if jet is not None:
            jet.stop()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    report.append(f"## {target}\n\nuptime before: {before}\n\nuptime after: {after}\n")
    report.append(table(rows) + "\n")
    if fails:
        report.append("Failures:\n\n" + "\n".join("    " + f for f in fails[:10]) + "\n")
Path(out + ".md").write_text("\n".join(report))
print("\n".join(report))
PY
