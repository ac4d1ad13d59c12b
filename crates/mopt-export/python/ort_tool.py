"""ONNX / ONNX Runtime helper for mopt's exporter (called by mopt-export; prints JSON).

  check MODEL                         onnx.checker.check_model (full check)
  run MODEL INPUTS_JSON OUT_JSON      run ONNX Runtime; inputs: {"feeds": [{name: nested list}, ...]}
  fuse MODEL TYPE HEADS HIDDEN OUT    ORT transformer optimizer (model_type=TYPE); op-type counts
  optimized-ops MODEL OUT             ORT graph optimisation (ORT_ENABLE_ALL) saved to OUT; op-type counts
  bench MODEL FEEDS_JSON WARMUP RUNS  latency p50/p90/p99 (ms); feeds: [{"batch", "seq_len", "feed"}]
                                      (RUNS timed runs, 4x at batch 1)
  bench-many SPEC_JSON WARMUP RUNS    several models' latency, interleaved: spec [{"name", "model",
                                      "feeds"}]; each timed run of one model is followed by one of
                                      the next, so that they share the machine's drift
"""
import json
import sys
import time
from collections import Counter

import numpy as np


def op_counts(model):
    return dict(Counter(n.op_type for n in model.graph.node))


def session(path, optimized_out=None, level="all"):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = {
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    }[level]
    if optimized_out:
        so.optimized_model_filepath = optimized_out
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def feeds_of(sess, entry):
    types = {i.name: i.type for i in sess.get_inputs()}
    return {k: np.asarray(v, dtype=np.int64 if "int64" in types[k] else np.float32) for k, v in entry["feed"].items()}


def percentiles(times):
    times = sorted(times)
    pct = lambda p: times[min(len(times), max(1, int(np.ceil(p / 100 * len(times))))) - 1]
    return {"p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99), "mean_ms": float(np.mean(times))}


def bench_many(spec, warmup, runs):
    """Every model's sessions first, then per batch: warm-up, then timed runs round-robin."""
    sessions = [session(m["model"]) for m in spec]
    rows = [[] for _ in spec]
    for b in range(len(spec[0]["feeds"])):
        feeds = [feeds_of(s, m["feeds"][b]) for s, m in zip(sessions, spec)]
        for s, f in zip(sessions, feeds):
            for _ in range(warmup):
                s.run(None, f)
        entry = spec[0]["feeds"][b]
        n = runs * 4 if entry["batch"] == 1 else runs
        times = [[] for _ in spec]
        for _ in range(n):
            for i, (s, f) in enumerate(zip(sessions, feeds)):
                t = time.perf_counter()
                s.run(None, f)
                times[i].append((time.perf_counter() - t) * 1e3)
        for i, m in enumerate(spec):
            e = m["feeds"][b]
            rows[i].append({"batch": e["batch"], "seq_len": e["seq_len"], "runs": n, **percentiles(times[i])})
    return [{"name": m["name"], "latency": r} for m, r in zip(spec, rows)]


def main(argv):
    cmd = argv[0]
    if cmd == "version":
        import onnx
        import onnxruntime

        print(json.dumps({"ok": True, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}))
    elif cmd == "check":
        import onnx

        m = onnx.load(argv[1])
        onnx.checker.check_model(m, full_check=True)
        print(json.dumps({"ok": True, "ops": op_counts(m), "opset": m.opset_import[0].version, "ir": m.ir_version}))
    elif cmd == "run":
        sess = session(argv[1])
        feeds = json.load(open(argv[2]))["feeds"]
        types = {i.name: i.type for i in sess.get_inputs()}
        outs = []
        for feed in feeds:
            arrays = {}
            for k, v in feed.items():
                dt = np.int64 if "int64" in types[k] else (np.uint8 if "uint8" in types[k] else np.float32)
                arrays[k] = np.asarray(v, dtype=dt)
            outs.append(sess.run(None, arrays)[0].tolist())
        json.dump({"outputs": outs}, open(argv[3], "w"))
        print(json.dumps({"ok": True, "batches": len(outs)}))
    elif cmd == "fuse":
        from onnxruntime.transformers import optimizer

        opt = optimizer.optimize_model(argv[1], model_type=argv[2], num_heads=int(argv[3]), hidden_size=int(argv[4]), opt_level=0)
        opt.save_model_to_file(argv[5])
        print(json.dumps({"ok": True, "ops": op_counts(opt.model)}))
    elif cmd == "optimized-ops":
        import onnx

        session(argv[1], optimized_out=argv[2])
        print(json.dumps({"ok": True, "ops": op_counts(onnx.load(argv[2]))}))
    elif cmd == "bench-many":
        spec, warmup, runs = json.load(open(argv[1])), int(argv[2]), int(argv[3])
        print(json.dumps({"ok": True, "latency": bench_many(spec, warmup, runs)}))
    elif cmd == "bench":
        path, feeds, warmup, runs = argv[1], json.load(open(argv[2])), int(argv[3]), int(argv[4])
        sess = session(path)
        types = {i.name: i.type for i in sess.get_inputs()}
        res = []
        for entry in feeds:
            batch, seq = entry["batch"], entry["seq_len"]
            n = runs * 4 if batch == 1 else runs
            feed = {k: np.asarray(v, dtype=np.int64 if "int64" in types[k] else np.float32) for k, v in entry["feed"].items()}
            for _ in range(warmup):
                sess.run(None, feed)
            times = []
            for _ in range(n):
                t = time.perf_counter()
                sess.run(None, feed)
                times.append((time.perf_counter() - t) * 1e3)
            times.sort()
            pct = lambda p: times[min(len(times), max(1, int(np.ceil(p / 100 * len(times))))) - 1]
            res.append({"batch": batch, "seq_len": seq, "runs": n, "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99), "mean_ms": float(np.mean(times))})
        print(json.dumps({"ok": True, "latency": res}))
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
