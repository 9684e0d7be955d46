#!/usr/bin/env python3
"""What tuning buys: Kiln with the strategy's defaults, tuned, and ONNX Runtime, side by side.

For every model (default resnet50, mobilenet_v2, efficientnet_b0 and the BERT-style encoder) at
--threads (default 1), in one run on one machine:

  1. `kiln tune MODEL --db DB --time-budget B --threads T` into a fresh database per model (B per model,
     default 600 s), recording its wall time, trials, and the kernels' summed latency after each
     round (to find when 95% of the final kernel-level gain was reached);
  2. zero-shot: per model, a database holding only the other models' records and a cost model
     trained on them (both objectives are first evaluated on the held-out model's records with
     `kiln db evaluate`, and the one with the better mean peak@5 is kept); every kernel of the model
     is then a miss, and kernel choice takes the model's pick where the model's held-out pairwise
     accuracy (cross-validated over the other models' workloads by `kiln db train`) reaches 0.85,
     the defaults otherwise;
  3. latency over --rounds, each round running every side back to back: ONNX Runtime
     (ORT_ENABLE_ALL), `kiln bench --no-db` (defaults), `--db` the zero-shot database, `--db` the
     tuned one. The table's milliseconds are each side's fastest median; its ratios are the median
     over rounds of the two sides' medians in the same round (paired), so a slow or fast phase of the
     machine that falls on one round moves both sides of a ratio.

With --reuse DIR the tuned databases (DIR/MODEL.db) and tuning figures (DIR/tuning.json, which every
run writes into its own directory) of an earlier run are used instead of tuning again.

Prints a Markdown table (host and versions above it); --write-doc replaces the table between the
markers in docs/tuning.md.

    bench_tuning.py [--kiln BUILD/bin/kiln] [--models a,b] [--threads 1] [--budget 600]
                    [--runs 20] [--warmup 3] [--rounds 2] [--reuse DIR] [--write-doc] [--json FILE]
"""

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "models"))
sys.path.insert(0, HERE)
import model_zoo  # noqa: E402
from bench_models import bench_kiln, bench_ort  # noqa: E402
from export_models import ensure_exported  # noqa: E402
from report import fmt, host_name, write_table  # noqa: E402

DEFAULT_KILN = os.path.join(model_zoo.REPO_ROOT, "build", "bin", "kiln")
DOC = os.path.join(model_zoo.REPO_ROOT, "docs", "tuning.md")
# driver/database_source.cc: kZeroShotMinPairwise.
ZERO_SHOT_BAR = 0.85
BEGIN, END = "<!-- bench_tuning: begin -->", "<!-- bench_tuning: end -->"
ROUND = re.compile(r"^\[(?P<t>[0-9.]+) s\] (?P<phase>\w+): (?P<trials>\d+) trials .* (?P<base>[0-9.]+) -> (?P<ms>[0-9.]+) ms")
DONE = re.compile(r"tuned (?P<w>\d+) workloads in (?P<s>[0-9.e+]+) s: (?P<trials>\d+) trials \((?P<failed>\d+) failed\)")


def tune(kiln, path, db, budget, threads):
    cmd = [kiln, "tune", path, "--db", db, "--time-budget", str(budget), "--threads", str(threads)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip() or f"kiln tune exited with {proc.returncode}")
    matches = [m for m in map(ROUND.match, proc.stdout.splitlines()) if m]
    rounds = [(float(m["t"]), float(m["ms"])) for m in matches]
    base = float(matches[0]["base"]) if matches else None
    done = [m for m in map(DONE.search, proc.stdout.splitlines()) if m]
    trials = int(done[-1]["trials"]) if done else None
    workloads = int(done[-1]["w"]) if done else None
    # When the kernels' summed latency (measured alone; the defaults' sum is
    # the base) first reached 95% of the run's final gain.
    t95 = None
    if rounds:
        last = rounds[-1][1]
        for t, ms in rounds:
            if base - ms >= 0.95 * (base - last):
                t95 = t
                break
    return {"wall_s": wall, "trials": trials, "workloads": workloads, "t95_s": t95,
            "kernels_default_ms": base,
            "kernels_tuned_ms": rounds[-1][1] if rounds else None}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kiln", default=DEFAULT_KILN)
    parser.add_argument("--models", default="resnet50,mobilenet_v2,efficientnet_b0,bert")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget", type=float, default=600, help="tuning seconds per model")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--write-doc", action="store_true", help="replace the table in docs/tuning.md")
    parser.add_argument("--json", default=None)
    parser.add_argument("--reuse", default=None, help="an earlier run's directory: its tuned databases, no tuning")
    args = parser.parse_args()
    names = args.models.split(",")
    unknown = [n for n in names if n not in model_zoo.MODELS_BY_NAME]
    if unknown:
        parser.error(f"unknown model(s) {unknown}")
    work = tempfile.mkdtemp(prefix="kiln_bench_tuning_")
    print(f"[bench_tuning] databases in {work}", file=sys.stderr)

    def run(cmd):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
        return proc.stdout

    # 1. Tune every model into its own database (or copy an earlier run's).
    models = {}
    reused = {}
    if args.reuse:
        with open(os.path.join(args.reuse, "tuning.json")) as f:
            reused = json.load(f)
    for name in names:
        spec = model_zoo.MODELS_BY_NAME[name]
        path = ensure_exported(spec, args.cache_dir)
        db = os.path.join(work, f"{name}.db")
        if args.reuse:
            shutil.copyfile(os.path.join(args.reuse, f"{name}.db"), db)
            stats = reused[name]
        else:
            print(f"[bench_tuning] {name}: tuning for {args.budget:.0f} s", file=sys.stderr, flush=True)
            stats = tune(args.kiln, path, db, args.budget, args.threads)
        models[name] = {"path": path, "db": db, "feeds": model_zoo.make_inputs(spec, None), "tune": stats}
    with open(os.path.join(work, "tuning.json"), "w") as f:
        json.dump({name: m["tune"] for name, m in models.items()}, f, indent=2)
    # 2. Zero-shot: per model, a database of the other models' records and a cost
    #    model trained on them alone; first both objectives are evaluated on the
    #    held-out model's records, and the one with the better mean peak@5 kept.
    evaluations = {}
    for name in names:
        others = [models[o]["db"] for o in names if o != name]
        if not others:
            continue
        evaluations[name] = json.loads(run([args.kiln, "db", "evaluate", models[name]["db"], "--train",
                                            ",".join(others), "--json"]).strip().splitlines()[-1])
    objective = "regression"
    if evaluations:
        mean = {o: sum(e[o]["peak5"] for e in evaluations.values()) / len(evaluations)
                for o in ("reg:squarederror", "rank:pairwise")}
        objective = "rank" if mean["rank:pairwise"] > mean["reg:squarederror"] else "regression"
    for name in names:
        zs = os.path.join(work, f"zero_shot_{name}.db")
        models[name]["zero_shot_db"] = None
        others = [models[o]["db"] for o in names if o != name]
        if not others:
            continue
        for o in others:
            exported = run([args.kiln, "db", "export", o])
            with open(zs + ".jsonl", "a") as f:
                f.write(exported)
        run([args.kiln, "db", "import", zs, zs + ".jsonl"])
        trained = run([args.kiln, "db", "train", zs, "--objective", objective])
        held = re.search(r"pairwise=([0-9.]+)", trained)
        models[name]["zero_shot_heldout"] = float(held.group(1)) if held else None
        models[name]["zero_shot_db"] = zs
    # 3. Latency, every side in each round.
    results = []
    for name in names:
        m = models[name]
        path, feeds = m["path"], m["feeds"]
        best = {}
        per_round = []
        for _ in range(args.rounds):
            sides = {"ort": lambda: bench_ort(path, feeds, args.threads, args.runs, args.warmup),
                     "default": lambda: bench_kiln(args.kiln, path, feeds, args.threads, args.runs, args.warmup, work,
                                                   ["--no-db"]),
                     "tuned": lambda: bench_kiln(args.kiln, path, feeds, args.threads, args.runs, args.warmup, work,
                                                 ["--db", m["db"]])}
            if m["zero_shot_db"]:
                sides["zero_shot"] = lambda: bench_kiln(args.kiln, path, feeds, args.threads, args.runs, args.warmup,
                                                        work, ["--db", m["zero_shot_db"]])
            this_round = {}
            for side, f in sides.items():
                r = f()
                this_round[side] = r["median_ms"]
                if side not in best or r["median_ms"] < best[side]["median_ms"]:
                    best[side] = r
            per_round.append(this_round)

        def paired(a, b):
            xs = [r[a] / r[b] for r in per_round if a in r and b in r]
            return statistics.median(xs) if xs else None
        results.append({"model": name, "threads": args.threads, "ort_ms": best["ort"]["median_ms"],
                        "default_ms": best["default"]["median_ms"], "tuned_ms": best["tuned"]["median_ms"],
                        "zero_shot_ms": best["zero_shot"]["median_ms"] if "zero_shot" in best else None,
                        "tuned_over_default": paired("tuned", "default"),
                        "zero_shot_over_tuned": paired("zero_shot", "tuned"),
                        "zero_shot_over_default": paired("zero_shot", "default"),
                        "tuned_over_ort": paired("tuned", "ort"), "rounds_ms": per_round,
                        "cost_model": evaluations.get(name), "zero_shot_heldout": m.get("zero_shot_heldout"),
                        **m["tune"]})
        print(f"[bench_tuning] {name}: " + ", ".join(f"{k} {v['median_ms']:.2f} ms" for k, v in best.items()),
              file=sys.stderr, flush=True)

    import onnxruntime
    lines = [f"Host: {host_name()} ({os.cpu_count()} cores), {args.threads} thread(s); ONNX Runtime "
             f"{onnxruntime.__version__}; tuning budget {args.budget:.0f} s per model"
             + (" (the tuned databases of an earlier run, --reuse)" if args.reuse else "")
             + f"; median of {args.runs} runs per side and round, {args.rounds} rounds of every side back to back: "
             f"ms are each side's fastest median, ratios the median over rounds of the same round's medians. "
             f"Zero-shot: the cost model ({objective}) trained only on "
             f"the other models' records, no record of this model.",
             "",
             "| model | ORT ms | default ms | zero-shot ms | tuned ms | tuned / default | zero-shot / tuned "
             "| tuned / ORT | tuning wall s | trials | 95% of gain at s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        zs = r["zero_shot_ms"]
        lines.append(f"| {r['model']} | {fmt(r['ort_ms'])} | {fmt(r['default_ms'])} | {fmt(zs)} | {fmt(r['tuned_ms'])} "
                     f"| {fmt(r['tuned_over_default'], 3)} | {fmt(r['zero_shot_over_tuned'], 3)} "
                     f"| {fmt(r['tuned_over_ort'], 3)} "
                     f"| {fmt(r['wall_s'], 0)} | {r['trials']} | {fmt(r['t95_s'], 0)} |")

    def geo(xs):
        xs = [x for x in xs if x]
        return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None
    lines += ["", f"Geometric means: tuned / default {fmt(geo([r['tuned_over_default'] for r in results]), 3)}, "
              f"zero-shot / tuned {fmt(geo([r['zero_shot_over_tuned'] for r in results]), 3)}, "
              f"zero-shot / default {fmt(geo([r['zero_shot_over_default'] for r in results]), 3)}."]
    held = [f"{r['model']} {fmt(r['zero_shot_heldout'], 3)}" for r in results if "zero_shot_heldout" in r]
    if held:
        lines += ["", "Held-out pairwise accuracy of each zero-shot database's model (4 folds of the other models' "
                  f"workloads; it picks only at {ZERO_SHOT_BAR} or more): " + ", ".join(held) + "."]
    if evaluations:
        lines += ["", "Cost model on each held-out model's records (trained on the other models' only):", "",
                  "| held-out model | objective | train records | test records | workloads | pairwise | top-1 | top-5 "
                  "| peak@1 | peak@5 |", "|---|---|---|---|---|---|---|---|---|---|"]
        for name, e in evaluations.items():
            for o, v in e.items():
                lines.append(f"| {name} | {o} | {v['train_records']} | {v['test_records']} | {v['workloads']} "
                             f"| {v['pairwise']:.3f} | {v['top1']:.3f} | {v['top5']:.3f} | {v['peak1']:.3f} "
                             f"| {v['peak5']:.3f} |")
    table = "\n".join(lines)
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if args.write_doc:
        write_table(DOC, BEGIN, END, table)


if __name__ == "__main__":
    main()
