#!/usr/bin/env bash
# The wgpu backend run for real, not only type-checked: a tiny recipe (fine-tune, distill,
# prune, export) on `--device wgpu` through a software Vulkan driver (Mesa's lavapipe), against
# the same recipe on the CPU: every stage's validation loss and the golden reference's logits
# compared. Not in CI (a full wgpu build takes 30-60 minutes cold on 2 cores); the book
# (docs/src/gpu.md) and the closing notes say when it last ran.
#
#   sudo apt-get install -y mesa-vulkan-drivers libvulkan1 && datasets/fetch.sh --small && tests/wgpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/gpu-check"
TOL=${TOL:-1e-3}
compgen -G "/usr/share/vulkan/icd.d/lvp_icd.*.json" > /dev/null || [ -n "${VK_ICD_FILENAMES:-}" ] || {
    echo "no Vulkan driver: install lavapipe (apt-get install mesa-vulkan-drivers libvulkan1)" >&2
    exit 2
}
# `--device wgpu` is wgpu's default adapter: make it the CPU (lavapipe) one even where a real GPU
# is present, so that this script always tests the software driver.
export CUBECL_WGPU_DEFAULT_DEVICE=${CUBECL_WGPU_DEFAULT_DEVICE:-Cpu}
echo "wgpu: building mopt-train --no-default-features --features wgpu"
cargo build --bin mopt-train --no-default-features --features wgpu
BIN="$CARGO_TARGET_DIR/debug/mopt-train"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
DATA=datasets/data
cat > "$WORK/tiny-config.json" <<'EOF'
{"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
 "intermediate_size": 64, "max_position_embeddings": 128, "type_vocab_size": 2,
 "layer_norm_eps": 1e-12, "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
 "attention_probs_dropout_prob": 0.0}
EOF
# The start both chains share: the tiny BERT fine-tuned once on the CPU (a random init drawn on
# another backend would differ), then fine-tune -> distill -> prune -> export on each device.
preamble() { # name, device
    cat <<EOF
[run]
name = "$1"
output-dir = "$WORK/runs"
seed = 7
device = "$2"

[tokenizer]
path = "$ROOT/$DATA/models/all-MiniLM-L6-v2/vocab.txt"
max-len = 32

[data]
format = "rotten-tomatoes"
path = "$ROOT/$DATA/rotten_tomatoes/rotten_tomatoes_corpus_full.csv.bz2"
max-train = 96
max-eval = 40

[train]
epochs = 1
batch-size = 16
lr = 1e-3

[evaluation]
latency-runs = 0
analysis = false

EOF
}
{ preamble start cpu; printf '[model]\nconfig = "%s"\n\n[[stage]]\nkind = "finetune"\n' "$WORK/tiny-config.json"; } > "$WORK/start.toml"
echo "wgpu: the shared start (tiny BERT fine-tuned on the CPU)"
"$BIN" "$WORK/start.toml" > "$WORK/start.log" 2>&1 || { tail -20 "$WORK/start.log"; exit 1; }
recipe() { # device
    preamble "tiny-$1" "$1"
    cat <<EOF
[teacher]
checkpoint = "$WORK/runs/start/best"

[[stage]]
kind = "finetune"

[[stage]]
kind = "distill"
alpha = 0.5
temperature = 2.0
[stage.student]
config = "$WORK/tiny-config.json"
init-from-teacher-layers = [0]
[stage.student.overrides]
num-hidden-layers = 1

[[stage]]
kind = "prune"
criterion = "l1"
target = 0.5
step = 0.5
ffn-multiple = 4

[[stage]]
kind = "export"
samples = 40
EOF
}
for dev in cpu wgpu; do
    recipe "$dev" > "$WORK/$dev.toml"
    echo "wgpu: running the tiny chain on $dev"
    start=$(date +%s)
    "$BIN" "$WORK/$dev.toml" > "$WORK/$dev.log" 2>&1 || { tail -20 "$WORK/$dev.log"; exit 1; }
    echo "  $(( $(date +%s) - start )) s"
done
python3 - "$WORK/runs/tiny-cpu" "$WORK/runs/tiny-wgpu" "$TOL" <<'EOF'
import json, sys
cpu, gpu, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
a = json.load(open(f"{cpu}/report.json"))["stages"]
b = json.load(open(f"{gpu}/report.json"))["stages"]
worst = 0.0
for x, y in zip(a, b):
    la, lb = x["model"]["valid"]["loss"], y["model"]["valid"]["loss"]
    rel = abs(la - lb) / max(abs(la), 1e-12)
    worst = max(worst, rel)
    print(f"  {x['kind']:>9} {x['name']:<10} valid loss cpu {la:.6f} wgpu {lb:.6f} (rel {rel:.1e}), "
          f"accuracy {x['model']['valid']['accuracy']:.4f} / {y['model']['valid']['accuracy']:.4f}")
ga = json.load(open(f"{cpu}/golden.json"))["logits"]
gb = json.load(open(f"{gpu}/golden.json"))["logits"]
dl = max(abs(p - q) for ra, rb in zip(ga, gb) for p, q in zip(ra, rb))
print(f"  golden logits (the shared start, {len(ga)} examples): max |cpu - wgpu| {dl:.2e}")
ok = worst <= tol and len(a) == len(b)
print(f"wgpu: {'PASS' if ok else 'FAIL'}: worst relative loss difference {worst:.1e} (tolerance {tol})")
sys.exit(0 if ok else 1)
EOF
