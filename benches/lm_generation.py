#!/usr/bin/env python3
"""Decoding speed at batch 1 of language models side by side: mopt (`mopt-train generate`) and
ONNX Runtime (the export stage's `model.onnx` + `decoder_with_past.onnx`), interleaved in rounds
so that a drifting machine slows every model alike; medians, and each model's ratio to the
first (the reference, e.g. the teacher).

    python3 benches/lm_generation.py --rounds 5 \\
        --model teacher=checkpoints/finetune-smollm2/best@checkpoints/run/02-float-export/baseline \\
        --model student-int8=checkpoints/run/03-int8/best@checkpoints/run/04-int8-export

A model is `NAME=CHECKPOINT_DIR[@ONNX_DIR]`: the checkpoint folder `generate` serves, and the
folder holding its ONNX graphs (without one, only mopt times it). Each round times, for every
model in turn, greedy decoding of `--new-tokens` tokens after the prompt: in mopt one
`generate` process (tokens/s after the first new token, as it prints), in ONNX Runtime the
prompt through `model.onnx` and one step a token through `decoder_with_past.onnx` (mean step
time; one untimed warm-up pass first; ONNX Runtime's default threads). Writes `--out` (JSON)
with the CPU model, its SIMD flags and the onnxruntime version.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "crates/mopt-export/python"))
sys.path.insert(0, str(ROOT / "benches"))

from ort_compare import cpu  # noqa: E402  (the CPU model and SIMD flags, as the ORT bench records them)


def binary():
    if os.environ.get("MOPT_TRAIN"):
        return os.environ["MOPT_TRAIN"]
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return str(target / "debug" / "mopt-train")


GENERATED = re.compile(r"generated: (\d+) tokens, ([0-9.]+) tokens/s after the first")


def mopt_tokens_per_s(ckpt, prompt, new_tokens):
    args = [binary(), "generate", ckpt, "--prompt", prompt, "--max-new-tokens", str(new_tokens)]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{ckpt}: generate failed:\n{out.stderr}")
    m = GENERATED.search(out.stderr)
    if not m:
        sys.exit(f"{ckpt}: no tokens/s in generate's output:\n{out.stderr}")
    if int(m.group(1)) < new_tokens:
        # The end-of-text token stopped it early: fewer steps than ONNX Runtime's.
        print(f"warning: {ckpt} wrote {m.group(1)} of {new_tokens} tokens", file=sys.stderr)
    return float(m.group(2)), out.stdout.strip(), "ran in integers" in out.stderr


def ort_tokens_per_s(onnx_dir, prompt_ids, new_tokens):
    import ort_tool

    d = Path(onnx_dir)
    out = ort_tool.decode(str(d / "model.onnx"), str(d / "decoder_with_past.onnx"), prompt_ids, new_tokens)
    return 1e3 / out["decode_ms"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True, help="NAME=CHECKPOINT_DIR[@ONNX_DIR]")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--prompt", default="To be, or not to be, that is the question:")
    p.add_argument("--out", help="JSON results")
    a = p.parse_args()
    if a.rounds < 1 or a.new_tokens < 2:
        sys.exit("--rounds must be at least 1 and --new-tokens at least 2")
    models = []
    for spec in a.model:
        name, _, rest = spec.partition("=")
        ckpt, _, onnx_dir = rest.partition("@")
        if not name or not Path(ckpt).is_dir():
            sys.exit(f"--model {spec}: want NAME=CHECKPOINT_DIR[@ONNX_DIR] with an existing folder")
        models.append({"name": name, "checkpoint": ckpt, "onnx": onnx_dir or None, "mopt": [], "ort": []})
    # The prompt's ids as the teacher's tokenizer gives them (`generate --ids`), for ONNX Runtime.
    ids = subprocess.run(
        [binary(), "generate", models[0]["checkpoint"], "--prompt", a.prompt, "--max-new-tokens", "1", "--ids"],
        capture_output=True, text=True, check=True,
    ).stderr
    found = re.search(r"prompt ids (\[[0-9, ]*\])", ids)
    if not found:
        sys.exit(f"no prompt ids in `generate --ids`'s output:\n{ids}")
    prompt_ids = json.loads(found.group(1))
    for r in range(a.rounds):
        for m in models:
            tps, text, integer = mopt_tokens_per_s(m["checkpoint"], a.prompt, a.new_tokens)
            m["mopt"].append(tps)
            m["integer"], m["text"] = integer, text
            if m["onnx"]:
                m["ort"].append(ort_tokens_per_s(m["onnx"], prompt_ids, a.new_tokens))
        print(f"round {r + 1}: " + "; ".join(
            f"{m['name']} mopt {m['mopt'][-1]:.1f}" + (f" ort {m['ort'][-1]:.1f}" if m["ort"] else "") for m in models
        ), flush=True)
    ref = models[0]
    rows = []
    for m in models:
        row = {"name": m["name"], "checkpoint": m["checkpoint"], "onnx": m["onnx"], "integer_kernels": m["integer"]}
        for side in ("mopt", "ort"):
            if m[side]:
                row[f"{side}_tokens_per_s"] = m[side]
                row[f"{side}_median"] = statistics.median(m[side])
                if ref[side]:
                    # Per round, then the median: each round's models ran back to back.
                    ratios = [x / y for x, y in zip(m[side], ref[side])]
                    row[f"{side}_ratio_median"] = statistics.median(ratios)
                    row[f"{side}_ratio_range"] = [min(ratios), max(ratios)]
        rows.append(row)
    model, flags = cpu()
    import onnxruntime

    ort_version = onnxruntime.__version__
    print(f"CPU: {model}; SIMD: {' '.join(flags)}; onnxruntime {ort_version}; {a.new_tokens} new tokens, {a.rounds} rounds")
    for row in rows:
        ratio = lambda side: f" ({row[side + '_ratio_median']:.2f}x)" if side + "_ratio_median" in row else ""
        line = f"{row['name']:>16}: mopt {row['mopt_median']:6.1f} tokens/s{ratio('mopt')}"
        if "ort_median" in row:
            line += f", ONNX Runtime {row['ort_median']:6.1f} tokens/s{ratio('ort')}"
        print(line + (" [int8 kernels]" if row["integer_kernels"] else ""))
    if a.out:
        doc = {"cpu": model, "simd": flags, "onnxruntime": ort_version, "prompt": a.prompt,
               "new_tokens": a.new_tokens, "rounds": a.rounds, "reference": ref["name"], "rows": rows}
        Path(a.out).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
