"""The ResNet rows of the speed harness on the PyTorch side: the same network (module names as
mopt's, so mopt's weights load by name), its logits checked against mopt's, then a training
step at batch 64 and inference at batch 64 and 1, in PyTorch's fastest CPU layout for
convolutions (channels-last; NCHW is timed beside it)."""

import json

import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvBn(nn.Module):
    def __init__(self, i, o, k, s):
        super().__init__()
        self.conv = nn.Conv2d(i, o, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(o, eps=1e-5, momentum=0.1)

    def forward(self, x):
        return self.bn(self.conv(x))


class Block(nn.Module):
    def __init__(self, i, inner, o, stride, projection):
        super().__init__()
        self.conv1 = ConvBn(i, inner, 3, stride)
        self.conv2 = ConvBn(inner, o, 3, 1)
        self.shortcut = ConvBn(i, o, 1, stride) if projection else None

    def forward(self, x):
        y = self.conv2(F.relu(self.conv1(x)))
        return F.relu(y + (self.shortcut(x) if self.shortcut is not None else x))


class ResNet(nn.Module):
    def __init__(self, widths, blocks, classes=10):
        super().__init__()
        self.stem = ConvBn(1, widths[0], 3, 1)
        stages, inp = [], widths[0]
        for s, w in enumerate(widths):
            row = []
            for b in range(blocks):
                stride = 2 if s > 0 and b == 0 else 1
                row.append(Block(inp, w, w, stride, b == 0 and (stride != 1 or inp != w)))
                inp = w
            stages.append(nn.ModuleList(row))
        self.stages = nn.ModuleList(stages)
        self.classifier = nn.Linear(inp, classes)

    def forward(self, x):
        x = F.relu(self.stem(x))
        for stage in self.stages:
            for block in stage:
                x = block(x)
        return self.classifier(x.mean((2, 3)))


def load_mopt_weights(model, weights):
    """mopt's names: BatchNorm gamma/beta are PyTorch's weight/bias; Linear is [in, out]."""
    state = {}
    for name, a in weights.items():
        t = torch.tensor(a["data"], dtype=torch.float32).reshape(a["shape"])
        name = name.replace(".gamma", ".weight").replace(".beta", ".bias")
        if name == "classifier.weight":
            t = t.t().contiguous()
        state[name] = t
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("num_batches_tracked")]
    if missing or unexpected:
        raise SystemExit(f"ResNet weights do not match: missing {missing}, unexpected {unexpected}")


def batch(i, n):
    k = 28 * 28
    j = torch.arange(n * k, dtype=torch.int64) + i * n * k
    x = ((j * 7919) % 2003).to(torch.float32) / 1001.5 - 1.0
    labels = (torch.arange(n) + i * n) % 10
    return x.reshape(n, 1, 28, 28), labels


def rows(spec_path, results, timed, record):
    spec = json.load(open(spec_path))
    n, warmup, steps = spec["batch"], spec["warmup"], spec["steps"]
    fwd = spec["forward_flops"]
    for layout, fmt in [("", torch.channels_last), ("_nchw", torch.contiguous_format)]:
        torch.manual_seed(0)
        model = ResNet(spec["widths"], spec["blocks"])
        load_mopt_weights(model, spec["weights"])
        model = model.to(memory_format=fmt)
        if not layout:
            model.eval()
            with torch.no_grad():
                got = model(batch(0, n)[0].to(memory_format=fmt)).flatten()
            err = (got - torch.tensor(spec["reference_logits"])).abs().max().item()
            print(f"  logits vs mopt (resnet): max |diff| {err:.2e}", flush=True)
            if err > 1e-3:
                raise SystemExit(f"resnet: PyTorch and mopt disagree ({err}); not the same model")
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"])
        data = [batch(i, n) for i in range(warmup + steps)]
        data = [(x.to(memory_format=fmt), y) for x, y in data]

        def one(i):
            x, y = data[i]
            loss = F.cross_entropy(model(x), y)
            loss.item()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip"])
            opt.step()

        record(results, f"resnet_step_b64{layout}", timed(warmup, steps, one), n, 3 * fwd * n)
        model.eval()
        for name, b, runs in [("resnet_infer_b64", n, 10), ("resnet_infer_b1", 1, 50)]:
            x = batch(1, b)[0].to(memory_format=fmt)
            with torch.no_grad():
                ms = timed(3, runs, lambda _: model(x))
            record(results, f"{name}{layout}", ms, b, fwd * b)
