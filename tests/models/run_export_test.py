#!/usr/bin/env python3
"""`kiln opt MODEL -o out.onnx` (no other flag) writes a valid ONNX model that
computes what the original computes.

    run_export_test.py --kiln PATH [--cache-dir DIR] [--models a,b]

For every zoo model named (exported into the cache if missing) and a few generated
graphs (Conv+BatchNorm, parallel projections of one input, a dynamic reshape chain):
the optimized export (the default pipeline without its kiln-only passes, select-kernels,
project-rnn-inputs and block-layout, whose weight and activation layouts ONNX lacks: block-layout's
are Kiln's own ops, domain kiln) must pass onnx.checker (full check, with shape inference), must have no more
nodes than the original (fewer for the generated graphs and the transformers, which hold
identities, shape arithmetic and foldable scales), and must give the
same outputs as the original in ONNX Runtime on the same inputs (within the zoo model's
tolerance), for every symbolic binding tried. Outputs are checked for spread first.
Exit code 0 pass, 1 failure.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_zoo  # noqa: E402
from export_models import ensure_exported  # noqa: E402


def generated_models(tmp):
    rng = np.random.default_rng(7)
    out = []

    def const(name, shape, scale=1.0):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    # Conv -> BatchNormalization -> Relu -> Identity -> Reshape to its own shape.
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["bn"], epsilon=1e-3),
             helper.make_node("Relu", ["bn"], ["r"]),
             helper.make_node("Identity", ["r"], ["i"]),
             helper.make_node("Shape", ["i"], ["sh"]),
             helper.make_node("Reshape", ["i", "sh"], ["y"])]
    var = numpy_helper.from_array(rng.uniform(0.5, 2.0, 4).astype(np.float32), "v")
    g = helper.make_graph(nodes, "conv_bn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [const("w", (4, 3, 3, 3), 0.3), const("b", (4,)), const("s", (4,)),
                           const("bb", (4,)), const("m", (4,)), var])
    out.append(("conv_bn", g, {"n": [1, 3]}))

    # Q/K/V projections of one input, a scale, transposes that cancel, a reshape round trip.
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]),
             helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("MatMul", ["x", "wv"], ["v"]),
             helper.make_node("Mul", ["q", "scale"], ["qs"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("Transpose", ["kt"], ["ktt"], perm=[0, 2, 1]),
             helper.make_node("Add", ["qs", "ktt"], ["a"]),
             helper.make_node("Reshape", ["a", "minus1"], ["flat"]),
             helper.make_node("Shape", ["v"], ["vs"]),
             helper.make_node("Reshape", ["flat", "vs"], ["back"]),
             helper.make_node("Mul", ["back", "v"], ["y"])]
    g = helper.make_graph(nodes, "qkv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [const("wq", (16, 16), 0.25), const("wk", (16, 16), 0.25), const("wv", (16, 16), 0.25),
                           numpy_helper.from_array(np.array(0.5, np.float32), "scale"),
                           numpy_helper.from_array(np.array([-1], np.int64), "minus1")])
    out.append(("qkv", g, {"b": [1, 2], "s": [1, 5]}))
    paths = []
    for name, graph, dims in out:
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        path = os.path.join(tmp, name + ".onnx")
        onnx.save(model, path)
        paths.append((name, path, dims, 1e-5, 1e-4, True))
    return paths


def bindings(model, dims):
    """Input feeds for each binding of the symbolic dims (dims: name -> list of values)."""
    rng = np.random.default_rng(1)
    count = max([len(v) for v in dims.values()] or [1])
    feeds = []
    for k in range(count):
        feed = {}
        for vi in model.graph.input:
            shape = []
            for d in vi.type.tensor_type.shape.dim:
                shape.append(d.dim_value if d.HasField("dim_value") else dims[d.dim_param][k % len(dims[d.dim_param])])
            feed[vi.name] = rng.standard_normal(shape).astype(np.float32)
        feeds.append(feed)
    return feeds


def run_ort(path, feed):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


def check(kiln, name, path, feeds, atol, rtol, must_shrink, tmp):
    out_path = os.path.join(tmp, name + ".opt.onnx")
    proc = subprocess.run([kiln, "opt", path, "-o", out_path], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"FAIL {name}: kiln opt exited {proc.returncode}: {proc.stderr.strip()}")
        return False
    try:
        onnx.checker.check_model(out_path, full_check=True)
    except Exception as exc:  # noqa: BLE001 (any checker complaint fails the case)
        print(f"FAIL {name}: onnx.checker: {str(exc).splitlines()[0]}")
        return False
    before = len(onnx.load(path, load_external_data=False).graph.node)
    after = len(onnx.load(out_path).graph.node)
    ok = after < before if must_shrink else after <= before
    if not ok:
        print(f"FAIL {name}: {before} nodes before, {after} after")
    for feed in feeds:
        ref = run_ort(path, feed)
        got = run_ort(out_path, feed)
        shapes = {k: v.shape for k, v in feed.items()}
        for i, (r, o) in enumerate(zip(ref, got)):
            if r.dtype.kind == "f" and r.size > 1 and float(np.std(r)) < 1e-6:
                print(f"FAIL {name} output {i}: reference has no spread (std {np.std(r):.2e})")
                ok = False
            if r.shape != o.shape:
                print(f"FAIL {name} output {i} {shapes}: shape {o.shape} vs {r.shape}")
                ok = False
                continue
            err = np.abs(o.astype(np.float64) - r.astype(np.float64))
            bad = err > atol + rtol * np.abs(r.astype(np.float64))
            if bad.any():
                print(f"FAIL {name} output {i} {shapes}: max abs err {err.max():.3e}")
                ok = False
        print(f"{'ok  ' if ok else 'FAIL'} {name} {shapes}: {before} -> {after} nodes")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--models", default="resnet18,mobilenet_v2,bert,gpt2,lstm")
    args = ap.parse_args()
    ok = True
    with tempfile.TemporaryDirectory(prefix="kiln-export-") as tmp:
        cases = generated_models(tmp)
        for name in [m for m in args.models.split(",") if m]:
            spec = model_zoo.MODELS_BY_NAME[name]
            path = ensure_exported(spec, args.cache_dir, quiet=True)
            cases.append((name, path, {}, spec.atol, spec.rtol, spec.kind != "vision"))
        for name, path, dims, atol, rtol, must_shrink in cases:
            model = onnx.load(path, load_external_data=False)
            if name in model_zoo.MODELS_BY_NAME:
                spec = model_zoo.MODELS_BY_NAME[name]
                feeds = [model_zoo.make_inputs(spec, s) for s in (spec.seq_lengths if spec.kind != "vision" else [None])]
            else:
                feeds = bindings(model, dims)
            ok &= check(args.kiln, name, path, feeds, atol, rtol, must_shrink, tmp)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
