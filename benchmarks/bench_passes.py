#!/usr/bin/env python3
"""The graph passes' measured effect on the model zoo (tests/models/model_zoo.py).

For every model: nodes as imported and after the default pipeline, compiled kernels,
compile time and latency, with the default pipeline and with no graph passes
(`kiln bench --passes none`: shape inference only), measured side by side in one run.
The two configurations alternate (default, none, none, default) and each figure is the
mean of its two medians, so that drift in the machine's speed hits both alike.

    bench_passes.py [--kiln BUILD/bin/kiln] [--models a,b] [--threads 1]
                    [--runs 10] [--warmup 2] [--cache-dir DIR] [--json FILE]

Prints a Markdown table (the one in docs/passes.md).
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "models"))
sys.path.insert(0, HERE)
import model_zoo  # noqa: E402
from bench_models import bench_kiln, DEFAULT_KILN  # noqa: E402
from export_models import ensure_exported  # noqa: E402


def run(kiln, path, feeds, threads, runs, warmup, work, passes):
    extra = [] if passes is None else ["--passes", passes]
    return bench_kiln(kiln, path, feeds, threads, runs, warmup, work, extra)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default=DEFAULT_KILN)
    ap.add_argument("--models", default=None, help="comma-separated (default: all)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--gpt2-seq", type=int, default=128)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    names = args.models.split(",") if args.models else [m.name for m in model_zoo.MODELS]
    work = os.path.join(model_zoo.cache_dir(args.cache_dir), "bench_inputs")
    os.makedirs(work, exist_ok=True)
    rows, results = [], []
    for name in names:
        spec = model_zoo.MODELS_BY_NAME[name]
        path = ensure_exported(spec, args.cache_dir)
        feeds = model_zoo.make_inputs(spec, args.gpt2_seq if spec.kind == "gpt2" else None)
        got = {"default": [], "none": []}
        for config in ("default", "none", "none", "default"):
            got[config].append(run(args.kiln, path, feeds, args.threads, args.runs, args.warmup, work,
                                   None if config == "default" else "none"))
        d, n = got["default"], got["none"]
        mean = lambda rs, key: sum(r[key] for r in rs) / len(rs)  # noqa: E731
        r = {"model": name, "threads": args.threads,
             "nodes_imported": d[0]["num_nodes_imported"], "nodes_default": d[0]["num_nodes"],
             "kernels_default": d[0]["num_kernels"], "kernels_none": n[0]["num_kernels"],
             "compile_default_s": mean(d, "compile_s"), "compile_none_s": mean(n, "compile_s"),
             "ms_default": mean(d, "median_ms"), "ms_none": mean(n, "median_ms")}
        results.append(r)
        rows.append(f"| {name} | {r['nodes_imported']} | {r['nodes_default']} | {r['kernels_none']} | "
                    f"{r['kernels_default']} | {r['compile_none_s']:.2f} | {r['compile_default_s']:.2f} | "
                    f"{r['ms_none']:.2f} | {r['ms_default']:.2f} | {r['ms_default'] / r['ms_none']:.3f} |")
        print(rows[-1], file=sys.stderr, flush=True)
    print(f"\n{args.threads} thread(s); median of {args.runs} runs after {args.warmup} warm-up, "
          "mean over two alternating rounds\n")
    print("| model | nodes imported | nodes after passes | kernels, no passes | kernels, default | "
          "compile s, no passes | compile s, default | ms, no passes | ms, default | default/none |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
