#!/usr/bin/env bash
# Core NATS throughput/latency of one jetraft node vs the reference nats-server, same run.
#
#   benchmarks/core_bench.sh [TAG]
#
# Starts a single `jetraft serve` (its own random free port, real process) and the
# reference nats-server (the shared harness's `single` target), then runs the shared
# harness bench.py with core_pub,core_pubsub,req_reply for the py and js clients against
# both targets in ONE invocation (targets interleave per repetition, so they share the
# machine's conditions). Writes:
#   benchmarks/results/core-<TAG>.json   raw runs (not committed: large)
#   benchmarks/results/core-<TAG>.md     markdown table + jetraft/nats-server ratios
# and stops only what it started. Environment knobs:
#   DURATION (5) REPEATS (3) SCENARIOS (core_pub,core_pubsub,req_reply) CLIENTS (py,js)
#   BENCH_DIR (/work/shared/bench)  JETRAFT (jetraft)
set -euo pipefail

TAG=${1:-$(date +%Y%m%d-%H%M%S)}
DURATION=${DURATION:-5}
REPEATS=${REPEATS:-3}
SCENARIOS=${SCENARIOS:-core_pub,core_pubsub,req_reply}
CLIENTS=${CLIENTS:-py,js}
BENCH_DIR=${BENCH_DIR:-/work/shared/bench}
JETRAFT=${JETRAFT:-jetraft}
SELF_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$SELF_DIR/results"
mkdir -p "$OUT"
. "$BENCH_DIR/env.sh"   # ANCHORBENCH_WORK, PY (the harness venv's python)

JSON="$OUT/core-$TAG.json"
MD="$OUT/core-$TAG.md"
TMP=$(mktemp -d)
JR_PID=""
STARTED_REF=0

cleanup() {
  if [[ -n $JR_PID ]] && kill -0 "$JR_PID" 2>/dev/null; then
    kill -TERM "$JR_PID"
    for _ in $(seq 1 50); do kill -0 "$JR_PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$JR_PID" 2>/dev/null && kill -KILL "$JR_PID"
  fi
  if [[ $STARTED_REF == 1 ]]; then "$BENCH_DIR/servers.sh" stop single >/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

# The reference: start it only if nobody else already runs it, and then stop it after.
if ! "$BENCH_DIR/servers.sh" status | grep -q '^single running'; then
  "$BENCH_DIR/servers.sh" start single --wipe
  STARTED_REF=1
fi

# jetraft on a random free port; its ports file tells us which one it got.
"$JETRAFT" serve -a 127.0.0.1 -p -1 -n jetraft-bench --ports_file_dir "$TMP" \
  >"$TMP/jetraft.log" 2>&1 &
JR_PID=$!
PORT=""
for _ in $(seq 1 200); do
  f=$(ls "$TMP"/*.ports 2>/dev/null | head -1 || true)
  if [[ -n $f ]]; then
    PORT=$("$PY" -c 'import json,sys;print(json.load(open(sys.argv[1]))["nats"][0].rsplit(":",1)[1])' "$f")
    break
  fi
  kill -0 "$JR_PID" 2>/dev/null || { cat "$TMP/jetraft.log" >&2; exit 1; }
  sleep 0.1
done
[[ -n $PORT ]] || { echo "jetraft did not start" >&2; cat "$TMP/jetraft.log" >&2; exit 1; }
echo "jetraft pid $JR_PID port $PORT; reference nats://127.0.0.1:14222" >&2

"$PY" "$BENCH_DIR/bench.py" \
  --target ref=nats://127.0.0.1:14222 \
  --target jetraft="nats://127.0.0.1:$PORT" \
  --server-pid jetraft="$JR_PID" \
  --scenarios "$SCENARIOS" --client "$CLIENTS" \
  --duration "$DURATION" --repeats "$REPEATS" \
  --json "$JSON" | tee "$TMP/table.txt"

"$PY" "$SELF_DIR/core_ratios.py" "$JSON" "$BENCH_DIR" >"$MD"
echo "wrote $MD and $JSON" >&2
cat "$MD"
