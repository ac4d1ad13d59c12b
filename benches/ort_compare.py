"""Side-by-side ONNX Runtime latency of exported models, in one process and one run.

    python3 benches/ort_compare.py NAME=MODEL.onnx NAME=MODEL.onnx ... [--seq 64] [--runs 30]
        [--warmup 10] [--threads 0] [--json OUT.json]

Sessions do not spin-wait between runs (ONNX Runtime's idle threads would otherwise steal the
cores of the session being timed). Every model gets the same inputs: text models (inputs
`input_ids`, ...) batch 1 and 32 x seq tokens, ids drawn below 30522, no padding; image models
(input `image` [batch, C, H, W]) batch 1 and 64 images of a smooth pattern. Timed runs are interleaved across the models (model A run 1, model B run 1, ...), so
drift of the machine (other load, frequency) hits all of them alike. Prints p50/p90/p99 per
model and batch, and each model's p50 speed-up over the first model; records the CPU model and
its SIMD flags, and the onnxruntime version.
"""
import argparse
import json
import platform
import time

import numpy as np
import onnxruntime as ort


def cpu():
    model, flags = platform.processor(), []
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and not flags:
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                flags = sorted(f for f in have if f.startswith(("avx", "sse4", "fma", "amx")) or "vnni" in f)
                break
    except OSError:
        pass
    return model, flags


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+", help="NAME=PATH.onnx; the first is the reference")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: ONNX Runtime's default)")
    ap.add_argument("--json")
    a = ap.parse_args()
    sessions = []
    for spec in a.models:
        name, path = spec.split("=", 1)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if a.threads:
            so.intra_op_num_threads = a.threads
        # Idle sessions' threads would spin after each run and steal the cores of the session
        # being timed (interleaving makes that the common case): no spinning.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions.append((name, path, ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])))
    rows = []
    image = next((i for i in sessions[0][2].get_inputs() if i.name == "image"), None)
    for batch in ((1, 64) if image is not None else (1, 32)):
        n = a.runs * 4 if batch == 1 else a.runs
        if image is not None:
            c, h, w = image.shape[1:]
            x = ((np.arange(batch * c * h * w) % 97) / 48.0 - 1.0).astype(np.float32)
            feed = {"image": x.reshape(batch, c, h, w)}
        else:
            ids = (1000 + (np.arange(batch * a.seq) * 7919) % 29000).reshape(batch, a.seq).astype(np.int64)
            ids[:, 0] = 101
            feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        for _, _, s in sessions:
            for _ in range(a.warmup):
                s.run(None, feed)
        times = {name: [] for name, _, _ in sessions}
        for _ in range(n):
            for name, _, s in sessions:
                t = time.perf_counter()
                s.run(None, feed)
                times[name].append((time.perf_counter() - t) * 1e3)
        for name, path, _ in sessions:
            t = sorted(times[name])
            pct = lambda p: t[min(len(t), max(1, int(np.ceil(p / 100 * len(t))))) - 1]
            rows.append({"model": name, "path": path, "batch": batch, "seq_len": a.seq, "runs": n,
                         "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99)})
    model, flags = cpu()
    print(f"CPU: {model}; SIMD: {' '.join(flags)}; onnxruntime {ort.__version__}; seq {a.seq}")
    print("| model | batch | p50 ms | p90 ms | p99 ms | p50 speed-up over " + sessions[0][0] + " |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ref = next(x for x in rows if x["batch"] == r["batch"] and x["model"] == sessions[0][0])
        r["speedup_vs_first"] = ref["p50_ms"] / r["p50_ms"]
        print(f"| {r['model']} | {r['batch']} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f} | {r['speedup_vs_first']:.2f}x |")
    if a.json:
        json.dump({"cpu": model, "simd": flags, "onnxruntime": ort.__version__, "rows": rows}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
