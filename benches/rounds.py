#!/usr/bin/env python3
"""Run the speed harness several times and summarise each row's mopt / PyTorch ratio.

One run of the harness times mopt, then PyTorch, in the same process tree; on a shared
2-core machine either side can land on a slow minute. Each run here is such a pair, so each
ratio is measured side by side, and the summary gives the median ratio over the runs with its
range (min-max), not one run's anecdote.

    python3 benches/rounds.py --runs 5 -- --only resnet
    python3 benches/rounds.py --runs 3 --out benches/results/rounds.json -- --only resnet

Arguments after `--` go to the harness (`cargo bench --profile dev --bench speed -- ...`).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def one_run(harness_args, out):
    cmd = ["cargo", "bench", "--profile", "dev", "--bench", "speed", "--", *harness_args, "--out", str(out)]
    subprocess.run(cmd, check=True)
    return json.loads(Path(out).read_text())


def summarise(runs):
    names = []
    for run in runs:
        for row in run["rows"]:
            if row["name"] not in names:
                names.append(row["name"])
    table = []
    for name in names:
        rows = [r for run in runs for r in run["rows"] if r["name"] == name]
        mopt = [r["mopt_ms"] for r in rows if r.get("mopt_ms") is not None]
        torch = [r["torch_ms"] for r in rows if r.get("torch_ms") is not None]
        ratios = [r["ratio"] for r in rows if r.get("ratio") is not None]
        entry = {"name": name, "runs": len(rows), "mopt_ms": mopt, "torch_ms": torch, "ratios": ratios}
        if ratios:
            entry["ratio_median"] = statistics.median(ratios)
            entry["ratio_min"], entry["ratio_max"] = min(ratios), max(ratios)
        table.append(entry)
    return table


def main():
    argv = sys.argv[1:]
    harness_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, harness_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="harness runs (each: mopt, then PyTorch)")
    p.add_argument("--out", help="write every run and the summary here (JSON)")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            print(f"run {i + 1} of {args.runs}", file=sys.stderr, flush=True)
            runs.append(one_run(harness_args, Path(tmp) / f"run{i}.json"))
    table = summarise(runs)
    med = lambda v: f"{statistics.median(v):.1f}" if v else "-"
    cpu = runs[0].get("cpu", {})
    simd = [f for f in cpu.get("simd", []) if f.startswith(("avx512f", "avx512_bf16", "avx512_vnni", "amx"))]
    print(f"\n{args.runs} runs on {cpu.get('model', '?')} ({cpu.get('gemm_path', '?')} GEMM; {' '.join(simd)}; mopt kernels {cpu.get('kernels_simd', 'widest')}, oneDNN {cpu.get('torch_isa', 'widest')}), "
          f"{runs[0].get('threads', '?')} threads")
    print("| row | mopt ms (median) | PyTorch ms (median) | mopt / PyTorch, median | min-max |")
    print("|---|---|---|---|---|")
    for e in table:
        if "ratio_median" in e:
            spread = f"{e['ratio_min']:.2f}-{e['ratio_max']:.2f}x"
            ratio = f"{e['ratio_median']:.2f}x"
        else:
            spread = ratio = "-"
        print(f"| {e['name']} | {med(e['mopt_ms'])} | {med(e['torch_ms'])} | {ratio} | {spread} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": table, "runs": runs}, indent=1))
        print(f"written: {args.out}")


if __name__ == "__main__":
    main()
