#!/usr/bin/env python3
"""Kiln and ONNX Runtime side by side on the model zoo (tests/models/model_zoo.py).

For every model and thread count (default 1 and 2): Kiln via `kiln bench --json`
(compile, warm-up, median of --runs), ONNX Runtime (ORT_ENABLE_ALL,
intra_op_num_threads = N, inter_op_num_threads = 1) and, with --torch, PyTorch eager (the
torch module the ONNX file comes from, torch.set_num_threads(N), inference_mode) on the same
fixed inputs, median of --runs after --warmup runs. Prints a Markdown table with the ratio
kiln/ORT per model, each model's GFLOP per run and the share of this machine's FP32 peak
(measured by kernel_bench --peak-only at the same thread count, before and after the models,
the higher kept) that Kiln and ORT reach, and
the geometric mean of the ratios (below 1: Kiln is faster).

With --rounds R (default 1) each model and thread count is timed R times, ORT and Kiln
alternating, and each side keeps its fastest round's median: on a machine whose speed drifts
over tens of seconds (a shared VM), one block of runs per side can land in a slow phase for
one and a fast phase for the other, and a single round then mismeasures the ratio by up to 40%.

    bench_models.py [--kiln BUILD/bin/kiln] [--models a,b] [--threads 1,2] [--rounds R]
                    [--runs 20] [--warmup 3] [--cache-dir DIR] [--ort-only] [--torch] [--json FILE]
                    [--write-doc]   (the table into docs/performance.md)

The export cache is the one the model tests use (build/models by default). Both sides
get the same inputs: model_zoo.make_inputs, saved as .npy for `kiln bench --input`
(GPT-2 at --gpt2-seq tokens, 128 by default).
"""

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "models"))
import model_zoo  # noqa: E402
from report import host_name, write_table  # noqa: E402

DOC = os.path.join(os.path.dirname(HERE), "docs", "performance.md")


def kiln_version():
    """The Kiln that ran: the version CMakeLists.txt declares and the commit of the tree."""
    root = os.path.dirname(HERE)
    m = re.search(r"project\(kiln VERSION ([0-9.]+)", open(os.path.join(root, "CMakeLists.txt")).read())
    commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return (m.group(1) if m else "?") + (f" ({commit})" if commit else "")


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


def model_gflop(path, feeds):
    """Arithmetic of one run: 2 x multiply-adds of Conv, ConvTranspose, MatMul, Gemm
    and LSTM/GRU/RNN, from symbolic shape inference with the inputs' real shapes."""
    import onnx
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    model = onnx.load(path)
    for inp in model.graph.input:
        if inp.name in feeds:
            dims = inp.type.tensor_type.shape.dim
            for d, v in zip(dims, feeds[inp.name].shape):
                d.ClearField("dim_param")
                d.dim_value = int(v)
    # ORT's symbolic inference follows shape arithmetic (Shape -> Gather -> Reshape)
    # that onnx.shape_inference leaves unknown.
    model = SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    shapes = {}
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    for init in model.graph.initializer:
        shapes[init.name] = list(init.dims)
    macs = 0
    for n in model.graph.node:
        ins = [shapes.get(i) for i in n.input]
        outs = [shapes.get(o) for o in n.output]
        if not outs or outs[0] is None or None in outs[0]:
            continue
        out_elems = math.prod(outs[0])
        if n.op_type in ("Conv", "ConvTranspose") and ins[1]:
            w = ins[1]
            macs += (out_elems if n.op_type == "Conv" else math.prod(ins[0])) * math.prod(w[1:])
        elif n.op_type in ("MatMul", "Gemm") and ins[0] and None not in ins[0]:
            trans_a = any(a.name == "transA" and a.i for a in n.attribute)
            k = ins[0][-2] if (n.op_type == "Gemm" and trans_a) else ins[0][-1]
            macs += out_elems * k
        elif n.op_type in ("LSTM", "GRU", "RNN") and ins[0] and ins[1] and ins[2]:
            gates = ins[1][1]            # num_directions x gates*H x I
            seq, batch = ins[0][0], ins[0][1]
            macs += ins[1][0] * seq * batch * gates * (ins[1][2] + ins[2][2])
    return 2.0 * macs / 1e9


def measured_peak(kiln, threads):
    """This machine's FP32 peak at `threads`, measured by kernel_bench (None when absent)."""
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(kiln))), "benchmarks", "kernel_bench")
    if not os.access(bench, os.X_OK):
        return None
    out = subprocess.run([bench, "--peak-only", "--json", "--threads", str(threads)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["peak_gflops"]


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
    parser.add_argument("--rounds", type=int, default=1,
                        help="time each side this many times, alternating; keep each side's fastest median")
    parser.add_argument("--gpt2-seq", type=int, default=128, help="GPT-2 sequence length")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--ort-only", action="store_true", help="time ONNX Runtime only")
    parser.add_argument("--torch", action="store_true",
                        help="also time PyTorch eager (Debian's torch 1.13 build: erratic, not averaged)")
    parser.add_argument("--no-torch", action="store_true", help="(the default) skip PyTorch eager")
    parser.add_argument("--json", default=None, help="also write all results to this file")
    parser.add_argument("--write-doc", action="store_true", help="replace the table in docs/performance.md")
    args = parser.parse_args()

    names = args.models.split(",") if args.models else [m.name for m in model_zoo.MODELS]
    unknown = [n for n in names if n not in model_zoo.MODELS_BY_NAME]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {list(model_zoo.MODELS_BY_NAME)}")
    if args.runs < 1 or args.warmup < 0 or args.rounds < 1:
        parser.error("--runs and --rounds must be >= 1 and --warmup >= 0")
    threads_list = [int(t) for t in args.threads.split(",")]
    if not args.ort_only and not os.access(args.kiln, os.X_OK):
        parser.error(f"kiln CLI not found at {args.kiln} (build it, pass --kiln, or --ort-only)")
    work = os.path.join(model_zoo.cache_dir(args.cache_dir), "bench_inputs")
    os.makedirs(work, exist_ok=True)

    # The peak is measured before and after the models, and the higher kept:
    # on a shared host one short measurement can fall in a slow phase (81.6
    # GFLOP/s at 1 thread in one run, 114 in the next).
    peaks = {t: (None if args.ort_only else measured_peak(args.kiln, t)) for t in threads_list}
    rows, results = [], []
    for name in names:
        spec = model_zoo.MODELS_BY_NAME[name]
        path = ensure_exported(spec, args.cache_dir)
        seq = args.gpt2_seq if spec.kind == "gpt2" else None
        feeds = model_zoo.make_inputs(spec, seq)
        gflop = model_gflop(path, feeds)
        for threads in threads_list:
            ort_r, kiln_r, error = None, None, ""
            for _ in range(args.rounds):
                o = bench_ort(path, feeds, threads, args.runs, args.warmup)
                if ort_r is None or o["median_ms"] < ort_r["median_ms"]:
                    ort_r = o
                if args.ort_only or error:
                    continue
                try:
                    k = bench_kiln(args.kiln, path, feeds, threads, args.runs, args.warmup, work)
                    if kiln_r is None or k["median_ms"] < kiln_r["median_ms"]:
                        kiln_r = k
                except (RuntimeError, ValueError) as exc:
                    error = str(exc).splitlines()[-1][:120]
                    kiln_r = None
            torch_r = bench_torch(spec, feeds, threads, args.runs, args.warmup) if args.torch else None
            ratio = kiln_r["median_ms"] / ort_r["median_ms"] if kiln_r else None
            torch_ratio = kiln_r["median_ms"] / torch_r["median_ms"] if kiln_r and torch_r else None
            kiln_gflops = gflop / (kiln_r["median_ms"] * 1e-3) if kiln_r else None
            ort_gflops = gflop / (ort_r["median_ms"] * 1e-3)
            results.append({"model": name, "threads": threads, "ort": ort_r, "kiln": kiln_r,
                            "torch": torch_r, "ratio": ratio, "torch_ratio": torch_ratio, "error": error,
                            "gflop": gflop, "kiln_gflops": kiln_gflops, "ort_gflops": ort_gflops,
                            "peak_gflops": None})
            label = name + (f" (seq {seq})" if seq else "")
            kiln_cell = (f"{kiln_r['median_ms']:.2f}" if kiln_r else ("error" if error else "-"))
            compile_cell = f"{kiln_r['compile_s']:.1f}" if kiln_r else "-"
            ratio_cell = f"{ratio:.2f}" if ratio else "-"
            torch_cell = f"{torch_r['median_ms']:.2f}" if torch_r else "-"
            torch_ratio_cell = f"{torch_ratio:.2f}" if torch_ratio else "-"
            gf_cell = f"{kiln_gflops:.1f}" if kiln_gflops else "-"
            torch_cols = f" {torch_cell} | {torch_ratio_cell} |" if args.torch else ""
            # The share-of-peak cells are filled in once the peak is final.
            rows.append((threads, kiln_gflops, ort_gflops,
                         f"| {label} | {threads} | {kiln_cell} | {ort_r['median_ms']:.2f} | "
                         f"{ratio_cell} | {gflop:.2f} | {gf_cell} |",
                         f"{torch_cols} {compile_cell} |" + (f" {error} |" if error else " |")))
            print(f"{label} threads={threads}: ort {ort_r['median_ms']:.2f} ms, kiln {kiln_cell} ms",
                  file=sys.stderr, flush=True)

    for t in threads_list:
        again = None if args.ort_only else measured_peak(args.kiln, t)
        if again and (peaks[t] is None or again > peaks[t]):
            peaks[t] = again
        if peaks[t]:
            print(f"measured peak at {t} thread(s): {peaks[t]:.1f} GFLOP/s (kernel_bench --peak-only, "
                  "the higher of before and after the models)", file=sys.stderr)
    for r in results:
        r["peak_gflops"] = peaks.get(r["threads"])
    formatted = []
    for threads, kiln_gflops, ort_gflops, head, tail in rows:
        peak = peaks.get(threads)
        share_cell = f"{100 * kiln_gflops / peak:.0f}%" if kiln_gflops and peak else "-"
        ort_share = f"{100 * ort_gflops / peak:.0f}%" if peak else "-"
        formatted.append(f"{head} {share_cell} | {ort_share} |{tail}")
    rows = formatted

    rounds = f"; fastest of {args.rounds} alternating rounds per side" if args.rounds > 1 else ""
    import onnxruntime  # noqa: E402 (bench_ort imported it already)
    out = [f"Host: {host_name()} ({os.cpu_count()} cores); Kiln {kiln_version()}, ONNX Runtime "
           f"{onnxruntime.__version__}; median of {args.runs} runs after {args.warmup} warm-up{rounds}; "
           "ORT_ENABLE_ALL, inter_op 1.", "",
           "GFLOP: multiply-adds x 2 of Conv/MatMul/Gemm/RNN per run; share: Kiln's (and ORT's) GFLOP/s "
           "over the peak kernel_bench measured at that thread count"
           + "".join(f" ({peaks[t]:.1f} GFLOP/s at {t})" for t in threads_list if peaks.get(t)) + ".", ""]
    torch_head = " torch ms | kiln/torch |" if args.torch else ""
    out.append(f"| model | threads | kiln ms | ORT ms | kiln/ORT | GFLOP | kiln GFLOP/s | kiln share of peak | "
               f"ORT share of peak |{torch_head} kiln compile s | note |")
    out.append("|---" * (11 + (2 if args.torch else 0)) + "|")
    out.extend(rows)
    for threads in threads_list:
        ratios = [r["ratio"] for r in results if r["threads"] == threads and r["ratio"]]
        if ratios:
            geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            out.append("")
            out.append(f"Geometric mean kiln/ORT at {threads} thread(s): {geo:.3f} over {len(ratios)} model(s).")
    print("\n" + "\n".join(out))
    if args.write_doc:
        write_table(DOC, "<!-- bench_models: begin -->", "<!-- bench_models: end -->", "\n".join(out))
        print(f"wrote the table into {DOC}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
