#!/usr/bin/env python3
"""Ahead-of-time packages (`kiln compile MODEL -o model.kiln`) against compiling at load time,
with ONNX Runtime in the same run.

Per model: the package's size and how long `kiln compile` took; the time to load it in a fresh
process (kiln.load: map the file, check it, load the kernel library, rebuild the host kernels;
the op registry's one-time set-up included), median of --loads processes, and a second load in
the same process; ONNX Runtime's session creation for comparison; and latency at --threads of
the package, the model compiled in process and ONNX Runtime, median of --runs after --warmup,
on the same inputs (model_zoo.make_inputs). The page cache is warm (the file was just written).
Also the size of libkiln_runtime (the C API without the compiler).

    bench_package.py [--kiln BUILD/bin/kiln] [--models resnet50,mobilenet_v2,bert]
                     [--threads 1] [--runs 20] [--warmup 3] [--loads 5] [--write-doc]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "models"))
import model_zoo  # noqa: E402
from export_models import ensure_exported  # noqa: E402
from report import host_name, write_table  # noqa: E402

DOC = os.path.join(ROOT, "docs", "performance.md")

LOAD_ONE = """
import sys, time
t0 = time.perf_counter()
import kiln
t1 = time.perf_counter()
m = kiln.load(sys.argv[1], threads=1)
t2 = time.perf_counter()
m2 = kiln.load(sys.argv[1], threads=1)
t3 = time.perf_counter()
print((t2 - t1) * 1e3, (t3 - t2) * 1e3)
"""


def median_run_ms(run, runs, warmup):
    for _ in range(warmup):
        run()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "bin", "kiln"))
    ap.add_argument("--models", default="resnet50,mobilenet_v2,bert")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--loads", type=int, default=5)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--write-doc", action="store_true", help="the table into docs/performance.md")
    args = ap.parse_args()

    import kiln
    import onnxruntime as ort

    env = dict(os.environ, KILN_DB=os.environ.get("KILN_DB", "off"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln_bench_package_") as tmp:
        for name in args.models.split(","):
            spec = model_zoo.MODELS_BY_NAME[name]
            path = ensure_exported(spec, args.cache_dir)
            feeds = model_zoo.make_inputs(spec)
            package = os.path.join(tmp, name + ".kiln")
            t0 = time.perf_counter()
            subprocess.run([args.kiln, "compile", path, "-o", package, "--threads", str(args.threads)], check=True,
                           env=env, stdout=subprocess.DEVNULL)
            compile_s = time.perf_counter() - t0
            size_mb = os.path.getsize(package) / 2**20
            cold, warm = [], []
            for _ in range(args.loads):
                out = subprocess.run([sys.executable, "-c", LOAD_ONE, package], check=True, env=env,
                                     capture_output=True, text=True).stdout.split()
                cold.append(float(out[0]))
                warm.append(float(out[1]))
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            so.intra_op_num_threads = args.threads
            so.inter_op_num_threads = 1
            t0 = time.perf_counter()
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            ort_session_ms = (time.perf_counter() - t0) * 1e3

            loaded = kiln.load(package, threads=args.threads)
            compiled = kiln.compile(path, threads=args.threads, db="")
            got, want = loaded.run(feeds), compiled.run(feeds)
            same = all((got[k] == want[k]).all() for k in want)
            pkg_ms = median_run_ms(lambda: loaded.run(feeds), args.runs, args.warmup)
            jit_ms = median_run_ms(lambda: compiled.run(feeds), args.runs, args.warmup)
            ort_ms = median_run_ms(lambda: sess.run(None, feeds), args.runs, args.warmup)
            del loaded, compiled, sess
            row = (f"| {name} | {size_mb:.1f} | {compile_s:.1f} | {statistics.median(cold):.1f} | "
                   f"{statistics.median(warm):.1f} | {ort_session_ms:.0f} | {pkg_ms:.2f} | {jit_ms:.2f} | "
                   f"{ort_ms:.2f} | {pkg_ms / ort_ms:.2f} | {'yes' if same else 'NO'} |")
            print(row, file=sys.stderr, flush=True)
            rows.append(row)

    runtime_lib = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.kiln))), "lib",
                               "libkiln_runtime.so")
    lib_note = (f"libkiln_runtime.so: {os.path.getsize(runtime_lib) / 2**20:.1f} MB (libkiln.so, with the compiler: "
                f"{os.path.getsize(runtime_lib.replace('_runtime', '')) / 2**20:.1f} MB)."
                if os.path.exists(runtime_lib) else "")
    out = [f"Host: {host_name()} ({os.cpu_count()} cores); Kiln {kiln.__version__}, ONNX Runtime {ort.__version__}; "
           f"{args.threads} thread(s); load: median of {args.loads} fresh processes (first load, op registry set-up "
           f"included) and a second load in the same process, page cache warm; latency: median of {args.runs} runs "
           f"after {args.warmup} warm-up. {lib_note}", "",
           "| model | package MB | kiln compile s | load ms (fresh process) | load ms (again) | ORT session ms | "
           "package ms | compiled ms | ORT ms | package/ORT | outputs equal to compiled |",
           "|---" * 11 + "|"]
    out.extend(rows)
    print("\n".join(out))
    if args.write_doc:
        write_table(DOC, "<!-- bench_package: begin -->", "<!-- bench_package: end -->", "\n".join(out))


if __name__ == "__main__":
    main()
