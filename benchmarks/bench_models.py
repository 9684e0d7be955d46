#!/usr/bin/env python3
"""Kiln and ONNX Runtime side by side on the model zoo (tests/models/model_zoo.py).

For every model and thread count (default 1 and 2): Kiln via `kiln bench --json`
(compile, warm-up, median of --runs), ONNX Runtime (ORT_ENABLE_ALL,
intra_op_num_threads = N, inter_op_num_threads = 1) and PyTorch eager (the torch module
the ONNX file comes from, torch.set_num_threads(N), inference_mode) on the same fixed
inputs, median of --runs after --warmup runs. Prints a Markdown table with the ratio kiln/ORT per
model and the geometric mean of the ratios (below 1: Kiln is faster).

    bench_models.py [--kiln BUILD/bin/kiln] [--models a,b] [--threads 1,2]
                    [--runs 20] [--warmup 3] [--cache-dir DIR] [--ort-only] [--json FILE]

The export cache is the one the model tests use (build/models by default). Both sides
get the same inputs: model_zoo.make_inputs, saved as .npy for `kiln bench --input`
(GPT-2 at --gpt2-seq tokens, 128 by default).
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "models"))
import model_zoo  # noqa: E402
from export_models import ensure_exported  # noqa: E402

DEFAULT_KILN = os.path.join(model_zoo.REPO_ROOT, "build", "bin", "kiln")


def bench_ort(path, feeds, threads, runs, warmup):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    start = time.perf_counter()
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    compile_s = time.perf_counter() - start
    for _ in range(warmup):
        sess.run(None, feeds)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1000)
    return {"compile_s": compile_s, "median_ms": statistics.median(times),
            "min_ms": min(times), "p10_ms": float(np.percentile(times, 10)),
            "p90_ms": float(np.percentile(times, 90))}


def bench_torch(spec, feeds, threads, runs, warmup):
    """PyTorch eager (the model the ONNX file was exported from), inference mode."""
    import torch
    torch.set_num_threads(threads)
    model = model_zoo._build_torch_model(spec)
    args = [torch.from_numpy(v) for v in feeds.values()]
    with torch.inference_mode():
        for _ in range(warmup):
            model(*args)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            model(*args)
            times.append((time.perf_counter() - t0) * 1000)
    return {"median_ms": statistics.median(times), "min_ms": min(times)}


def bench_kiln(kiln, path, feeds, threads, runs, warmup, work, extra=()):
    cmd = [kiln, "bench", path, "--json", "--threads", str(threads), "--runs", str(runs),
           "--warmup", str(warmup), *extra]
    for name, value in feeds.items():
        npy = os.path.join(work, f"{os.path.basename(path)}.{name}.npy")
        np.save(npy, value)
        cmd += ["--input", f"{name}={npy}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip() or f"kiln bench exited with {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kiln", default=DEFAULT_KILN)
    parser.add_argument("--models", default=None, help="comma-separated (default: all)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--gpt2-seq", type=int, default=128, help="GPT-2 sequence length")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--ort-only", action="store_true", help="time ONNX Runtime only")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch eager column")
    parser.add_argument("--json", default=None, help="also write all results to this file")
    args = parser.parse_args()

    names = args.models.split(",") if args.models else [m.name for m in model_zoo.MODELS]
    unknown = [n for n in names if n not in model_zoo.MODELS_BY_NAME]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {list(model_zoo.MODELS_BY_NAME)}")
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be >= 1 and --warmup >= 0")
    threads_list = [int(t) for t in args.threads.split(",")]
    if not args.ort_only and not os.access(args.kiln, os.X_OK):
        parser.error(f"kiln CLI not found at {args.kiln} (build it, pass --kiln, or --ort-only)")
    work = os.path.join(model_zoo.cache_dir(args.cache_dir), "bench_inputs")
    os.makedirs(work, exist_ok=True)

    rows, results = [], []
    for name in names:
        spec = model_zoo.MODELS_BY_NAME[name]
        path = ensure_exported(spec, args.cache_dir)
        seq = args.gpt2_seq if spec.kind == "gpt2" else None
        feeds = model_zoo.make_inputs(spec, seq)
        for threads in threads_list:
            ort_r = bench_ort(path, feeds, threads, args.runs, args.warmup)
            kiln_r, error = None, ""
            if not args.ort_only:
                try:
                    kiln_r = bench_kiln(args.kiln, path, feeds, threads, args.runs, args.warmup, work)
                except (RuntimeError, ValueError) as exc:
                    error = str(exc).splitlines()[-1][:120]
            torch_r = None if args.no_torch else bench_torch(spec, feeds, threads, args.runs, args.warmup)
            ratio = kiln_r["median_ms"] / ort_r["median_ms"] if kiln_r else None
            torch_ratio = kiln_r["median_ms"] / torch_r["median_ms"] if kiln_r and torch_r else None
            results.append({"model": name, "threads": threads, "ort": ort_r, "kiln": kiln_r,
                            "torch": torch_r, "ratio": ratio, "torch_ratio": torch_ratio, "error": error})
            label = name + (f" (seq {seq})" if seq else "")
            kiln_cell = (f"{kiln_r['median_ms']:.2f}" if kiln_r else ("error" if error else "-"))
            compile_cell = f"{kiln_r['compile_s']:.1f}" if kiln_r else "-"
            ratio_cell = f"{ratio:.2f}" if ratio else "-"
            torch_cell = f"{torch_r['median_ms']:.2f}" if torch_r else "-"
            torch_ratio_cell = f"{torch_ratio:.2f}" if torch_ratio else "-"
            rows.append(f"| {label} | {threads} | {kiln_cell} | {ort_r['median_ms']:.2f} | "
                        f"{ratio_cell} | {torch_cell} | {torch_ratio_cell} | {compile_cell} |"
                        + (f" {error} |" if error else " |"))
            print(f"{label} threads={threads}: ort {ort_r['median_ms']:.2f} ms, kiln {kiln_cell} ms",
                  file=sys.stderr, flush=True)

    print(f"\nmedian of {args.runs} runs after {args.warmup} warm-up; "
          "ORT_ENABLE_ALL, inter_op 1\n")
    print("| model | threads | kiln ms | ORT ms | kiln/ORT | torch ms | kiln/torch | kiln compile s | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    for threads in threads_list:
        ratios = [r["ratio"] for r in results if r["threads"] == threads and r["ratio"]]
        if ratios:
            geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            print(f"\ngeometric mean kiln/ORT at {threads} thread(s): {geo:.3f} "
                  f"over {len(ratios)} model(s)")
        tratios = [r["torch_ratio"] for r in results if r["threads"] == threads and r["torch_ratio"]]
        if tratios:
            geo = math.exp(sum(math.log(r) for r in tratios) / len(tratios))
            print(f"geometric mean kiln/torch at {threads} thread(s): {geo:.3f} over {len(tratios)} model(s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
