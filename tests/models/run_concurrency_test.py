#!/usr/bin/env python3
"""Four zoo models run at once from several Python threads; every output must equal the
model's own serial output bit for bit.

    run_concurrency_test.py [--cache-dir DIR] [--runs N]

Models and thread counts: resnet18 (2 threads) and squeezenet1_1 (2 threads) share one
thread pool, mobilenet_v3_small runs on 1 thread, the GPT-2-style decoder on 3 threads at
three sequence lengths. One caller thread per model, plus a second caller on the decoder
(one model called from two threads: calls are serialized). The GIL is released while
Kiln runs, so the calls really overlap. Exit code 0 pass, 1 mismatch, 2 error.
"""

import argparse
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_zoo  # noqa: E402
from export_models import ensure_exported  # noqa: E402

MODELS = [("resnet18", 2), ("squeezenet1_1", 2), ("mobilenet_v3_small", 1), ("gpt2", 3)]


def main():
    import kiln
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--runs", type=int, default=60, help="runs per caller thread")
    args = parser.parse_args()

    models = []
    for name, threads in MODELS:
        spec = model_zoo.MODELS_BY_NAME[name]
        path = ensure_exported(spec, args.cache_dir)
        compiled = kiln.compile(path, threads=threads)
        seqs = spec.seq_lengths if spec.kind != "vision" else [None]
        feeds = [model_zoo.make_inputs(spec, seq) for seq in seqs]
        # The serial reference: nothing else runs.
        expected = [compiled.run(f) for f in feeds]
        models.append((name, compiled, feeds, expected))
        print(f"{name}: threads={threads}, {len(feeds)} input set(s)", flush=True)

    callers = [m for m in models] + [models[-1]]
    mismatches, errors, runs = [], [], [0]
    lock = threading.Lock()
    start_gate = threading.Event()

    def caller(index, model):
        name, compiled, feeds, expected = model
        start_gate.wait()
        for r in range(args.runs):
            k = (r + index) % len(feeds)
            try:
                outs = compiled.run(feeds[k])
            except Exception as exc:  # noqa: BLE001: every failure is recorded
                with lock:
                    errors.append(f"{name} run {r}: {type(exc).__name__}: {exc}")
                continue
            with lock:
                runs[0] += 1
                for out_name, ref in expected[k].items():
                    got = outs[out_name]
                    if got.dtype != ref.dtype or got.shape != ref.shape or got.tobytes() != ref.tobytes():
                        diff = np.abs(got.astype(np.float64) - ref.astype(np.float64)).max()
                        mismatches.append(f"{name} run {r} input set {k} output {out_name}: "
                                          f"max abs diff {diff:.3g}")

    threads = [threading.Thread(target=caller, args=(i, m)) for i, m in enumerate(callers)]
    t0 = time.time()
    for t in threads:
        t.start()
    start_gate.set()
    for t in threads:
        t.join()
    elapsed = time.time() - t0
    print(f"{runs[0]} runs from {len(callers)} threads over {len(models)} models in {elapsed:.1f} s: "
          f"{len(mismatches)} mismatching outputs, {len(errors)} errors")
    for line in (errors + mismatches)[:20]:
        print("  " + line)
    return 1 if mismatches or errors else 0


if __name__ == "__main__":
    model_zoo.run_main(main)
