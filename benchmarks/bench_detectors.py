#!/usr/bin/env python3
"""Detectors side by side with ONNX Runtime (issue 8, item 5): latency per input size and
peak resident memory, each engine in its own process (so the memory is its own), the two
engines alternating over rounds. Models: tests/models/detectors.py (conditioned random
weights; run tests/models/run_detector_test.py for the agreement check).

    bench_detectors.py [--threads 1] [--rounds 2] [--runs 10] [--cache-dir DIR] [--json F]
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "models"))
import detectors  # noqa: E402
import model_zoo  # noqa: E402


def peak_rss_mb():
    """This process's peak resident set: VmHWM of its own address space. Not ru_maxrss, which
    Linux carries over from the parent at fork (a parent that just exported a detector with
    torch gave both runtimes its 840 MB)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(engine, path, threads, runs):
    """Runs in a fresh process: median ms per size, then peak RSS in MB."""
    if engine == "ort":
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        run = lambda x: sess.run(None, {"images": x})  # noqa: E731
    else:
        import kiln
        model = kiln.compile(path, threads=threads)
        run = lambda x: model.run({"images": x})  # noqa: E731
    result = {}
    for h, w in detectors.SIZES:
        x = detectors.image(h, w)
        for _ in range(2):
            run(x)
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            run(x)
            times.append((time.perf_counter() - t) * 1e3)
        result[f"{h}x{w}"] = statistics.median(times)
    result["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.threads, args.runs)
        return 0
    rows = []
    for name in detectors.DETECTORS:
        path = detectors.ensure_exported(name, model_zoo.cache_dir(args.cache_dir))
        per = {"ort": [], "kiln": []}
        for r in range(args.rounds):
            for engine in (("ort", "kiln") if r % 2 == 0 else ("kiln", "ort")):
                out = subprocess.run([sys.executable, __file__, "--child", engine, path, "--threads", str(args.threads),
                                      "--runs", str(args.runs)], capture_output=True, text=True, check=True)
                per[engine].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for size in [f"{h}x{w}" for h, w in detectors.SIZES]:
            k = min(p[size] for p in per["kiln"])
            o = min(p[size] for p in per["ort"])
            rows.append({"model": name, "size": size, "kiln_ms": k, "ort_ms": o, "ratio": k / o})
        k_mem = max(p["peak_rss_mb"] for p in per["kiln"])
        o_mem = max(p["peak_rss_mb"] for p in per["ort"])
        rows.append({"model": name, "size": "peak RSS MB", "kiln_ms": k_mem, "ort_ms": o_mem, "ratio": k_mem / o_mem})
    print(f"| model | size | kiln | ORT 1.31.1 | kiln/ORT |  ({args.threads} thread(s), best of {args.rounds} "
          f"rounds of the median of {args.runs} runs)")
    print("|---|---|---|---|---|")
    for r in rows:
        unit = "" if r["size"].startswith("peak") else " ms"
        print(f"| {r['model']} | {r['size']} | {r['kiln_ms']:.1f}{unit} | {r['ort_ms']:.1f}{unit} | {r['ratio']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
