#!/usr/bin/env python3
"""Tuning workers sharing a PostgreSQL job queue, against one worker.

For one model (default mobilenet_v2) at --threads (default 1), in one run on one machine:

  1. for each fleet size in --workers (default 1,2): a throw-away PostgreSQL server
     (tests/db/pg_server.py), `kiln tune MODEL --db URL --enqueue`, then that many
     `kiln tune-worker --db URL --exit-when-idle --trials N` processes at once; the wall time until
     the last exits, the jobs each worker took (every job must be taken by exactly one), the jobs'
     final states and the records; the records are then exported to a SQLite file;
  2. latency of `kiln bench` with each fleet's records (and --no-db), alternating over --rounds and
     keeping each side's fastest median.

Prints a Markdown table (host and versions above it); --write-doc replaces the table between the
markers in docs/tuning.md.

    bench_fleet.py [--kiln BUILD/bin/kiln] [--model mobilenet_v2] [--workers 1,2] [--trials 16]
                   [--threads 1] [--runs 20] [--warmup 3] [--rounds 2] [--write-doc]
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "models"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "db"))
sys.path.insert(0, HERE)
import model_zoo  # noqa: E402
from bench_models import bench_kiln  # noqa: E402
from report import fmt, host_name, write_table  # noqa: E402
from export_models import ensure_exported  # noqa: E402
from pg_server import PgServer  # noqa: E402

DEFAULT_KILN = os.path.join(model_zoo.REPO_ROOT, "build", "bin", "kiln")
DOC = os.path.join(model_zoo.REPO_ROOT, "docs", "tuning.md")
BEGIN, END = "<!-- bench_fleet: begin -->", "<!-- bench_fleet: end -->"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kiln", default=DEFAULT_KILN)
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--trials", type=int, default=16, help="trials per job")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--write-doc", action="store_true")
    args = parser.parse_args()
    spec = model_zoo.MODELS_BY_NAME[args.model]
    path = ensure_exported(spec, args.cache_dir)
    feeds = model_zoo.make_inputs(spec, None)
    work = tempfile.mkdtemp(prefix="kiln_bench_fleet_")
    env = dict(os.environ, KILN_DB="off")

    def kiln(*a):
        p = subprocess.run([args.kiln, *a], capture_output=True, text=True, env=env)
        if p.returncode != 0:
            raise RuntimeError(f"kiln {' '.join(a)}: {p.stderr.strip()}")
        return p.stdout

    fleets = []
    for n in [int(x) for x in args.workers.split(",")]:
        with PgServer() as pg:
            kiln("tune", path, "--db", pg.url, "--enqueue", "--threads", str(args.threads))
            queued = json.loads(kiln("db", "stats", pg.url, "--json"))["jobs"]["queued"]
            t0 = time.time()
            procs = [subprocess.Popen([args.kiln, "tune-worker", "--db", pg.url, "--exit-when-idle", "--trials",
                                       str(args.trials), "--threads", str(args.threads), "--name", f"w{i}"],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
                     for i in range(n)]
            outs = [p.communicate()[0] for p in procs]
            wall = time.time() - t0
            taken = collections.Counter(j for out in outs for j in re.findall(r"^w\d+: job (\d+) ", out, re.M))
            stats = json.loads(kiln("db", "stats", pg.url, "--json"))
            lite = os.path.join(work, f"fleet{n}.db")
            exported = os.path.join(work, f"fleet{n}.jsonl")
            kiln("db", "export", pg.url, "-o", exported)
            kiln("db", "import", lite, exported)
        fleets.append({"workers": n, "queued": queued, "wall_s": wall, "jobs": stats["jobs"],
                       "records": stats["records"], "taken": len(taken),
                       "taken_twice": sum(1 for c in taken.values() if c > 1),
                       "exit_codes": [p.returncode for p in procs], "db": lite})
        print(f"[bench_fleet] {n} worker(s): {queued} jobs in {wall:.0f} s, {stats['jobs']}", file=sys.stderr, flush=True)

    best = {}
    for _ in range(args.rounds):
        sides = [("default", ["--no-db"])] + [(f"fleet{f['workers']}", ["--db", f["db"]]) for f in fleets]
        for side, flags in sides:
            r = bench_kiln(args.kiln, path, feeds, args.threads, args.runs, args.warmup, work, flags)
            if side not in best or r["median_ms"] < best[side]["median_ms"]:
                best[side] = r
    one = best[f"fleet{fleets[0]['workers']}"]["median_ms"]
    lines = [f"Host: {host_name()} ({os.cpu_count()} cores), {args.threads} thread(s); model {args.model}; "
             f"{args.trials} trials per job; median of {args.runs} runs, fastest of {args.rounds} alternating rounds; "
             f"defaults {fmt(best['default']['median_ms'])} ms.",
             "",
             "| workers | jobs queued | jobs done | failed | jobs taken twice | records | wall s | tuned ms "
             f"| tuned / {fleets[0]['workers']} worker(s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for f in fleets:
        ms = best[f"fleet{f['workers']}"]["median_ms"]
        lines.append(f"| {f['workers']} | {f['queued']} | {f['jobs']['done']} | {f['jobs']['failed']} "
                     f"| {f['taken_twice']} | {f['records']} | {fmt(f['wall_s'], 0)} | {fmt(ms)} | {fmt(ms / one, 3)} |")
    table = "\n".join(lines)
    print(table)
    if args.write_doc:
        write_table(DOC, BEGIN, END, table)
    bad = [f for f in fleets if f["taken_twice"] or f["jobs"]["done"] != f["queued"] or any(f["exit_codes"])]
    if bad:
        sys.exit(f"[bench_fleet] jobs not done exactly once: {bad}")


if __name__ == "__main__":
    main()
