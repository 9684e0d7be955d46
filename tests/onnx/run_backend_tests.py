#!/usr/bin/env python3
"""Runs the ONNX backend test suites shipped with the pinned onnx package through Kiln.

Suites: node, simple, pytorch-converted, pytorch-operator, and real where its models are
present (the onnx package ships only their data.json with a download URL; nothing is
downloaded, so absent real models are reported as skipped, never as passes). Case names
are unique across suites. Each case onnx/backend/test/data/<suite>/<name>/ (model.onnx +
test_data_set_*/) is compiled
with the Python module and every data set is compared as onnx.backend.test does:
numpy.testing.assert_allclose with the case's rtol/atol (1e-3 / 1e-7 unless its
data.json says otherwise), equal dtypes, exact equality for non-numeric outputs.

Cases that fail must be listed in filter.txt as `test_name  # KIND: detail`, KIND the way
the case fails:
    unsupported-op     Kiln rejects the model for ops it lacks; detail: the ops, comma-separated
    unsupported-dtype  Kiln rejects a dtype it lacks
    unsupported        Kiln rejects some other feature (an attribute value, an unknown rank)
    wrong-result       Kiln runs the case and an output differs (detail: why that is expected)
    error              Kiln fails with another error
A crash or a timeout is never an expected failure. The run fails on UNEXPECTED failures
and on CHANGED ones: a listed case that fails with another kind (or other ops) than its
line says. A listed case that passes is reported, not an error.

Every case runs in a worker process, so a crash (a Kiln bug that aborts) or a hang is
recorded against that case and the run continues.

    run_backend_tests.py [-k REGEX] [-j N] [--filter FILE] [--write-filter FILE]
                         [--timeout S] [--backend kiln|ort] [-v]
"""

import argparse
import glob
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FILTER = os.path.join(HERE, "filter.txt")
# The cases ONNX Runtime 1.31.1 fails through this same driver and comparison
# (--backend ort --write-filter ort_failures.txt); its filter in --backend ort
# runs, and in Kiln runs the list Kiln's failures must lie in (issue 8: Kiln
# passes every case ORT passes).
ORT_FAILURES = os.path.join(HERE, "ort_failures.txt")


SUITES = ("node", "simple", "pytorch-converted", "pytorch-operator", "real")


def data_root():
    import onnx
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


# --cases-dir: run the case directories under this folder instead of the onnx
# package's suites (tests/onnx/op_dtype_table.py writes its variants there).
# Passed to the workers through the environment.
CASES_DIR_ENV = "KILN_BACKEND_CASES_DIR"


def case_dir(name):
    """The directory of case `name` in whichever suite holds it."""
    if os.environ.get(CASES_DIR_ENV):
        return os.path.join(os.environ[CASES_DIR_ENV], name)
    for suite in SUITES:
        d = os.path.join(data_root(), suite, name)
        if os.path.isdir(d):
            return d
    raise FileNotFoundError(f"no backend test case named {name}")


def list_cases(pattern=None, suites=SUITES):
    """(runnable case names, skipped {name: why}) over `suites`, names unique across them."""
    names, skipped = [], {}
    if os.environ.get(CASES_DIR_ENV):
        root = os.environ[CASES_DIR_ENV]
        names = [d for d in sorted(os.listdir(root)) if os.path.isfile(os.path.join(root, d, "model.onnx"))
                 and (not pattern or re.search(pattern, d))]
        return names, skipped
    for suite in suites:
        root = os.path.join(data_root(), suite)
        if not os.path.isdir(root):
            continue
        for d in sorted(os.listdir(root)):
            if not d.startswith("test_") or (pattern and not re.search(pattern, d)):
                continue
            if os.path.isfile(os.path.join(root, d, "model.onnx")):
                names.append(d)
            else:
                skipped[d] = f"{suite}: model not present (the onnx package ships a download URL)"
    return sorted(names), skipped


KINDS = ("unsupported-op", "unsupported-dtype", "unsupported", "wrong-result", "error")


def failure_kind(result):
    """(kind, ops) of a failed result; ops: the sorted unsupported ops for unsupported-op."""
    status = result["status"]
    if status == "fail":
        return "wrong-result", None
    if status != "error":
        return status, None  # crash, timeout: never expected
    first = (result["message"].splitlines() or [""])[0]
    if not first.startswith("KilnError: unsupported:"):
        return "error", None
    listed = re.search(r"\d+ unsupported ops?: (.*)$", first)
    if listed:
        return "unsupported-op", sorted(set(re.findall(r"([\w.:-]+) \(node", listed.group(1))))
    if "dtype" in first:
        return "unsupported-dtype", None
    return "unsupported", None


def parse_reason(reason):
    """(kind, ops) of a filter line's `KIND: detail`."""
    kind, _, detail = reason.partition(":")
    kind = kind.strip()
    if kind not in KINDS:
        return None, None
    if kind == "unsupported-op":
        return kind, sorted(op.strip() for op in detail.split(",") if op.strip())
    return kind, None


def read_filter(path):
    """{test_name: reason} from lines `test_name  # KIND: detail`."""
    entries = {}
    if not os.path.exists(path):
        return entries
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            name, _, reason = text.partition("#")
            name = name.strip()
            if not name or " " in name:
                raise SystemExit(f"{path}:{lineno}: malformed line: {line.rstrip()}")
            if parse_reason(reason)[0] is None:
                raise SystemExit(f"{path}:{lineno}: '{name}' needs a kind ({', '.join(KINDS)}): "
                                 f"{line.rstrip()}")
            entries[name] = reason.strip()
    return entries


# ---------------------------------------------------------------------------
# The worker: runs cases named on stdin, one JSON result line per case on stdout.


def _load_value(path, type_proto):
    import onnx
    from onnx import numpy_helper
    with open(path, "rb") as f:
        content = f.read()
    if type_proto.HasField("tensor_type"):
        t = onnx.TensorProto()
        t.ParseFromString(content)
        return numpy_helper.to_array(t)
    # Sequences as lists of arrays, optionals as None or their element (the
    # form both Kiln's Python module and onnxruntime take and return).
    if type_proto.HasField("sequence_type"):
        s = onnx.SequenceProto()
        s.ParseFromString(content)
        return numpy_helper.to_list(s)
    if type_proto.HasField("optional_type"):
        o = onnx.OptionalProto()
        o.ParseFromString(content)
        return numpy_helper.to_optional(o)
    kind = type_proto.WhichOneof("value")
    raise NotImplementedError(f"{kind} values are not supported by the Kiln API "
                              f"({os.path.basename(path)})")


def _compare(name, ref, out, rtol, atol):
    import numpy as np
    if ref is None or isinstance(ref, list):
        if isinstance(ref, list) and not isinstance(out, list):
            raise AssertionError(f"output {name}: {type(out).__name__}, expected a sequence (list)")
        if ref is None:
            if out is not None:
                raise AssertionError(f"output {name}: {out!r}, expected an empty optional (None)")
            return
        if len(out) != len(ref):
            raise AssertionError(f"output {name}: sequence of {len(out)} elements, expected {len(ref)}")
        for i, (r, o) in enumerate(zip(ref, out)):
            _compare(f"{name}[{i}]", r, o, rtol, atol)
        return
    if isinstance(out, list) or out is None:
        raise AssertionError(f"output {name}: {type(out).__name__}, expected an array")
    np.testing.assert_equal(np.shape(out), np.shape(ref), err_msg=f"output {name}: shape")
    if not np.issubdtype(ref.dtype, np.number):
        if ref.dtype == np.bool_ and out.dtype != np.bool_:
            raise AssertionError(f"output {name}: dtype {out.dtype}, expected bool")
        if ref.tolist() != np.asarray(out).tolist():
            raise AssertionError(f"output {name}: {out!r} != {ref!r}")
        return
    if out.dtype != ref.dtype:
        raise AssertionError(f"output {name}: dtype {out.dtype}, expected {ref.dtype}")
    if ref.dtype == object:
        np.testing.assert_array_equal(out, ref, err_msg=f"output {name}")
    else:
        np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol, err_msg=f"output {name}")


def _run_case(name, backend, threads, how):
    """Runs case `name`; raises on a failure. `how` gets the compiled model's kernel counts."""
    import onnx
    case_path = case_dir(name)
    rtol, atol = 1e-3, 1e-7
    data_json = os.path.join(case_path, "data.json")
    if os.path.exists(data_json):
        with open(data_json) as f:
            data = json.load(f)
        rtol, atol = data.get("rtol", rtol), data.get("atol", atol)
    model_path = os.path.join(case_path, "model.onnx")
    model = onnx.load(model_path, load_external_data=False)
    graph_inputs = [i for i in model.graph.input]
    graph_outputs = [o for o in model.graph.output]

    if backend == "kiln":
        import kiln
        compiled = kiln.compile(model_path, threads=threads)
        stats = compiled.stats
        how["kernels"] = stats["num_kernels"]
        how["runtime_kernels"] = stats["num_runtime_kernels"]

        def run(feeds):
            return compiled.run(feeds)
    else:
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = max(threads, 1)
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])

        def run(feeds):
            names = [o.name for o in sess.get_outputs()]
            return dict(zip(names, sess.run(names, feeds)))

    sets = sorted(glob.glob(os.path.join(case_path, "test_data_set*")))
    if not sets:
        raise AssertionError("no test_data_set directories")
    for data_dir in sets:
        feeds = {}
        n_in = len(glob.glob(os.path.join(data_dir, "input_*.pb")))
        for i in range(n_in):
            feeds[graph_inputs[i].name] = _load_value(os.path.join(data_dir, f"input_{i}.pb"),
                                                      graph_inputs[i].type)
        n_out = len(glob.glob(os.path.join(data_dir, "output_*.pb")))
        refs = [_load_value(os.path.join(data_dir, f"output_{i}.pb"), graph_outputs[i].type)
                for i in range(n_out)]
        outputs = run(feeds)
        if len(outputs) != len(refs):
            raise AssertionError(f"{len(outputs)} outputs, expected {len(refs)}")
        for i, ref in enumerate(refs):
            out_name = graph_outputs[i].name
            if out_name not in outputs:
                raise AssertionError(f"missing output {out_name}")
            _compare(out_name, ref, outputs[out_name], rtol, atol)


def _classify(exc):
    kind = "fail" if isinstance(exc, AssertionError) else "error"
    name = type(exc).__name__
    return kind, f"{name}: {exc}"


def worker_main(backend, threads):
    out = sys.stdout
    sys.stdout = sys.stderr  # anything the cases print must not corrupt the protocol
    for line in sys.stdin:
        name = line.strip()
        if not name:
            continue
        start = time.time()
        how = {}
        try:
            _run_case(name, backend, threads, how)
            result = {"name": name, "status": "pass", "message": ""}
        except BaseException as exc:  # noqa: BLE001: every failure is a result
            kind, message = _classify(exc)
            if kind == "error" and not type(exc).__name__ == "KilnError":
                message += "\n" + traceback.format_exc(limit=3)
            result = {"name": name, "status": kind, "message": message}
        result["seconds"] = round(time.time() - start, 3)
        result.update(how)
        out.write(json.dumps(result) + "\n")
        out.flush()


# ---------------------------------------------------------------------------
# The parent: feeds cases to N workers, restarting a worker that crashed or hung.


class Pool:
    def __init__(self, cases, jobs, timeout, backend, threads, verbose):
        self.pending = list(cases)
        self.lock = threading.Lock()
        self.results = {}
        self.timeout = timeout
        self.cmd = [sys.executable, os.path.abspath(__file__), "--worker",
                    "--backend", backend, "--threads", str(threads)]
        self.verbose = verbose
        self.jobs = jobs
        self.done = 0
        self.total = len(cases)

    def _next(self):
        with self.lock:
            return self.pending.pop(0) if self.pending else None

    def _record(self, result):
        with self.lock:
            self.results[result["name"]] = result
            self.done += 1
            if self.verbose or result["status"] != "pass":
                first = result["message"].splitlines()[0][:160] if result["message"] else ""
                print(f"[{self.done}/{self.total}] {result['status'].upper():7s} "
                      f"{result['name']} {first}", flush=True)
            elif self.done % 100 == 0:
                print(f"[{self.done}/{self.total}] ...", flush=True)

    def _spawn(self):
        return subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def _serve(self):
        proc = None
        while True:
            name = self._next()
            if name is None:
                break
            if proc is None:
                proc = self._spawn()
            proc.stdin.write(name + "\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], self.timeout)
            line = proc.stdout.readline() if ready else ""
            if line:
                self._record(json.loads(line))
                continue
            if not ready:
                proc.kill()
                proc.wait()
                self._record({"name": name, "status": "timeout", "seconds": self.timeout,
                              "message": f"no result after {self.timeout} s"})
            else:
                code = proc.wait()
                how = (f"killed by signal {signal.Signals(-code).name}" if code < 0
                       else f"worker exited with code {code}")
                self._record({"name": name, "status": "crash", "seconds": 0, "message": how})
            proc = None
        if proc is not None:
            proc.stdin.close()
            proc.wait()

    def run(self):
        threads = [threading.Thread(target=self._serve) for _ in range(self.jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return self.results


def describe_failure(name, result):
    """The filter line's `KIND: detail` for a failed result."""
    kind, ops = failure_kind(result)
    if ops is not None:
        return f"{kind}: {', '.join(ops)}"
    first = (result["message"].splitlines() or [""])[0]
    first = first.replace(case_dir(name) + os.sep, "")
    first = re.sub(r"^KilnError: unsupported: ", "", first)
    return " ".join(f"{kind}: {first}".split())[:200]


def changed(reason, result):
    """None when `result` fails the way the filter's `reason` says; else what differs."""
    want = parse_reason(reason)
    got = failure_kind(result)
    if want == got:
        return None
    show = lambda k: k[0] + (f" ({', '.join(k[1])})" if k[1] is not None else "")  # noqa: E731
    return f"listed as {show(want)}, fails as {show(got)}"


def write_filter(path, results, old, backend="kiln"):
    who = "Kiln is known to fail" if backend == "kiln" else "ONNX Runtime 1.31.1 fails (this driver, its Python package)"
    lines = [f"# ONNX backend tests (all suites) that {who}, one per line:",
             "#   test_name  # KIND: detail   (KIND: " + ", ".join(KINDS) + ";",
             "#   see run_backend_tests.py). Generated by --write-filter, which keeps the detail",
             "#   of a line whose kind still holds; edit the details freely."]
    for name in sorted(results):
        r = results[name]
        if r["status"] == "pass":
            continue
        reason = old.get(name)
        if reason is None or changed(reason, r) is not None or failure_kind(r)[0] == "unsupported-op":
            reason = describe_failure(name, r)
        lines.append(f"{name}  # {reason}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases-dir", default=None,
                        help="run the case directories in this folder instead of the onnx suites")
    parser.add_argument("--suite", default="all",
                        help="comma-separated suites (" + ", ".join(SUITES) + ") or all")
    parser.add_argument("-k", dest="pattern", default=None, help="regex selecting case names")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--filter", default=None,
                        help="expected failures (default: filter.txt; with --backend ort, ort_failures.txt)")
    parser.add_argument("--ort-failures", default=ORT_FAILURES,
                        help="Kiln runs: a case Kiln fails must be listed here (ORT fails it too); 'none' skips")
    parser.add_argument("--write-filter", default=None,
                        help="write every failing case (with its reason) to this file")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per case")
    parser.add_argument("--threads", type=int, default=1, help="threads per compiled model")
    parser.add_argument("--backend", choices=["kiln", "ort"], default="kiln",
                        help="ort checks this harness against onnxruntime")
    parser.add_argument("--json", default=None, help="write all results to this file")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.cases_dir:
        os.environ[CASES_DIR_ENV] = os.path.abspath(args.cases_dir)
    if args.worker:
        worker_main(args.backend, args.threads)
        return 0

    suites = SUITES if args.suite == "all" else tuple(args.suite.split(","))
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        parser.error(f"unknown suite {', '.join(unknown)}; suites: {', '.join(SUITES)}, all")
    cases, skipped = list_cases(args.pattern, suites)
    if not cases:
        print("no test cases selected", file=sys.stderr)
        return 2
    if args.filter is None:
        args.filter = DEFAULT_FILTER if args.backend == "kiln" else ORT_FAILURES
    expected_failures = read_filter(args.filter)
    ort_fails = (read_filter(args.ort_failures)
                 if args.backend == "kiln" and args.ort_failures != "none" else None)
    start = time.time()
    results = Pool(cases, max(1, args.jobs), args.timeout, args.backend, args.threads,
                   args.verbose).run()
    elapsed = time.time() - start

    passed = [n for n in cases if results[n]["status"] == "pass"]
    failed = [n for n in cases if results[n]["status"] != "pass"]
    unexpected = [n for n in failed if n not in expected_failures]
    different = {n: changed(expected_failures[n], results[n]) for n in failed if n in expected_failures}
    different = {n: why for n, why in different.items() if why is not None}
    fixed = [n for n in passed if n in expected_failures]
    stale = sorted(n for n in expected_failures
                   if n not in results and not args.pattern and args.suite == "all")

    by_status = {}
    for n in failed:
        by_status.setdefault(results[n]["status"], []).append(n)
    print()
    for suite in suites:
        in_suite = [n for n in cases if os.path.basename(os.path.dirname(case_dir(n))) == suite]
        if in_suite:
            ok = sum(results[n]["status"] == "pass" for n in in_suite)
            print(f"  {suite}: {ok}/{len(in_suite)} passed")
    print(f"ONNX backend tests ({args.backend}, {', '.join(suites)}): {len(passed)}/{len(cases)} "
          f"passed ({100.0 * len(passed) / len(cases):.1f}%) in {elapsed:.0f} s; " +
          ", ".join(f"{len(v)} {k}" for k, v in sorted(by_status.items())))
    if skipped:
        print(f"skipped {len(skipped)} case(s) without a local model: "
              + "; ".join(f"{n} ({why})" for n, why in sorted(skipped.items())))
    if failed:
        print(f"\nfailing cases ({len(failed)}):")
        for n in failed:
            first = (results[n]["message"].splitlines() or [""])[0][:160]
            mark = ("  <-- UNEXPECTED" if n not in expected_failures
                    else f"  <-- CHANGED: {different[n]}" if n in different else "")
            print(f"  {n}: {results[n]['status']}: {first}{mark}")
    if fixed:
        print(f"\nlisted in {os.path.basename(args.filter)} but now passing "
              f"(remove them): {' '.join(fixed)}")
    if stale:
        print(f"\nlisted in {os.path.basename(args.filter)} but not a test case: {' '.join(stale)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    if args.write_filter:
        write_filter(args.write_filter, results, expected_failures, args.backend)
        print(f"\nwrote {args.write_filter} ({len(failed)} cases)")
    status = 0
    if ort_fails is not None:
        ort_passes = [n for n in failed if n not in ort_fails]
        beyond = [n for n in passed if n in ort_fails]
        print(f"\nagainst ONNX Runtime ({os.path.basename(args.ort_failures)}): Kiln passes {len(beyond)} "
              f"case(s) ORT fails; of Kiln's {len(failed)} failure(s), {len(ort_passes)} pass in ORT")
        if ort_passes:
            print(f"  Kiln fails, ORT passes: {' '.join(ort_passes)}")
            status = 1
    if unexpected:
        shown = " ".join(unexpected[:20]) + (" ..." if len(unexpected) > 20 else "")
        print(f"\n{len(unexpected)} UNEXPECTED failure(s) (marked above): {shown}")
        status = 1
    if different:
        shown = " ".join(sorted(different)[:20]) + (" ..." if len(different) > 20 else "")
        print(f"\n{len(different)} listed case(s) fail differently from filter.txt (CHANGED above): "
              f"{shown}")
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
