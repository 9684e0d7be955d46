"""The Python API (python/kiln/__init__.py) as a user calls it: kiln.compile on every kind of
model it takes, run on numpy arrays and DLPack tensors (torch), outputs written into the caller's
buffers, profile, packages (CompiledModel.save, kiln.load, `kiln compile` and the commands that
take a package), and the errors of each.

    PYTHONPATH=build/python run_api_test.py --kiln build/bin/kiln
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

import kiln

FAILURES = []


def case(fn):
    try:
        fn()
        print("ok  ", fn.__name__)
    except Exception:  # noqa: BLE001 (each case reports its own failure)
        FAILURES.append(fn.__name__)
        print("FAIL", fn.__name__)
        traceback.print_exc()
    return fn


def expect_error(kind, fragment, fn):
    try:
        fn()
    except kind as e:
        assert fragment in str(e), f"{kind.__name__} without {fragment!r}: {e}"
        return
    raise AssertionError(f"no {kind.__name__} ({fragment!r})")


PARSER = argparse.ArgumentParser()
PARSER.add_argument("--kiln", required=True, help="the kiln command line")
ARGS = PARSER.parse_args()

RNG = np.random.default_rng(7)
W = (RNG.standard_normal((64, 48)) / 8).astype(np.float32)
B = RNG.standard_normal(48).astype(np.float32)
X = RNG.standard_normal((6, 64)).astype(np.float32)


def dense_model():
    """y = relu(x @ W + B), and z = y * 2 (two outputs)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["pre"]),
         helper.make_node("Relu", ["pre"], ["y"]), helper.make_node("Mul", ["y", "two"], ["z"])],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 48]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [6, 48])],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b"),
         numpy_helper.from_array(np.array(2, np.float32), "two")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def reference(x):
    y = np.maximum(x @ W + B, 0)
    return y, y * 2


MODEL = dense_model()
Y, Z = reference(X)
assert Y.std() > 0.1 and (Y > 0).mean() > 0.2, "the reference must have spread"


def aligned_empty(shape, dtype, offset=0):
    """An array whose data starts `offset` bytes past a 64-byte boundary."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(n + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    return raw[start:start + n].view(dtype).reshape(shape)


@case
def compile_every_kind_of_model():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "dense.onnx")
        onnx.save(MODEL, path)
        for model in (path, MODEL.SerializeToString(), MODEL, bytearray(MODEL.SerializeToString())):
            m = kiln.compile(model, threads=1, db="")
            out = m.run({"x": X})
            np.testing.assert_allclose(out["y"], Y, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(out["z"], Z, rtol=1e-4, atol=1e-4)
    expect_error(TypeError, "expects a path", lambda: kiln.compile(42))


@case
def compile_a_torch_module():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                 torch.nn.Flatten(), torch.nn.Linear(8 * 5 * 5, 4))
    x = torch.randn(2, 3, 5, 5)
    m = kiln.compile(module, example_inputs=(x,), threads=1, db="")
    assert [i.name for i in m.inputs] == ["input_0"], m.inputs
    want = module(x).detach().numpy()
    assert want.std() > 0.05
    got = m.run(x)[m.outputs[0].name]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    named = kiln.compile(module, example_inputs=x, input_names=["image"], threads=1, db="")
    assert [i.name for i in named.inputs] == ["image"]
    expect_error(TypeError, "example_inputs", lambda: kiln.compile(module))


@case
def options_are_checked():
    expect_error(ValueError, "precision", lambda: kiln.compile(MODEL, precision="bf16"))
    expect_error(ValueError, "select", lambda: kiln.compile(MODEL, select="fastest"))
    expect_error(TypeError, "prefer", lambda: kiln.compile(MODEL, prefer="matmul.packed"))
    expect_error(kiln.KilnError, "nosuch.impl", lambda: kiln.compile(MODEL, prefer=["nosuch.impl"], db=""))
    m = kiln.compile(MODEL, threads=1, select="measure", prefer=["matmul.packed:mr=4"], db="")
    np.testing.assert_allclose(m.run(X)["y"], Y, rtol=1e-4, atol=1e-4)


@case
def dlpack_inputs_are_read_like_numpy():
    m = kiln.compile(MODEL, threads=1, db="")
    from_numpy = m.run({"x": X})
    from_torch = m.run({"x": torch.from_numpy(X.copy())})
    np.testing.assert_array_equal(from_torch["y"], from_numpy["y"])
    # A transposed (non-contiguous) tensor is read through a copy.
    xt = torch.from_numpy(X.T.copy()).t()
    assert not xt.is_contiguous()
    np.testing.assert_array_equal(m.run({"x": xt})["y"], from_numpy["y"])
    expect_error(kiln.KilnError, "dtype", lambda: m.run({"x": torch.from_numpy(X.astype(np.float64))}))


@case
def outputs_are_written_into_the_callers_buffers():
    m = kiln.compile(MODEL, threads=1, db="")
    want = m.run({"x": X})
    for offset in (0, 16):  # in place, and copied in (not 64-byte aligned)
        y = aligned_empty((6, 48), np.float32, offset)
        y.fill(np.nan)
        out = m.run({"x": X}, outputs={"y": y})
        assert out["y"] is y
        np.testing.assert_array_equal(y, want["y"])
        np.testing.assert_array_equal(out["z"], want["z"])
    t = torch.full((6, 48), float("nan"))
    z = torch.full((6, 48), float("nan"))
    out = m.run({"x": torch.from_numpy(X)}, outputs={"y": t, "z": z})
    assert out["y"] is t and out["z"] is z
    np.testing.assert_array_equal(t.numpy(), want["y"])
    np.testing.assert_array_equal(z.numpy(), want["z"])


@case
def output_buffer_errors_name_the_output():
    m = kiln.compile(MODEL, threads=1, db="")
    good = np.empty((6, 48), np.float32)
    expect_error(kiln.KilnError, "output 'y': the buffer given is f32[6,47]",
                 lambda: m.run(X, outputs={"y": np.empty((6, 47), np.float32)}))
    expect_error(kiln.KilnError, "output 'y': the buffer given is f64[6,48]",
                 lambda: m.run(X, outputs={"y": np.empty((6, 48), np.float64)}))
    expect_error(kiln.KilnError, "not C-contiguous",
                 lambda: m.run(X, outputs={"y": np.empty((48, 6), np.float32).T}))
    ro = np.empty((6, 48), np.float32)
    ro.flags.writeable = False
    expect_error(kiln.KilnError, "read-only", lambda: m.run(X, outputs={"y": ro}))
    expect_error(kiln.KilnError, "no output 'w'", lambda: m.run(X, outputs={"w": good}))
    expect_error(TypeError, "numpy array or an object with __dlpack__", lambda: m.run(X, outputs={"y": [0.0]}))
    expect_error(kiln.KilnError, "not contiguous", lambda: m.run(X, outputs={"y": torch.empty(48, 6).t()}))
    shared = np.empty((6, 48), np.float32)
    expect_error(kiln.KilnError, "overlaps output", lambda: m.run(X, outputs={"y": shared, "z": shared}))


@case
def an_output_buffer_may_not_overlap_an_input():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])])
    m = kiln.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), threads=1, db="")
    x = aligned_empty((8, 16), np.float32)
    x[...] = RNG.standard_normal((8, 16))
    expect_error(kiln.KilnError, "overlaps input 'x'", lambda: m.run({"x": x}, outputs={"y": x}))


@case
def data_dependent_outputs_are_copied_in():
    # NonZero's output shape is known only after it ran: the buffer gets a copy.
    graph = helper.make_graph([helper.make_node("NonZero", ["x"], ["idx"])], "nz",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("idx", TensorProto.INT64, [2, "n"])])
    m = kiln.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), threads=1, db="")
    x = np.array([[0, 1, 0, 2], [3, 0, 0, 0], [0, 0, 4, 5]], np.float32)
    want = np.array(np.nonzero(x), np.int64)
    buf = aligned_empty(want.shape, np.int64)
    out = m.run({"x": x}, outputs={"idx": buf})
    assert out["idx"] is buf
    np.testing.assert_array_equal(buf, want)
    expect_error(kiln.KilnError, "output 'idx': the buffer given is i64[2,4]",
                 lambda: m.run({"x": x}, outputs={"idx": np.empty((2, 4), np.int64)}))


@case
def profile_reports_the_kernels():
    m = kiln.compile(MODEL, threads=1, db="")
    report = m.profile(runs=2)
    assert "ms/run" in report and "kiln_k" in report, report
    assert m.profile({"x": X}, runs=1).startswith("total")
    feeds = m.random_inputs(seed=3)
    assert feeds["x"].shape == (6, 64) and feeds["x"].dtype == np.float32
    expect_error(ValueError, "runs", lambda: m.profile(runs=0))


def check_trace(path, runs):
    """A Chrome trace: caller spans for every instruction of every run, kernels carrying their
    node, implementation, knobs and workload key; worker chunks on other threads."""
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    caller = [e for e in spans if not e["cat"].endswith("chunk")]
    kernels = [e for e in caller if e["cat"] == "kernel"]
    assert kernels and len(caller) % runs == 0, (len(caller), runs)
    callers = {e["tid"] for e in caller}
    assert len(callers) == 1, callers
    for e in spans:
        assert e["ts"] >= 0 and e["dur"] >= 0, e
    for e in kernels:
        assert e["name"].startswith("kiln_k"), e
        args = e["args"]
        assert args["node"] and args["impl"], e
        assert "knobs" in args, e
        assert re.fullmatch(r"[0-9a-f]{64}", args["workload"]), e
    for e in spans:
        if e["cat"].endswith("chunk"):
            assert e["tid"] not in callers, e
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert set(names) == {e["tid"] for e in spans}, names
    return kernels


@case
def profile_writes_a_trace():
    m = kiln.compile(MODEL, threads=2, db="")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        report = m.profile(runs=3, path=path)
        assert "ms/run" in report
        kernels = check_trace(path, 3)
        assert {e["name"] for e in kernels} <= set(re.findall(r"kiln_k\d+_\w+", report)), report
        expect_error(kiln.KilnError, "cannot write the trace",
                     lambda: m.profile(runs=1, path=os.path.join(tmp, "no", "such", "dir.json")))


@case
def kiln_profile_writes_a_trace():
    with tempfile.TemporaryDirectory() as tmp:
        model, path = os.path.join(tmp, "dense.onnx"), os.path.join(tmp, "trace.json")
        onnx.save(MODEL, model)
        out = subprocess.run([ARGS.kiln, "profile", model, "--threads", "2", "--runs", "2", "-o", path],
                             check=True, capture_output=True, text=True).stdout
        assert "trace of 2 runs written to" in out, out
        check_trace(path, 2)


def run_in_terminal(argv):
    """argv's output (stdout and stderr) as a terminal shows it (a pseudo-terminal)."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:
        os.environ["KILN_DB"] = "off"
        os.execv(argv[0], argv)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (status, out[-500:])
    return out.decode()


@case
def kiln_shows_progress_on_a_terminal():
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "dense.onnx")
        onnx.save(MODEL, model)
        argv = [ARGS.kiln, "bench", model, "--runs", "3", "--warmup", "1", "--threads", "1"]
        shown = run_in_terminal(argv)
        for stage in ("import", "graph passes", "kernel choice", "code generation", "memory plan"):
            assert f"\r\x1b[Kkiln: compiling dense.onnx: {stage}" in shown, (stage, shown[:400])
        assert "kiln: bench: warm-up 1/1" in shown and "kiln: bench: run 3/3" in shown, shown[-400:]
        # The line is cleared before the results: what follows the last clear is the report alone.
        after = shown.rsplit("\r\x1b[K", 1)[1]
        assert after.lstrip().startswith("model") and "kiln: " not in after, after[:200]
        piped = subprocess.run(argv, check=True, capture_output=True, text=True)
        assert "kiln: compiling" not in piped.stderr and "\x1b" not in piped.stdout + piped.stderr, piped.stderr


def dynamic_model():
    """A symbolic batch n: y = relu(x @ W + B), the top 3 of each row (TopK: a host kernel), and
    an If on an input choosing y * 2 or -y."""
    then_g = helper.make_graph([helper.make_node("Mul", ["y", "two"], ["o"])], "then", [],
                               [helper.make_tensor_value_info("o", TensorProto.FLOAT, ["n", 48])])
    else_g = helper.make_graph([helper.make_node("Neg", ["y"], ["o"])], "else", [],
                               [helper.make_tensor_value_info("o", TensorProto.FLOAT, ["n", 48])])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["pre"]),
         helper.make_node("Relu", ["pre"], ["y"]), helper.make_node("TopK", ["y", "k"], ["top", "idx"]),
         helper.make_node("If", ["c"], ["z"], then_branch=then_g, else_branch=else_g)],
        "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("top", TensorProto.FLOAT, ["n", 3]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, ["n", 3]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 48])],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b"),
         numpy_helper.from_array(np.array(2, np.float32), "two"), numpy_helper.from_array(np.array([3], np.int64), "k")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@case
def a_package_runs_like_the_compiled_model():
    with tempfile.TemporaryDirectory() as tmp:
        compiled = kiln.compile(dynamic_model(), threads=2, db="")
        path = os.path.join(tmp, "dynamic.kiln")
        compiled.save(path)
        loaded = kiln.load(path, threads=2)
        assert [(i.name, i.dims) for i in loaded.inputs] == [("x", ["n", "64"]), ("c", [])], loaded.inputs
        assert [o.name for o in loaded.outputs] == ["top", "idx", "z"]
        meta = loaded.package_metadata
        assert meta["kiln_version"] == kiln.__version__ and meta["inputs"][0]["dims"] == ["n", "64"], meta
        assert compiled.package_metadata is None and loaded.graph_text() == ""
        assert meta["empty_dims_program"] is True and meta["target_key"].startswith("isa="), meta
        for n in (1, 5, 33, 0):
            for c in (True, False):
                feeds = {"x": RNG.standard_normal((n, 64)).astype(np.float32), "c": np.array(c)}
                want, got = compiled.run(feeds), loaded.run(feeds)
                for name in want:
                    assert want[name].shape == got[name].shape and np.array_equal(want[name], got[name]), (n, c, name)
                y = np.maximum(feeds["x"] @ W + B, 0)
                np.testing.assert_allclose(got["z"], y * 2 if c else -y, rtol=1e-4, atol=1e-4)
        expect_error(kiln.KilnError, "missing input 'c'", lambda: loaded.run({"x": X}))
        expect_error(kiln.KilnError, "copy that file", lambda: loaded.save(os.path.join(tmp, "again.kiln")))
        # Runs from several threads at once, on two loads of the one file: each as a serial run.
        import concurrent.futures
        other = kiln.load(path, threads=1)
        feeds = [{"x": RNG.standard_normal((7, 64)).astype(np.float32), "c": np.array(i % 2 == 0)} for i in range(8)]
        serial = [compiled.run(f)["z"] for f in feeds]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            parallel = list(pool.map(lambda i: (loaded if i % 2 else other).run(feeds[i])["z"], range(8)))
        assert all(np.array_equal(a, b) for a, b in zip(serial, parallel))


@case
def bad_packages_are_refused():
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = os.path.join(tmp, "dense.onnx")
        onnx.save(MODEL, onnx_path)
        expect_error(kiln.KilnError, "is not a Kiln package", lambda: kiln.load(onnx_path))
        expect_error(kiln.KilnError, "cannot open package", lambda: kiln.load(os.path.join(tmp, "none.kiln")))
        path = os.path.join(tmp, "dense.kiln")
        kiln.compile(MODEL, threads=1, db="").save(path)
        data = open(path, "rb").read()
        with open(os.path.join(tmp, "cut.kiln"), "wb") as f:
            f.write(data[:len(data) // 2])
        expect_error(kiln.KilnError, "is truncated", lambda: kiln.load(os.path.join(tmp, "cut.kiln")))
        edited = bytearray(data)
        edited[-5] ^= 1
        with open(os.path.join(tmp, "edited.kiln"), "wb") as f:
            f.write(edited)
        expect_error(kiln.KilnError, "checksum does not match", lambda: kiln.load(os.path.join(tmp, "edited.kiln")))
        # A failed save leaves what was there.
        expect_error(kiln.KilnError, "cannot write", lambda: kiln.compile(MODEL, db="").save(os.path.join(tmp, "no", "x.kiln")))


@case
def the_commands_take_a_package():
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "dynamic.onnx")
        onnx.save(dynamic_model(), model)
        package = os.path.join(tmp, "dynamic.kiln")
        out = subprocess.run([ARGS.kiln, "compile", model, "-o", package, "--threads", "1"], check=True,
                             capture_output=True, text=True).stdout
        assert out.startswith("wrote " + package), out
        runs = {}
        for source in (model, package):
            d = os.path.join(tmp, os.path.basename(source) + ".out")
            subprocess.run([ARGS.kiln, "run", source, "--dim", "n=9", "--threads", "1", "--output-dir", d], check=True,
                           capture_output=True)
            runs[source] = {f: np.load(os.path.join(d, f)) for f in sorted(os.listdir(d))}
        assert runs[model].keys() == runs[package].keys() and len(runs[model]) == 3
        for name in runs[model]:
            assert np.array_equal(runs[model][name], runs[package][name]), name
        bench = json.loads(subprocess.run([ARGS.kiln, "bench", package, "--runs", "2", "--dim", "n=4", "--json"],
                                          check=True, capture_output=True, text=True).stdout)
        assert bench["median_ms"] > 0 and bench["num_kernels"] >= 1, bench
        info = subprocess.run([ARGS.kiln, "info", package, "--kernels"], check=True, capture_output=True, text=True).stdout
        assert info.startswith("package: " + package) and '"cpu_features"' in info and "kiln_k" in info, info
        trace = os.path.join(tmp, "trace.json")
        subprocess.run([ARGS.kiln, "profile", package, "--runs", "2", "-o", trace], check=True, capture_output=True)
        check_trace(trace, 2)
        refused = subprocess.run([ARGS.kiln, "run", package, "--select", "measure"], capture_output=True, text=True)
        assert refused.returncode == 2 and "--select does not apply to the package" in refused.stderr, refused.stderr


@case
def returned_outputs_are_kilns_memory_kept_alive():
    """Outputs come back without a copy (the array holds Kiln's buffer) and stay valid while
    later runs reuse the model's pool, static and symbolic shapes alike."""
    for model in (MODEL, dynamic_model()):
        m = kiln.compile(model, threads=1, db="")
        feeds = [{"x": RNG.standard_normal((6, 64)).astype(np.float32), "c": np.array(True)} for _ in range(3)]
        feeds = [{k: v for k, v in f.items() if k in {i.name for i in m.inputs}} for f in feeds]
        first = m.run(feeds[0])
        kept = {k: v.copy() for k, v in first.items()}
        for name, arr in first.items():
            assert not arr.flags["OWNDATA"] and arr.base is not None, name
        for f in feeds[1:]:
            m.run(f)
        for name in first:
            assert np.array_equal(first[name], kept[name]), f"output {name} changed under a later run"
        del first
        again = m.run(feeds[0])
        for name in kept:
            assert np.array_equal(again[name], kept[name]), name


def main():
    print("kiln", kiln.__version__, "from", os.path.dirname(kiln.__file__))
    if FAILURES:
        print("failed:", ", ".join(FAILURES))
        sys.exit(1)
    print("all cases passed")


if __name__ == "__main__":
    main()
