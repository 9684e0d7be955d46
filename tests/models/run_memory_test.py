#!/usr/bin/env python3
"""Resident memory of a dynamic model stays flat: the GPT-2-style decoder (symbolic batch
and sequence) runs N times on random sequence lengths; after a warm-up, resident memory
may not grow.

    run_memory_test.py [--cache-dir DIR] [--runs 1000] [--warmup 200] [--max-growth-mib 6]

Every sequence length of the range appears during the warm-up with high probability
(the lengths are drawn from a fixed seed, so the run is repeatable); the check is that
the pools and caches (buffer pool, kernel scratch) reach a steady state: the median
resident memory of the second half of the runs after the warm-up may exceed that of the
first half by at most --max-growth-mib, once the largest single step between consecutive
windows of 50 runs is taken out. The C library's arenas grow by megabytes at a time as
threads free what others allocated, at moments that vary from run to run: one such step
is not a leak, while a leak's growth is spread over the windows and stays. Growth beyond
--max-step-mib fails in any case.
Exit code 0 pass, 1 growth, 2 error.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_zoo  # noqa: E402
from export_models import ensure_exported  # noqa: E402


def rss_mib():
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def main():
    import kiln
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--max-seq", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-growth-mib", type=float, default=6.0)
    parser.add_argument("--max-step-mib", type=float, default=32.0)
    args = parser.parse_args()

    spec = model_zoo.MODELS_BY_NAME["gpt2"]
    path = ensure_exported(spec, args.cache_dir)
    compiled = kiln.compile(path, threads=args.threads)
    rng = np.random.default_rng(2024)
    lengths = rng.integers(1, args.max_seq + 1, size=args.runs)
    feeds = {seq: model_zoo.make_inputs(spec, int(seq)) for seq in range(1, args.max_seq + 1)}
    rss = []
    t0 = time.time()
    for seq in lengths:
        compiled.run(feeds[int(seq)])
        rss.append(rss_mib())
    # Resident memory moves with the sequence length of the moment (buffers of
    # the pool are freed and allocated again within its bound) and with the C
    # library's heaps: compare the medians of the two halves after the warm-up
    # (a leak moves every sample, a heap's step a few), less the largest step
    # between windows of 50 runs.
    steady = rss[args.warmup:]
    half = len(steady) // 2
    first, second = float(np.median(steady[:half])), float(np.median(steady[half:]))
    growth = second - first
    windows = [float(np.median(steady[i:i + 50])) for i in range(0, len(steady) - 49, 50)]
    step = max([b - a for a, b in zip(windows, windows[1:])] + [0.0])
    print(f"{args.runs} runs, sequence lengths 1..{args.max_seq} at random, {time.time() - t0:.1f} s")
    print("resident memory (MiB) every 100 runs: " +
          ", ".join(f"{i + 1}: {rss[i]:.1f}" for i in range(99, len(rss), 100)))
    print(f"median after warm-up: runs {args.warmup + 1}-{args.warmup + half} {first:.1f} MiB, "
          f"runs {args.warmup + half + 1}-{args.runs} {second:.1f} MiB: growth {growth:+.1f} MiB, "
          f"largest step between windows of 50 runs {step:.1f} MiB; growth less that step "
          f"{growth - step:+.1f} MiB (limit {args.max_growth_mib} MiB, and {args.max_step_mib} MiB in all)")
    return 0 if growth - step <= args.max_growth_mib and growth <= args.max_step_mib else 1


if __name__ == "__main__":
    model_zoo.run_main(main)
