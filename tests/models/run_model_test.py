#!/usr/bin/env python3
"""Runs one zoo model through Kiln and onnxruntime on the same fixed random inputs.

    run_model_test.py MODEL [--cache-dir DIR] [--threads 1,2] [--against ort]

Kiln compiles the model once per thread count (1 and 2) and runs it; GPT-2 runs at
sequence lengths 1, 17 and 128 from ONE compiled model. Each output must satisfy
|kiln - ref| <= atol + rtol * |ref| with the model's tolerances from model_zoo.py
(stated there with a reason). The reference must have spread (std > 1e-3, not all
equal), otherwise the comparison would prove nothing and the test fails.

The reference is onnxruntime with graph optimizations DISABLED: ORT 1.20's Pad+AveragePool
fusion (ENABLE_BASIC and up) changes inception_v3's result by up to 2.0 (count_include_pad
is dropped), so the optimized session is not a trustworthy reference.

`--against ort` runs onnxruntime (ORT_ENABLE_ALL) in place of Kiln: a check of this harness.
Exit code 0 pass, 1 mismatch or no spread, 2 error.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_zoo  # noqa: E402
from export_models import ensure_exported  # noqa: E402


def ort_session(path, threads, optimize):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return lambda feeds: dict(zip(names, sess.run(names, feeds)))


def check_spread(name, ref):
    ref = np.asarray(ref, dtype=np.float64)
    if ref.size == 0 or not np.isfinite(ref).all():
        return f"reference output {name} is empty or not finite"
    if ref.std() <= 1e-3 or (ref == ref.flat[0]).all():
        return f"reference output {name} has no spread (std {ref.std():.3g})"
    return None


def compare(ref, out, atol, rtol):
    """(ok, max_abs, max_rel, worst ratio of error to tolerance, problem)."""
    if out.shape != ref.shape:
        return False, 0, 0, 0, f"shape {out.shape}, expected {ref.shape}"
    if out.dtype != ref.dtype:
        return False, 0, 0, 0, f"dtype {out.dtype}, expected {ref.dtype}"
    r = ref.astype(np.float64)
    o = out.astype(np.float64)
    err = np.abs(o - r)
    if not np.isfinite(o).all():
        return False, float("inf"), float("inf"), float("inf"), "non-finite values in output"
    tol = atol + rtol * np.abs(r)
    nz = np.abs(r) > 0
    max_rel = float((err[nz] / np.abs(r[nz])).max()) if nz.any() else 0.0
    worst = float((err / tol).max()) if err.size else 0.0
    return worst <= 1.0, float(err.max() if err.size else 0), max_rel, worst, ""


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=sorted(model_zoo.MODELS_BY_NAME))
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--against", choices=["kiln", "ort"], default="kiln")
    args = parser.parse_args()

    spec = model_zoo.MODELS_BY_NAME[args.model]
    path = ensure_exported(spec, args.cache_dir)
    thread_counts = [int(t) for t in args.threads.split(",")]
    seqs = spec.seq_lengths if spec.kind != "vision" else [None]
    print(f"{spec.name}: {path}")
    print(f"tolerance: atol {spec.atol:g}, rtol {spec.rtol:g} ({spec.reason})")

    reference = ort_session(path, 1, optimize=False)
    feeds = {seq: model_zoo.make_inputs(spec, seq) for seq in seqs}
    refs = {seq: reference(feeds[seq]) for seq in seqs}

    failures = []
    for seq, outs in refs.items():
        for name, ref in outs.items():
            problem = check_spread(name, ref)
            if problem:
                failures.append(f"seq {seq}: {problem}")
                print(f"FAIL {problem}")

    for threads in thread_counts:
        start = time.time()
        if args.against == "kiln":
            import kiln
            compiled = kiln.compile(path, threads=threads)
            run = compiled.run
        else:
            run = ort_session(path, threads, optimize=True)
        compile_s = time.time() - start
        for seq in seqs:
            start = time.time()
            outs = run(feeds[seq])
            run_ms = (time.time() - start) * 1000
            for name, ref in refs[seq].items():
                label = f"threads={threads}" + (f" seq={seq}" if seq is not None else "")
                if name not in outs:
                    failures.append(f"{label}: missing output {name}")
                    print(f"FAIL {label} {name}: missing")
                    continue
                ok, max_abs, max_rel, worst, problem = compare(ref, outs[name], spec.atol, spec.rtol)
                status = "ok  " if ok else "FAIL"
                print(f"{status} {label} {name} {tuple(ref.shape)}: max_abs_err {max_abs:.3g} "
                      f"max_rel_err {max_rel:.3g} err/tol {worst:.3g} "
                      f"(compile {compile_s:.1f} s, run {run_ms:.0f} ms) {problem}", flush=True)
                if not ok:
                    failures.append(f"{label} {name}: {problem or f'err/tol {worst:.3g}'}")
    if failures:
        print(f"{spec.name}: FAILED ({len(failures)}): " + "; ".join(failures))
        return 1
    print(f"{spec.name}: passed")
    return 0


if __name__ == "__main__":
    model_zoo.run_main(main)
