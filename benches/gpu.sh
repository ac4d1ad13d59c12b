#!/usr/bin/env bash
# Mixed precision on a GPU: a short distillation (recipes/distill_bert.toml, --max-steps) in fp32,
# bf16 and fp16, then the speed harness against PyTorch on the same GPU in all three precisions.
# Writes benches/results/gpu.json (override with OUT=...).
#
#   benches/gpu.sh                          # cuda:0 through Burn's CUDA backend (feature `cuda`)
#   FEATURE=tch DEVICE=tch-cuda:0 benches/gpu.sh   # LibTorch (PyTorch 2.9's wheel, see the README's "Mixed precision, GPUs and data parallel")
#   DEVICE=cpu FEATURE= STEPS=2 HARNESS_ARGS="--only student_step --steps 2" benches/gpu.sh
#                                                  # a quick dry run of the script on the CPU
#
# Needs: NVIDIA driver (nvidia-smi), Rust, Python 3 with benches/requirements.txt (PyTorch with
# CUDA). The `cuda` feature's first build downloads CubeCL's LLVM bundle (network once).
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE="${DEVICE:-cuda:0}"
FEATURE="${FEATURE-cuda}"
STEPS="${STEPS:-200}"
OUT="${OUT:-benches/results/gpu.json}"
HARNESS_ARGS="${HARNESS_ARGS:-}"   # extra speed-harness flags, e.g. "--only student_step --steps 5"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK" recipes/.gpu-bench-*.toml' EXIT

features=()
[ -n "$FEATURE" ] && features=(--features "$FEATURE")
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$WORK/gpu.txt"
else
  echo "no nvidia-smi: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)" | tee "$WORK/gpu.txt"
fi
datasets/fetch.sh --text
# The dev profile is fully optimised here (Cargo.toml) and shares its build with the harness.
cargo build "${features[@]}" --bin mopt-train
BIN="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug/mopt-train"

# 1. A short distillation per precision (the teacher is trained first when it is missing).
for p in fp32 bf16 fp16; do
  r="recipes/.gpu-bench-$p.toml"
  sed -e "s/^name = \"distill-bert\"/name = \"gpu-bench-$p\"/" \
      -e "s/^\[train\]$/[train]\nprecision = \"$p\"/" recipes/distill_bert.toml > "$r"
  echo "== distillation, $p, $STEPS steps on $DEVICE"
  "$BIN" "$r" --device "$DEVICE" --max-steps "$STEPS" --force --no-reuse \
    2>&1 | tee "$WORK/distill-$p.log" | grep -E '^(epoch|[0-9]+ )' || true
done

# 1b. With two or more GPUs: the fp32 distillation data-parallel over two of them, gradients
# all-reduced by Burn's collectives (NCCL); the log's "data parallel over 2 devices" line says
# which strategy ran.
gpus=$(nvidia-smi -L 2>/dev/null | wc -l || echo 0)
if [ "$FEATURE" = cuda ] && [ "$gpus" -ge 2 ]; then
  echo "== distillation, fp32, $STEPS steps on cuda:0 + cuda:1 (all-reduce)"
  sed -e 's/^name = "distill-bert"/name = "gpu-bench-ddp"/' recipes/distill_bert.toml > recipes/.gpu-bench-ddp.toml
  "$BIN" recipes/.gpu-bench-ddp.toml --device cuda:0 --devices 0,1 --max-steps "$STEPS" --force --no-reuse \
    2>&1 | tee "$WORK/distill-ddp.log" | grep -E '^(epoch|data parallel)' || true
fi

# 2. The speed harness (mopt and PyTorch on the same device; fp32, bf16, fp16 student rows).
# shellcheck disable=SC2086
cargo bench --profile dev "${features[@]}" --bench speed -- --device "$DEVICE" --out "$WORK/speed.json" $HARNESS_ARGS

python3 - "$WORK" "$OUT" "$DEVICE" "$STEPS" <<'EOF'
import json, pathlib, sys
work, out, device, steps = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
runs = {}
for p in ["fp32", "bf16", "fp16"]:
    run = pathlib.Path(f"checkpoints/gpu-bench-{p}")
    st = next(s for s in json.loads((run / "report.json").read_text())["stages"] if s["kind"] == "distill")
    train = json.loads((run / "01-distill/report.json").read_text())
    runs[p] = {"steps": st["steps"], "wall_time_s": st["wall_time_s"],
               "train_samples_per_s": train["train_samples_per_s"],
               "valid_accuracy": st["model"]["valid"]["accuracy"],
               "test_accuracy": st["model"]["test"]["accuracy"],
               "loss_scale": train.get("loss_scale")}
ddp = pathlib.Path("checkpoints/gpu-bench-ddp/report.json")
if (work / "distill-ddp.log").exists() and ddp.exists():
    st = next(s for s in json.loads(ddp.read_text())["stages"] if s["kind"] == "distill")
    runs["fp32-2gpu"] = {"steps": st["steps"], "wall_time_s": st["wall_time_s"],
                         "valid_accuracy": st["model"]["valid"]["accuracy"],
                         "strategy": next((l for l in (work / "distill-ddp.log").read_text().splitlines()
                                           if l.startswith("data parallel")), None)}
res = {"device": device, "hardware": (work / "gpu.txt").read_text().strip(), "distill_steps": steps,
       "distill": runs, "speed": json.loads((work / "speed.json").read_text())}
pathlib.Path(out).write_text(json.dumps(res, indent=1))
print(f"wrote {out}")
EOF
