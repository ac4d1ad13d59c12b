#!/usr/bin/env bash
# Data-parallel training over remote CPU servers (`mopt-train serve`) on this machine, against
# the local step: the MiniLM-L6 fine-tuning step of recipes/finetune_teacher.toml (22.7M
# parameters, batch 32 per device, 64 tokens) on 512 training reviews, for
#   local                      the one local device
#   local + 1 / 2 / 3 servers  [0, ws://..., ...]: the optimizer on the local device
#   1 server                   [ws://...]: everything on the server
# Each row: train time per optimizer step and examples per second (from the fit's report), and
# the bytes the loopback interface carried during the run per step (/proc/net/dev `lo`, received
# bytes: each byte between this process and its servers once, both directions), which the
# model's size explains (docs/src/gpu.md, "Past one machine").
#
#   cargo build --bin mopt-train --features remote && benches/remote.sh   # writes benches/results/remote.json
#
# All servers share this machine's cores with the client: this measures the protocol's cost,
# not a speed-up (that needs servers on other machines).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/debug/mopt-train}
STEPS=${STEPS:-6}
OUT=${OUT:-benches/results/remote.json}
WORK=$(mktemp -d)
SERVERS=()
cleanup() {
    for p in "${SERVERS[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

[ -x "$BIN" ] || { echo "build first: cargo build --bin mopt-train (or set BIN)" >&2; exit 2; }

# The recipe: finetune_teacher.toml on a slice of the data, no latency runs, paths absolute.
sed -e "s|\.\./|$ROOT/|g" -e "s|^output-dir = .*|output-dir = \"$WORK/runs\"|" \
    -e "s|^split-seed = 42|split-seed = 42\nmax-train = 512\nmax-eval = 64|" \
    recipes/finetune_teacher.toml > "$WORK/recipe.toml"
printf '\n[evaluation]\nlatency-runs = 0\nanalysis = false\n' >> "$WORK/recipe.toml"

URLS=()
start_server() { # index: appends the server's address to URLS
    local log="$WORK/server$1.log" url=""
    "$BIN" serve --host 127.0.0.1 --port 0 > "$log" 2>&1 &
    SERVERS+=($!)
    for _ in $(seq 100); do
        url=$(grep -o 'ws://[0-9.:]*' "$log" | head -1 || true)
        [ -n "$url" ] && break
        sleep 0.1
    done
    [ -n "$url" ] || { echo "server $1 did not start:" >&2; cat "$log" >&2; exit 1; }
    URLS+=("$url")
}

lo_bytes() { awk '/^ *lo:/ { printf "%.0f\n", $2 }' /proc/net/dev; }

for i in 1 2 3; do start_server "$i"; done
echo "servers: ${URLS[*]}"

rows=()
run() { # name, devices (comma list or empty)
    local name=$1 devices=$2 args=(--max-steps "$STEPS") before after
    [ -n "$devices" ] && args+=(--devices "$devices")
    before=$(lo_bytes)
    "$BIN" "$WORK/recipe.toml" --force --no-reuse "${args[@]}" > "$WORK/$name.log" 2>&1 \
        || { tail -5 "$WORK/$name.log" >&2; exit 1; }
    after=$(lo_bytes)
    local report="$WORK/runs/finetune-teacher/01-finetune/report.json"
    [ -f "$report" ] || report="$WORK/runs/finetune-teacher/report.json"
    local row
    row=$(python3 - "$report" "$name" "$devices" "$((after - before))" <<'EOF'
import json, sys
path, name, devices, lo = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
r = json.load(open(path))
steps = r["steps"]
sps = r["train_samples_per_s"]
ex = 32 * max(1, len([d for d in devices.split(",") if d]))
print(json.dumps({"name": name, "devices": devices, "steps": steps,
                  "examples_per_step": ex, "examples_per_s": round(sps, 2),
                  "s_per_step": round(ex / sps, 3) if sps else None,
                  "loopback_mib_per_step": round(lo / steps / 2**20, 1)}))
EOF
)
    echo "$row"
    rows+=("$row")
}

run local ""
run "local+1" "0,${URLS[0]}"
run "local+2" "0,${URLS[0]},${URLS[1]}"
run "local+3" "0,${URLS[0]},${URLS[1]},${URLS[2]}"
run "1 server" "${URLS[0]}"

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
mkdir -p "$(dirname "$OUT")"
{
    echo "{\"cpu\": \"$cpu\", \"cores\": $(nproc), \"date\": \"$(date -u +%FT%TZ)\", \"steps\": $STEPS, \"rows\": ["
    (IFS=,; echo "${rows[*]}")
    echo "]}"
} > "$OUT"
echo "wrote $OUT"
