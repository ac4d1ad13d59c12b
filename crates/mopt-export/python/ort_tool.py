"""ONNX / ONNX Runtime helper for mopt's exporter (called by mopt-export; prints JSON).

  check MODEL                         onnx.checker.check_model (full check)
  run MODEL INPUTS_JSON OUT_JSON      run ONNX Runtime; inputs: {"feeds": [{name: nested list}, ...]};
                                      each feed's first output as little-endian f32 in OUT_JSON.bin,
                                      their shapes in OUT_JSON ({"shapes": [...]})
  decode PREFILL STEP PROMPT_JSON N   greedy decoding of a causal LM's prefill and with-past graphs
                                      for N tokens: tokens, each step's logits, prompt/step ms
  fuse MODEL TYPE HEADS HIDDEN OUT    ORT transformer optimizer (model_type=TYPE); op-type counts
  optimized-ops MODEL OUT             ORT graph optimisation (ORT_ENABLE_ALL) saved to OUT; op-type counts
  fuse-qdq MODEL OUT                  a QDQ transformer for ONNX Runtime's CPU kernels: every
                                      DQ(x) . DQ(W) (+ bias) as one MatMulIntegerToFloat with the
                                      bias inside, every residual Add + LayerNormalization as one
                                      SkipLayerNormalization, every attention core as one
                                      MultiHeadAttention, every tanh GELU as one FastGelu;
                                      op-type counts after ORT's own pass
  bench-many SPEC_JSON WARMUP RUNS    several models' latency p50/p90/p99 (ms), interleaved in
                                      rounds: spec [{"name", "model", "feeds": [{"batch", "seq_len",
                                      "feed"}]}]; RUNS timed runs (4x at batch 1) in blocks of
                                      back-to-back runs of every model in turn, each in every
                                      layout (intra-op; data-parallel), its fastest one reported
                                      (see bench_many)
"""
import json
import sys
import time
from collections import Counter

import numpy as np


def op_counts(model):
    return dict(Counter(n.op_type for n in model.graph.node))


def session(path, optimized_out=None, level="all", threads=0):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = {
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    }[level]
    so.intra_op_num_threads = threads
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


ROUNDS = 5
REWARM = 2


def cores():
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class IntraOp:
    """One session, ONNX Runtime's default thread pool (a thread per core) inside each op."""

    def __init__(self, sess, feed):
        self.sess, self.feed = sess, feed
        self.name = f"one session, intra-op threads ({cores()} cores)"

    def run(self):
        self.sess.run(None, self.feed)


class DataParallel:
    """The batch split across one single-threaded session per core, run concurrently (ONNX
    Runtime releases the GIL): a server's worker per core. No thread pool synchronises inside
    an op, which a model of short kernels pays for on some machines (measured on a 2-vCPU EPYC:
    an INT8 MiniLM student at batch 32 took 27.4 ms intra-op and 19.1 ms split, while the fused
    teacher took 255.6 and 259.4; at batch 1 one thread took 1.11 ms against 0.78-1.36 for
    two)."""

    def __init__(self, path, feed, k):
        from concurrent.futures import ThreadPoolExecutor

        self.sessions = [session(path, threads=1) for _ in range(k)]
        parts = {n: np.array_split(v, k) for n, v in feed.items()}
        self.feeds = [{n: parts[n][i] for n in feed} for i in range(k)]
        self.pool = ThreadPoolExecutor(k) if k > 1 else None
        self.name = f"data-parallel, {k} single-thread sessions, the batch split" if k > 1 else "one single-thread session"

    def run(self):
        if self.pool is None:
            self.sessions[0].run(None, self.feeds[0])
            return
        for f in [self.pool.submit(s.run, None, x) for s, x in zip(self.sessions, self.feeds)]:
            f.result()


def layouts(path, sess, feed, batch):
    """The ways to run a model at `batch` on a machine of several cores: intra-op always;
    data-parallel over min(cores, batch) single-thread sessions when every input has the batch
    as its first axis (at batch 1, one single-thread session: a request per core, as a
    latency server runs a small model)."""
    out = [IntraOp(sess, feed)]
    k = min(cores(), batch)
    if cores() > 1 and all(v.ndim > 0 and v.shape[0] == batch for v in feed.values()):
        out.append(DataParallel(path, feed, k))
    return out


def bench_many(spec, warmup, runs):
    """Every model's sessions first, then per batch: warm-up, then ROUNDS rounds in which each
    model in turn runs REWARM untimed runs and a block of back-to-back timed runs. A model is
    timed hot, as a deployment serving requests back to back runs it (its thread pool spinning,
    its weights in cache); the rounds spread the machine's drift over all models alike. Timing
    models one run each in turn instead lets the previous model's spinning thread pool, caches
    and clock state slow the next: measured on a 2-vCPU Xeon, a fused MiniLM teacher at batch 1
    took 9.4 ms that way and 4.7 ms back to back, an INT8 student at batch 32 32 ms and 14 ms.

    Each model runs in every layout of `layouts` (each a turn of the rounds) and its row is
    its fastest layout's (lowest p50), named in `layout`; every layout's numbers are in
    `layouts`, so each model is compared in its own best configuration."""
    sessions = [session(m["model"]) for m in spec]
    rows = [[] for _ in spec]
    for b in range(len(spec[0]["feeds"])):
        entry = spec[0]["feeds"][b]
        runners = [
            (i, r)
            for i, (s, m) in enumerate(zip(sessions, spec))
            for r in layouts(m["model"], s, feeds_of(s, m["feeds"][b]), m["feeds"][b]["batch"])
        ]
        for _, r in runners:
            for _ in range(warmup):
                r.run()
        n = runs * 4 if entry["batch"] == 1 else runs
        block = max(1, -(-n // ROUNDS))
        times = [[] for _ in runners]
        while len(times[0]) < n:
            k = min(block, n - len(times[0]))
            for j, (_, r) in enumerate(runners):
                for _ in range(REWARM):
                    r.run()
                for _ in range(k):
                    t = time.perf_counter()
                    r.run()
                    times[j].append((time.perf_counter() - t) * 1e3)
        for i, m in enumerate(spec):
            e = m["feeds"][b]
            mine = [{"layout": r.name, **percentiles(times[j])} for j, (owner, r) in enumerate(runners) if owner == i]
            best = min(mine, key=lambda x: x["p50_ms"])
            rows[i].append({"batch": e["batch"], "seq_len": e["seq_len"], "runs": n, **best, "layouts": mine})
    return [{"name": m["name"], "latency": r} for m, r in zip(spec, rows)]


def attention_core(softmax, producer, users, inits, g):
    """The attention core around `softmax` as mopt's exporter writes it (Reshape -> Transpose of
    Q, K, V; MatMul -> Div -> Add(mask) -> Softmax -> MatMul -> Transpose -> Reshape): its Q, K,
    V projections, head count and final Reshape, or None when the pattern differs."""
    from onnx import numpy_helper

    def up(name, op):
        n = producer.get(name)
        return n if n is not None and n.op_type == op else None

    def down(name, op):
        u = users.get(name, [])
        return u[0] if len(u) == 1 and u[0].op_type == op else None

    add = up(softmax.input[0], "Add")
    div = add and up(add.input[0], "Div")
    mm = div and up(div.input[0], "MatMul")
    if mm is None:
        return None
    heads_of = lambda t: t and up(t.input[0], "Reshape")
    qr, kr = heads_of(up(mm.input[0], "Transpose")), heads_of(up(mm.input[1], "Transpose"))
    pv = down(softmax.output[0], "MatMul")
    vr = pv and heads_of(up(pv.input[1], "Transpose"))
    tr = pv and down(pv.output[0], "Transpose")
    merge = tr and down(tr.output[0], "Reshape")
    if not (qr and kr and vr and merge) or qr.input[1] not in inits:
        return None
    split = next(i for i in g.initializer if i.name == qr.input[1])
    heads = int(numpy_helper.to_array(split)[2])
    return qr.input[0], kr.input[0], vr.input[0], heads, merge


def fuse_qdq(src, dst):
    """QDQ graph -> ONNX Runtime contrib ops (com.microsoft): MatMulIntegerToFloat with its bias,
    SkipLayerNormalization for the residual sums mopt's exporter names `*residual*`, one
    MultiHeadAttention per attention core (key padding mask from `attention_mask`), one FastGelu
    per tanh GELU. The integer
    arithmetic is unchanged (same uint8 inputs, int8 weights, scales and zero points)."""
    import onnx
    from onnx import helper

    m = onnx.load(src)
    g = m.graph
    inits = {i.name for i in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    users = {}
    for n in g.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    replace, drop = {}, set()
    for n in g.node:
        if n.op_type != "MatMul":
            continue
        a, b = (producer.get(i) for i in n.input)
        if not (a and b and a.op_type == "DequantizeLinear" and b.op_type == "DequantizeLinear" and b.input[0] in inits):
            continue
        zp = lambda d: d.input[2] if len(d.input) > 2 else ""
        inputs = [a.input[0], b.input[0], a.input[1], b.input[1], zp(a), zp(b)]
        out = n.output[0]
        after = users.get(out, [])
        if len(after) == 1 and after[0].op_type == "Add" and any(i in inits for i in after[0].input):
            add = after[0]
            inputs.append(next(i for i in add.input if i in inits))
            out = add.output[0]
            drop.add(id(add))
        replace[id(n)] = helper.make_node("MatMulIntegerToFloat", inputs, [out], name=n.name + "_int8", domain="com.microsoft")
    for n in g.node:
        if n.op_type != "Add" or "residual" not in n.output[0]:
            continue
        after = users.get(n.output[0], [])
        if len(after) != 1 or after[0].op_type != "LayerNormalization":
            continue
        ln = after[0]
        eps = next((a.f for a in ln.attribute if a.name == "epsilon"), 1e-5)
        replace[id(n)] = helper.make_node(
            "SkipLayerNormalization", [n.input[0], n.input[1], ln.input[1], ln.input[2]], [ln.output[0]],
            name=n.name + "_skipln", domain="com.microsoft", epsilon=eps)
        drop.add(id(ln))
    for t in g.node:
        # mopt's tanh GELU (`*.gelu.tanh`: Tanh -> Add(1) -> Mul(x) -> Mul(0.5)) as one FastGelu.
        if t.op_type != "Tanh" or ".gelu.tanh" not in t.output[0]:
            continue
        add = (users.get(t.output[0]) or [None])[0]
        mul = add and (users.get(add.output[0]) or [None])[0]
        out = mul and (users.get(mul.output[0]) or [None])[0]
        if not (out and add.op_type == "Add" and mul.op_type == "Mul" and out.op_type == "Mul"):
            continue
        replace[id(out)] = helper.make_node(
            "FastGelu", [mul.input[0]], [out.output[0]], name=t.name + "_fastgelu", domain="com.microsoft")
    mask = None
    has_mask = any(i.name == "attention_mask" for i in g.input)
    for sm in [n for n in g.node if n.op_type == "Softmax" and has_mask]:
        core = attention_core(sm, producer, users, inits, g)
        if core is None:
            continue
        q, k, v, heads, merge = core
        ctx = merge.output[0]
        drop.add(id(merge))
        if mask is None:
            mask = "attention_mask_int32"
            g.node.insert(0, helper.make_node("Cast", ["attention_mask"], [mask], name="mask_to_int32", to=6))
        replace[id(sm)] = helper.make_node(
            "MultiHeadAttention", [q, k, v, "", mask], [ctx], name=sm.name + "_mha", domain="com.microsoft", num_heads=heads)
    nodes = [replace.get(id(n), n) for n in g.node if id(n) not in drop]
    # The DequantizeLinear nodes the integer kernels replaced are dead now.
    needed = {o.name for o in g.output}
    kept = []
    for n in reversed(nodes):
        if any(o in needed for o in n.output):
            kept.append(n)
            needed.update(n.input)
    nodes = kept[::-1]
    del g.node[:]
    g.node.extend(nodes)
    used = [i for i in g.initializer if i.name in needed]
    del g.initializer[:]
    g.initializer.extend(used)
    if not any(o.domain == "com.microsoft" for o in m.opset_import):
        m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(m, dst)
    tmp = dst + ".opt.tmp"
    session(dst, optimized_out=tmp)
    ops = op_counts(onnx.load(tmp))
    import os

    os.remove(tmp)
    return ops


def decode(prefill_path, step_path, prompt, new_tokens):
    """Greedy decoding of a causal LM exported as a prefill graph (`input_ids` -> `logits`,
    `present.{i}.key/value`) and a step graph (the same plus `past_key_values.{i}.key/value`):
    the prompt through the first, then one token at a time through the second, each step's
    last-position logits and the chosen tokens returned with the prompt's and a step's mean
    time (ms; one untimed warm-up pass of both first)."""
    prefill, step = session(prefill_path), session(step_path)
    names = [o.name for o in prefill.get_outputs()]
    presents = [n for n in names if n.startswith("present.")]

    def run_all():
        t0 = time.perf_counter()
        outs = prefill.run(None, {"input_ids": np.asarray([prompt], dtype=np.int64)})
        prompt_ms = (time.perf_counter() - t0) * 1e3
        by = dict(zip(names, outs))
        logits, tokens, steps = [], [], []
        for _ in range(new_tokens):
            last = by["logits"][0, -1].astype(np.float64)
            logits.append(last.tolist())
            tok = int(np.argmax(last))
            tokens.append(tok)
            feed = {"input_ids": np.asarray([[tok]], dtype=np.int64)}
            for n in presents:
                feed["past_key_values." + n[len("present."):]] = by[n]
            t = time.perf_counter()
            outs = step.run(None, feed)
            steps.append((time.perf_counter() - t) * 1e3)
            by = dict(zip([o.name for o in step.get_outputs()], outs))
        return logits, tokens, prompt_ms, steps

    run_all()
    logits, tokens, prompt_ms, steps = run_all()
    return {"tokens": tokens, "logits": logits, "prompt_ms": prompt_ms, "decode_ms": float(np.mean(steps))}


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
        shapes = []
        with open(argv[3] + ".bin", "wb") as raw:
            for feed in feeds:
                arrays = {}
                for k, v in feed.items():
                    dt = np.int64 if "int64" in types[k] else (np.uint8 if "uint8" in types[k] else np.float32)
                    arrays[k] = np.asarray(v, dtype=dt)
                y = np.ascontiguousarray(sess.run(None, arrays)[0], dtype="<f4")
                raw.write(y.tobytes())
                shapes.append(list(y.shape))
        json.dump({"shapes": shapes}, open(argv[3], "w"))
        print(json.dumps({"ok": True, "batches": len(shapes)}))
    elif cmd == "decode":
        print(json.dumps({"ok": True, **decode(argv[1], argv[2], json.loads(argv[3]), int(argv[4]))}))
    elif cmd == "fuse":
        from onnxruntime.transformers import optimizer

        opt = optimizer.optimize_model(argv[1], model_type=argv[2], num_heads=int(argv[3]), hidden_size=int(argv[4]), opt_level=0)
        opt.save_model_to_file(argv[5])
        print(json.dumps({"ok": True, "ops": op_counts(opt.model)}))
    elif cmd == "fuse-qdq":
        print(json.dumps({"ok": True, "ops": fuse_qdq(argv[1], argv[2])}))
    elif cmd == "optimized-ops":
        import onnx

        session(argv[1], optimized_out=argv[2])
        print(json.dumps({"ok": True, "ops": op_counts(onnx.load(argv[2]))}))
    elif cmd == "bench-many":
        spec, warmup, runs = json.load(open(argv[1])), int(argv[2]), int(argv[3])
        print(json.dumps({"ok": True, "latency": bench_many(spec, warmup, runs)}))
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
