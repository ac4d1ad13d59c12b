"""The language-model rows of the speed harness on the PyTorch side: SmolLM2-135M-Instruct loaded
with transformers from the same GGUF file as mopt (`gguf_file=`, every weight dequantized to f32;
this needs the `gguf` package), with attention on `F.scaled_dot_product_attention` ("sdpa",
PyTorch's fastest attention on the CPU), no KV cache. Its logits are checked against the sample of
mopt's in `lm.json` (window 0 at batch 1), then the rows mopt timed are timed with the same batch,
warm-up and runs: the training step (forward, next-token cross-entropy at every position,
backward, global-norm clipping, AdamW) and inference under `torch.inference_mode()`."""

import json
import os

import torch
import torch.nn.functional as F


def windows(batch, seq, vocab, dev):
    """mopt's `Checkpoint::bench_batch` for Llama: ids `(i·7919 + 13) mod vocab` over the
    flattened batch, target `i` the id `i + 1`."""
    ids = (torch.arange(batch * seq + 1, dtype=torch.int64) * 7919 + 13) % vocab
    return ids[:-1].reshape(batch, seq).to(dev), ids[1:].to(dev)


def load(path, dev):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32,
        attn_implementation="sdpa")
    return model.to(dev)


def check(model, spec, dev):
    """Max |diff| of window 0's logits (the rows and columns mopt kept) against mopt's; exits
    when they differ by more than 1e-3 (not the same model)."""
    ref = spec["reference"]
    ids, _ = windows(1, spec["seq"], spec["vocab"], dev)
    model.eval()
    with torch.inference_mode():
        logits = model(input_ids=ids, use_cache=False).logits[0].cpu()
    got = logits[ref["rows"]][:, :: ref["col_stride"]]
    err = (got - torch.tensor(ref["logits"])).abs().max().item()
    print(f"  logits vs mopt (lm): max |diff| {err:.2e}", flush=True)
    if err > 1e-3:
        raise SystemExit(f"lm: PyTorch and mopt disagree ({err}); not the same model")
    return err


def step_ms(model, spec, row, dev, timed):
    """Milliseconds of each timed training step at the row's batch (the same batch every step)."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], betas=tuple(spec["betas"]),
                            eps=spec["eps"], weight_decay=spec["weight_decay"])
    ids, targets = windows(row["batch"], spec["seq"], spec["vocab"], dev)

    def one(_):
        logits = model(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)
        loss.item()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip"])
        opt.step()

    return timed(row["warmup"], row["runs"], one)


def rows(spec_path, results, timed, record):
    """Times the rows of `lm.json` into `results`; returns the logits' max |diff|."""
    spec = json.load(open(spec_path))
    dev = torch.device(spec.get("device", "cpu"))
    model = load(spec["gguf"], dev)
    err = check(model, spec, dev)
    for name, row in spec["rows"].items():
        if name.startswith("lm_forward"):
            ids, _ = windows(row["batch"], spec["seq"], spec["vocab"], dev)

            def fwd(_, ids=ids):
                with torch.inference_mode():
                    model(input_ids=ids, use_cache=False).logits.cpu()

            ms = timed(row["warmup"], row["runs"], fwd)
            record(results, name, ms, row["batch"], spec["forward_flops"] * row["batch"])
    # The step last: it changes the weights.
    for name, row in spec["rows"].items():
        if name.startswith("lm_step"):
            ms = step_ms(model, spec, row, dev, timed)
            record(results, name, ms, row["batch"], 3 * spec["forward_flops"] * row["batch"])
    return err
