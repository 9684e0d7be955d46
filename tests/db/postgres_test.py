#!/usr/bin/env python3
"""The tuning database on a real PostgreSQL server, and its job queue.

Starts a throw-away server (Debian's postgresql: initdb, pg_ctl) on a Unix socket in a temporary
folder, then checks with the kiln CLI: an empty database's stats; records moved from SQLite to
PostgreSQL and back (export/import); a model's workloads queued as jobs (`kiln tune --enqueue`), a
second enqueue queuing nothing; two `kiln tune-worker --exit-when-idle` processes sharing the queue,
every job done exactly once; a worker killed mid-job, whose job another worker finishes once the
lease expired, with the records the dead one committed kept; the server stopped (a clear error),
started again (everything still there).

    postgres_test.py KILN_BINARY
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pg_server import PgServer

KILN = sys.argv[1]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def kiln(*args, check_rc=True, env=None):
    p = subprocess.run([KILN, *args], capture_output=True, text=True, env=env)
    if check_rc and p.returncode != 0:
        raise RuntimeError(f"kiln {' '.join(args)} exited {p.returncode}: {p.stderr}")
    return p


def mlp(path, sizes, seed):
    """A chain of MatMul + Relu layers of the given widths (one workload per distinct shape)."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for i, (k, n) in enumerate(zip(sizes, sizes[1:])):
        w = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), f"w{i}")
        inits.append(w)
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"y{i}"]))
        prev = f"y{i}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, sizes[0]])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def stats(url):
    return json.loads(kiln("db", "stats", url, "--json").stdout)


def main():
    env = dict(os.environ, KILN_DB="off")
    try:
        server = PgServer()
    except RuntimeError as e:
        sys.exit(str(e))
    with server as pg:
        url, work = pg.url, pg.work
        s = stats(url)
        check(s["records"] == 0 and s["jobs"] == {"done": 0, "failed": 0, "queued": 0, "running": 0},
              f"an empty database: {s}")

        model = os.path.join(work, "mlp.onnx")
        mlp(model, [64, 48, 32, 48, 32], 1)  # workloads 64x48, 48x32, 32x48 (48x32 twice)
        # SQLite -> PostgreSQL -> SQLite.
        lite = os.path.join(work, "lite.db")
        kiln("tune", model, "--db", lite, "--trials", "6", env=env)
        exported = os.path.join(work, "lite.jsonl")
        kiln("db", "export", lite, "-o", exported)
        kiln("db", "import", url, exported)
        back = os.path.join(work, "back.jsonl")
        kiln("db", "export", url, "-o", back)
        check(open(back).read() == open(exported).read(), "records round-trip SQLite -> PostgreSQL -> JSON lines")
        check(stats(url)["records"] == stats(lite)["records"] > 0, "the same record count in both")

        out = kiln("tune", model, "--db", url, "--enqueue", env=env).stdout
        s = stats(url)
        check(s["jobs"]["queued"] == 3, f"three workloads queued: {out.strip()} {s['jobs']}")
        out = kiln("tune", model, "--db", url, "--enqueue", env=env).stdout
        check("queued 0 of 3" in out, f"a second enqueue queues nothing: {out.strip()}")

        # Two workers share the queue.
        workers = [subprocess.Popen([KILN, "tune-worker", "--db", url, "--exit-when-idle", "--trials", "4",
                                     "--name", f"w{i}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=env) for i in range(2)]
        logs = [w.communicate(timeout=600) for w in workers]
        check(all(w.returncode == 0 for w in workers), f"both workers exit 0: {[l[1][-300:] for l in logs]}")
        taken = [line.split()[2] for out, _ in logs for line in out.splitlines() if ": job " in line and "(workload" in line]
        check(sorted(taken) == sorted(set(taken)) and len(taken) == 3, f"every job taken exactly once: {taken}")
        s = stats(url)
        check(s["jobs"] == {"done": 3, "failed": 0, "queued": 0, "running": 0}, f"all jobs done: {s['jobs']}")

        # A worker killed mid-job: the job returns to the queue when its lease expires.
        model2 = os.path.join(work, "mlp2.onnx")
        mlp(model2, [80, 96], 2)
        kiln("tune", model2, "--db", url, "--enqueue", env=env)
        before = stats(url)["records"]
        w = subprocess.Popen([KILN, "tune-worker", "--db", url, "--trials", "400", "--lease", "3", "--name", "doomed"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.time() + 120
        while time.time() < deadline and stats(url)["records"] <= before:
            time.sleep(0.5)
        w.send_signal(signal.SIGKILL)
        w.wait()
        committed = stats(url)["records"]
        check(committed > before, f"the killed worker had committed records ({committed - before})")
        s = stats(url)
        check(s["jobs"]["running"] == 1, f"its job is still marked running: {s['jobs']}")
        time.sleep(4)  # past the lease
        r = kiln("tune-worker", "--db", url, "--exit-when-idle", "--trials", "4", "--name", "rescuer", env=env)
        s = stats(url)
        check("attempt 2" in r.stdout and s["jobs"]["done"] == 4 and s["jobs"]["running"] == 0,
              f"another worker finished it: {r.stdout.strip()} {s['jobs']}")
        check(s["records"] >= committed, "nothing the killed worker committed was lost")

        # A database of schema 2 (before features carried their version) is migrated when opened: its
        # features count as version 1's, and kiln tune --refeature recomputes them on the server.
        check(pg.sql("SELECT COUNT(*) FROM kiln_records WHERE evict_bytes <= 0").split()[2] == "0",
              "the workers' records say how much they evicted before each run")
        pg.sql("ALTER TABLE kiln_records DROP COLUMN evict_bytes; ALTER TABLE kiln_records DROP COLUMN feature_version;"
               " UPDATE kiln_meta SET value = '2' WHERE key = 'schema_version'")
        out = kiln("tune", model, "--db", url, "--refeature", env=env).stdout
        m = re.search(r"refeatured (\d+) records of 3 workloads.* 0 whose point no longer applies", out)
        check(m is not None and int(m.group(1)) > 0, f"schema 2 migrated and its records refeatured: {out.strip()}")
        out = kiln("tune", model, "--db", url, "--refeature", env=env).stdout
        check("refeatured 0 records" in out, f"a second refeature has nothing to do: {out.strip()}")
        check(pg.sql("SELECT value FROM kiln_meta WHERE key = 'schema_version'").split()[2] == "4",
              "the schema version is 4 after the migration")
        check(pg.sql("SELECT COUNT(*) FROM kiln_records WHERE evict_bytes <> -1").split()[2] == "0",
              "records from before schema 4 do not say how they were timed")

        # The server goes away, then comes back.
        pg.stop(mode="fast")
        r = kiln("db", "stats", url, "--json", check_rc=False)
        check(r.returncode == 2 and "cannot connect to PostgreSQL" in r.stderr, f"a stopped server is an error: {r.stderr.strip()}")
        pg.start()
        check(stats(url)["records"] == s["records"], "after a restart every record is there")
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")


if __name__ == "__main__":
    main()
