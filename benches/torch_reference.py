#!/usr/bin/env python3
"""PyTorch reference for mopt's speed harness (benches/speed.rs runs it; not run by the tests).

    python3 -m pip install -r benches/requirements.txt
    python3 benches/torch_reference.py --spec target/mopt-bench/spec.json --out torch.json
    python3 benches/torch_reference.py --ops --threads 2 --out torch-ops.json

The spec (written by the Rust side) names the models (HF folders exported by mopt, so the weights
are mopt's), the batches (token ids and labels in mopt's order), the thread count and the
optimiser settings. Before timing, the script checks that transformers' BERT gives mopt's logits
on the first batch, so both sides time the same network.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def timed(warmup, runs, fn):
    for i in range(warmup):
        fn(i)
    out = []
    for i in range(runs):
        t = time.perf_counter()
        fn(warmup + i)
        out.append((time.perf_counter() - t) * 1e3)
    return out


def record(results, name, ms, samples=0, flops=None):
    m = statistics.median(ms)
    r = {"median_ms": m, "runs": len(ms), "min_ms": min(ms)}
    if samples:
        r["samples_per_s"] = samples / (m / 1e3)
    if flops:
        r["gflops"] = flops / (m / 1e3) / 1e9
    results[name] = r
    print(f"  {name:<28} {m:>9.1f} ms", flush=True)


def forward_flops(cfg, batch, seq):
    h, a, f = cfg.hidden_size, cfg.hidden_size, cfg.intermediate_size
    t = batch * seq
    per = 2 * t * (3 * h * a + a * h + 2 * h * f) + 4 * batch * seq * seq * a
    return per * cfg.num_hidden_layers


def collate(batch, pad_id):
    ids = batch["ids"]
    n = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), n), dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
    return input_ids, mask, torch.tensor(batch["labels"], dtype=torch.long)


def load(path):
    from transformers import BertForSequenceClassification

    m = BertForSequenceClassification.from_pretrained(path, attn_implementation="eager")
    return m


def steps(spec, out_path):
    torch.manual_seed(0)
    pad = spec["pad_id"]
    # `device`: "cpu" or "cuda:N" (the GPU script runs both sides on the same GPU).
    dev = torch.device(spec.get("device", "cpu"))
    batches = [tuple(t.to(dev) for t in collate(b, pad)) for b in spec["batches"]]
    warmup, n = spec["warmup"], spec["steps"]
    results = {}
    teacher, student = load(spec["teacher_dir"]).to(dev), load(spec["student_dir"]).to(dev)

    # Same network as mopt: logits on the first batch, eval mode.
    check = {}
    for name, m in [("teacher", teacher), ("student", student)]:
        m.eval()
        ids, mask, _ = batches[0]
        with torch.no_grad():
            got = m(input_ids=ids, attention_mask=mask).logits.flatten().cpu()
        ref = torch.tensor(spec["reference_logits"][name])
        err = (got - ref).abs().max().item()
        check[name] = err
        print(f"  logits vs mopt ({name}): max |diff| {err:.2e}", flush=True)
        if err > 1e-3:
            raise SystemExit(f"{name}: PyTorch and mopt disagree ({err}); not the same model")

    tokens = [b[0].numel() for b in batches[warmup:]]

    def step_flops(cfg, extra=None):
        s = 0.0
        for t in tokens:
            seq = t // 32
            s += 3 * forward_flops(cfg, 32, seq) + (forward_flops(extra, 32, seq) if extra else 0)
        return s / n

    only = spec.get("only")

    def wants(name):
        """`--only NAME` on the mopt side: the rows whose name contains NAME."""
        return only is None or only in name

    def train(model, loss_fn, name, extra=None):
        if not wants(name):
            return
        model = model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"])

        def one(i):
            ids, mask, labels = batches[i]
            loss = loss_fn(model, ids, mask, labels, i)
            loss.item()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip"])
            opt.step()

        ms = timed(warmup, n, one)
        record(results, name, ms, 32, step_flops(model.config, extra))

    def ce(model, ids, mask, labels, i):
        return F.cross_entropy(model(input_ids=ids, attention_mask=mask).logits, labels)

    import copy

    train(copy.deepcopy(teacher), ce, "teacher_step")
    if "teacher_step" in results:
        results["teacher_step"]["peak_rss_mb"] = peak_rss_mb()
    train(copy.deepcopy(student), ce, "student_step")
    # The same step under CPU autocast (PyTorch's own mixed precision: bf16, and fp16 with its
    # GradScaler), beside mopt's student_step_bf16 / _fp16.
    for name, dtype in [("student_step_bf16", torch.bfloat16), ("student_step_fp16", torch.float16)]:
        if not wants(name):
            continue
        model = copy.deepcopy(student).train()
        opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"])
        scaler = torch.amp.GradScaler(dev.type, enabled=dtype == torch.float16)

        def one(i, model=model, opt=opt, scaler=scaler, dtype=dtype):
            ids, mask, labels = batches[i]
            with torch.autocast(dev.type, dtype=dtype):
                logits = model(input_ids=ids, attention_mask=mask).logits
            loss = F.cross_entropy(logits.float(), labels)
            loss.item()
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip"])
            scaler.step(opt)
            scaler.update()

        try:
            ms = timed(warmup, n, one)
            record(results, name, ms, 32, step_flops(model.config))
        except RuntimeError as e:  # an op without a CPU kernel in this dtype
            print(f"{name}: {e}", file=sys.stderr)

    d = spec["distill"]
    alpha, temp, pairs = d["alpha"], d["temperature"], d["hidden_pairs"]
    teacher.eval()

    def teacher_out(ids, mask):
        with torch.no_grad():
            o = teacher(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        return o.logits, [o.hidden_states[t] for _, t in pairs]

    cache = [teacher_out(b[0], b[1]) for b in batches] if wants("distill_step_cached") else []

    def distill(live):
        def loss(model, ids, mask, labels, i):
            o = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            t_logits, t_hidden = teacher_out(ids, mask) if live else cache[i]
            hard = F.cross_entropy(o.logits, labels)
            soft = F.kl_div(
                F.log_softmax(o.logits / temp, 1), F.log_softmax(t_logits / temp, 1),
                reduction="batchmean", log_target=True) * temp * temp
            total = alpha * hard + (1 - alpha) * soft
            m = mask.unsqueeze(-1).float()
            for (s, _), th in zip(pairs, t_hidden):
                diff = (o.hidden_states[s] - th) ** 2 * m
                total = total + diff.sum() / (m.sum() * th.shape[-1])
            return total
        return loss

    train(copy.deepcopy(student), distill(False), "distill_step_cached")
    train(copy.deepcopy(student), distill(True), "distill_step_live", extra=teacher.config)

    ids_all = [x for b in spec["batches"] for x in b["ids"] if len(x) >= 8]
    for name, m in [("teacher", teacher), ("student", student)]:
        m.eval()
        for b in (1, 32):
            if not wants(f"{name}_forward_b{b}"):
                continue
            rows = [(x * (64 // len(x) + 1))[:64] for x in ids_all[:b]]
            ids = torch.tensor(rows, dtype=torch.long, device=dev)
            mask = torch.ones_like(ids)
            runs = 60 if b == 1 else 15

            def fwd(_):
                with torch.inference_mode():
                    m(input_ids=ids, attention_mask=mask).logits.cpu().numpy()

            record(results, f"{name}_forward_b{b}", timed(5, runs, fwd), b,
                   forward_flops(m.config, b, 64))
    # The ResNet rows, when mopt's side wrote their spec beside this output.
    resnet_spec = os.path.join(os.path.dirname(out_path), "resnet.json")
    if os.path.exists(resnet_spec):
        import torch_resnet

        torch_resnet.rows(resnet_spec, results, timed, record)
    # The language-model rows (SmolLM2-135M from its GGUF), likewise.
    lm_spec = os.path.join(os.path.dirname(out_path), "lm.json")
    if os.path.exists(lm_spec):
        import torch_lm

        check["lm"] = torch_lm.rows(lm_spec, results, timed, record)
    results_out = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "results": results,
        "logit_check": check,
        "sgemm_2048_gflops": sgemm(spec.get("sgemm_n", 2048)),
    }
    print(f"  sgemm 2048^3: {results_out['sgemm_2048_gflops']:.1f} GFLOP/s")
    with open(out_path, "w") as f:
        json.dump(results_out, f, indent=1)


def peak_rss_mb():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def sgemm(n):
    a, b = torch.rand(n, n), torch.rand(n, n)
    ms = timed(2, 7, lambda _: a @ b)
    return 2 * n**3 / (statistics.median(ms) / 1e3) / 1e9


def ops(out_path):
    B, S, H, HEADS, D, FF, V = 32, 64, 384, 12, 32, 1536, 30522
    runs = 15
    rows = []

    def push(name, fwd, fb):
        f, b = statistics.median(fwd), statistics.median(fb)
        rows.append({"name": name, "fwd_ms": f, "fwd_bwd_ms": b})
        print(f"  {name:<34} fwd {f:>8.2f} ms   fwd+bwd {b:>8.2f} ms", flush=True)

    def op(name, shapes, fn, make=torch.randn):
        xs = [make(*s) for s in shapes]

        def fwd(_):
            with torch.no_grad():
                fn(*xs).sum().item()

        leaves = [x.clone().requires_grad_(x.is_floating_point()) for x in xs]

        def fb(_):
            for x in leaves:
                x.grad = None
            fn(*leaves).sum().backward()

        push(name, timed(3, runs, fwd), timed(3, runs, fb))

    t = B * S
    for name, k, n in [("matmul 2048x384 @ 384x384", H, H), ("matmul 2048x384 @ 384x1536", H, FF),
                       ("matmul 2048x1536 @ 1536x384", FF, H)]:
        op(name, [(t, k), (k, n)], lambda x, w: x @ w)
    op("linear as batched matmul [32,64,384] @ 384x1536", [(B, S, H), (H, FF)], lambda x, w: x @ w)
    op("dropout 0.1 [32,64,384]", [(B, S, H)], lambda x: F.dropout(x, 0.1, training=True))
    op("dropout 0.1 [32,12,64,64]", [(B, HEADS, S, S)], lambda x: F.dropout(x, 0.1, training=True))
    op("gelu [32,64,1536]", [(B, S, FF)], F.gelu)
    op("softmax [32,12,64,64]", [(B, HEADS, S, S)], lambda x: torch.softmax(x, 3))
    ln = torch.nn.LayerNorm(H, eps=1e-12)
    op("layer_norm [32,64,384] (+gamma,beta)", [(B, S, H)], ln)
    table = (torch.randn(V, H) * 0.02)
    ids = torch.randint(0, V, (B, S))
    emb_leaf = table.clone().requires_grad_(True)

    def emb_fwd(_):
        with torch.no_grad():
            F.embedding(ids, table).sum().item()

    def emb_fb(_):
        emb_leaf.grad = None
        F.embedding(ids, emb_leaf).sum().backward()

    push("embedding 30522x384, ids [32,64]", timed(3, runs, emb_fwd), timed(3, runs, emb_fb))
    op("batched QK^T [32,12,64,32]x[32,12,32,64]", [(B, HEADS, S, D), (B, HEADS, D, S)],
       lambda q, k: q @ k)

    def core(q, k, v):
        split = lambda x: x.reshape(B, S, HEADS, D).transpose(1, 2)
        p = torch.softmax(split(q) @ split(k).transpose(2, 3) / D**0.5, 3)
        return (p @ split(v)).transpose(1, 2).reshape(B, S, H)

    op("attention core (split, QK, softmax, PV, merge)", [(B, S, H)] * 3, core)

    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=V, hidden_size=H, num_hidden_layers=6, num_attention_heads=HEADS,
                     intermediate_size=FF)
    model = BertForSequenceClassification(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    x = torch.randint(0, V, (B, S))
    clip_ms, step_ms = [], []
    for _ in range(8):
        opt.zero_grad(set_to_none=True)
        model(input_ids=x).logits.sum().backward()
        t0 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        clip_ms.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        opt.step()
        step_ms.append((time.perf_counter() - t0) * 1e3)
    push("clip_global_norm (22.7M params)", clip_ms, clip_ms)
    push("AdamW step (22.7M params)", step_ms, step_ms)
    with open(out_path, "w") as f:
        json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "ops": rows}, f,
                  indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--spec")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ops", action="store_true")
    ap.add_argument("--threads", type=int)
    a = ap.parse_args()
    spec = json.load(open(a.spec)) if a.spec else {}
    threads = a.threads or spec.get("threads", 2)
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    print(f"PyTorch {torch.__version__}, {threads} threads", flush=True)
    if a.ops:
        ops(a.out)
    else:
        steps(spec, a.out)


if __name__ == "__main__":
    main()
