#!/usr/bin/env python3
"""Control flow (If, Loop, Scan) side by side with ONNX Runtime, per iteration.

Generates four models whose time is their loops (onnx.helper, opset 17, conditioned
weights so the states neither vanish nor saturate), checks Kiln's outputs against ONNX
Runtime's, then times both in one run, alternating (kiln, ort, ort, kiln per round):

    rnn_loop     Loop of T steps: h = tanh(h W + x[i]), x captured and gathered by the
                 iteration number; h carried, every h a scan output
    if_in_loop   Loop of T steps with an If on the iteration's parity: relu(h W1) or
                 sigmoid(h W2)
    scan_cumsum  Scan over x[T, 64]: s = s + x_t, scan output s * s (a tiny body: the
                 per-iteration overhead)
    while_grow   Loop without a trip count: v = concat(v, 0.5 v) while len(v) < N (the
                 carried value changes shape every iteration)

    bench_control_flow.py [--kiln BUILD/bin/kiln] [--threads 1] [--runs 20] [--warmup 3]
                          [--rounds 2] [--cache-dir DIR] [--json FILE]

Prints a Markdown table: milliseconds per run, microseconds per iteration, Kiln/ORT.
"""

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "models"))
sys.path.insert(0, HERE)
import model_zoo  # noqa: E402
from bench_models import bench_kiln, bench_ort, DEFAULT_KILN  # noqa: E402


def _onnx():
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    return onnx, TensorProto, helper, numpy_helper


def weight(rng, shape, gain):
    # Scaled so that h W keeps h's spread: tanh and sigmoid stay out of saturation.
    return (rng.standard_normal(shape) * gain / np.sqrt(shape[0])).astype(np.float32)


def rnn_loop(rng, hidden=256, steps=200):
    onnx, TP, h, nh = _onnx()
    w = nh.from_array(weight(rng, (hidden, hidden), 1.0), "w")
    body = h.make_graph(
        [h.make_node("Gather", ["x", "i"], ["xi"], axis=0),
         h.make_node("MatMul", ["h_in", "w"], ["hw"]),
         h.make_node("Add", ["hw", "xi"], ["pre"]),
         h.make_node("Tanh", ["pre"], ["h_out"]),
         h.make_node("Identity", ["cond_in"], ["cond_out"]),
         h.make_node("Identity", ["h_out"], ["h_scan"])],
        "body",
        [h.make_tensor_value_info("i", TP.INT64, []), h.make_tensor_value_info("cond_in", TP.BOOL, []),
         h.make_tensor_value_info("h_in", TP.FLOAT, [1, hidden])],
        [h.make_tensor_value_info("cond_out", TP.BOOL, []), h.make_tensor_value_info("h_out", TP.FLOAT, [1, hidden]),
         h.make_tensor_value_info("h_scan", TP.FLOAT, [1, hidden])])
    g = h.make_graph(
        [h.make_node("Loop", ["m", "", "h0"], ["h_final", "hs"], body=body)], "rnn_loop",
        [h.make_tensor_value_info("m", TP.INT64, []), h.make_tensor_value_info("h0", TP.FLOAT, [1, hidden]),
         h.make_tensor_value_info("x", TP.FLOAT, [steps, 1, hidden])],
        [h.make_tensor_value_info("h_final", TP.FLOAT, [1, hidden]),
         h.make_tensor_value_info("hs", TP.FLOAT, [steps, 1, hidden])],
        [w])
    feeds = {"m": np.array(steps, np.int64), "h0": rng.standard_normal((1, hidden)).astype(np.float32),
             "x": rng.standard_normal((steps, 1, hidden)).astype(np.float32)}
    return g, feeds, steps


def if_in_loop(rng, hidden=128, steps=200):
    onnx, TP, h, nh = _onnx()
    w1 = nh.from_array(weight(rng, (hidden, hidden), 1.0), "w1")
    w2 = nh.from_array(weight(rng, (hidden, hidden), 2.0), "w2")
    two = nh.from_array(np.array(2, np.int64), "two")
    zero = nh.from_array(np.array(0, np.int64), "zero")
    out = lambda name: h.make_tensor_value_info(name, TP.FLOAT, [1, hidden])  # noqa: E731
    then_g = h.make_graph([h.make_node("MatMul", ["h_in", "w1"], ["a"]), h.make_node("Relu", ["a"], ["t"])],
                          "then", [], [out("t")])
    else_g = h.make_graph([h.make_node("MatMul", ["h_in", "w2"], ["b"]), h.make_node("Sigmoid", ["b"], ["e"])],
                          "else", [], [out("e")])
    body = h.make_graph(
        [h.make_node("Mod", ["i", "two"], ["r"]),
         h.make_node("Equal", ["r", "zero"], ["even"]),
         h.make_node("If", ["even"], ["h_out"], then_branch=then_g, else_branch=else_g),
         h.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [h.make_tensor_value_info("i", TP.INT64, []), h.make_tensor_value_info("cond_in", TP.BOOL, []), out("h_in")],
        [h.make_tensor_value_info("cond_out", TP.BOOL, []), out("h_out")],
        [two, zero])
    g = h.make_graph(
        [h.make_node("Loop", ["m", "", "h0"], ["h_final"], body=body)], "if_in_loop",
        [h.make_tensor_value_info("m", TP.INT64, []), out("h0")], [out("h_final")], [w1, w2])
    feeds = {"m": np.array(steps, np.int64), "h0": np.abs(rng.standard_normal((1, hidden))).astype(np.float32)}
    return g, feeds, steps


def scan_cumsum(rng, width=64, steps=1000):
    onnx, TP, h, nh = _onnx()
    body = h.make_graph(
        [h.make_node("Add", ["s_in", "x_t"], ["s_out"]), h.make_node("Mul", ["s_out", "s_out"], ["sq"])],
        "body",
        [h.make_tensor_value_info("s_in", TP.FLOAT, [width]), h.make_tensor_value_info("x_t", TP.FLOAT, [width])],
        [h.make_tensor_value_info("s_out", TP.FLOAT, [width]), h.make_tensor_value_info("sq", TP.FLOAT, [width])])
    g = h.make_graph(
        [h.make_node("Scan", ["s0", "x"], ["s", "squares"], body=body, num_scan_inputs=1)], "scan_cumsum",
        [h.make_tensor_value_info("s0", TP.FLOAT, [width]), h.make_tensor_value_info("x", TP.FLOAT, [steps, width])],
        [h.make_tensor_value_info("s", TP.FLOAT, [width]), h.make_tensor_value_info("squares", TP.FLOAT, [steps, width])])
    feeds = {"s0": np.zeros(width, np.float32),
             "x": (rng.standard_normal((steps, width)) / np.sqrt(steps)).astype(np.float32)}
    return g, feeds, steps


def while_grow(rng, limit=4096):
    onnx, TP, h, nh = _onnx()
    half = nh.from_array(np.array(0.5, np.float32), "half")
    lim = nh.from_array(np.array(limit, np.int64), "limit")
    body = h.make_graph(
        [h.make_node("Mul", ["v_in", "half"], ["hv"]),
         h.make_node("Concat", ["v_in", "hv"], ["v_out"], axis=0),
         h.make_node("Shape", ["v_out"], ["shp"]),
         h.make_node("ReduceProd", ["shp"], ["n"], keepdims=0),
         h.make_node("Less", ["n", "limit"], ["cond_out"])],
        "body",
        [h.make_tensor_value_info("i", TP.INT64, []), h.make_tensor_value_info("cond_in", TP.BOOL, []),
         h.make_tensor_value_info("v_in", TP.FLOAT, ["n_in"])],
        [h.make_tensor_value_info("cond_out", TP.BOOL, []), h.make_tensor_value_info("v_out", TP.FLOAT, ["n_out"])],
        [half, lim])
    g = h.make_graph(
        [h.make_node("Loop", ["", "go", "v0"], ["v"], body=body)], "while_grow",
        [h.make_tensor_value_info("go", TP.BOOL, []), h.make_tensor_value_info("v0", TP.FLOAT, [4])],
        [h.make_tensor_value_info("v", TP.FLOAT, ["n"])])
    feeds = {"go": np.array(True), "v0": rng.standard_normal(4).astype(np.float32)}
    iterations = int(np.log2(limit // 4))
    return g, feeds, iterations


MODELS = [("rnn_loop", rnn_loop), ("if_in_loop", if_in_loop), ("scan_cumsum", scan_cumsum),
          ("while_grow", while_grow)]


def save(graph, path):
    onnx, TP, h, nh = _onnx()
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def check_against_ort(path, feeds):
    """Kiln's outputs (Python bindings) against ONNX Runtime's; the reference must have spread."""
    import kiln
    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    outputs = kiln.compile(path, threads=1).run(feeds)
    got = [outputs[o.name] for o in sess.get_outputs()]
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        if g.shape != w.shape:
            raise AssertionError(f"{path}: output {k} has shape {g.shape}, ORT {w.shape}")
        if w.size > 1 and float(np.std(w)) < 1e-3:
            raise AssertionError(f"{path}: ORT's output {k} has no spread (std {np.std(w):.2e}): no information")
        err = float(np.max(np.abs(g - w))) / max(float(np.max(np.abs(w))), 1e-6)
        if err > 1e-4:
            raise AssertionError(f"{path}: output {k} differs from ORT's by {err:.2e} (relative to its max)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default=DEFAULT_KILN)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    work = os.path.join(model_zoo.cache_dir(args.cache_dir), "control_flow")
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(0)
    rows, results = [], []
    for name, make in MODELS:
        graph, feeds, iterations = make(rng)
        path = os.path.join(work, f"{name}.onnx")
        save(graph, path)
        check_against_ort(path, feeds)
        kiln_ms, ort_ms = [], []
        for _ in range(args.rounds):
            kiln_ms.append(bench_kiln(args.kiln, path, feeds, args.threads, args.runs, args.warmup, work)["median_ms"])
            ort_ms.append(bench_ort(path, feeds, args.threads, args.runs, args.warmup)["median_ms"])
            ort_ms.append(bench_ort(path, feeds, args.threads, args.runs, args.warmup)["median_ms"])
            kiln_ms.append(bench_kiln(args.kiln, path, feeds, args.threads, args.runs, args.warmup, work)["median_ms"])
        k, o = min(kiln_ms), min(ort_ms)
        r = {"model": name, "threads": args.threads, "iterations": iterations, "kiln_ms": k, "ort_ms": o}
        results.append(r)
        rows.append(f"| {name} | {iterations} | {k:.3f} | {o:.3f} | {1e3 * k / iterations:.2f} | "
                    f"{1e3 * o / iterations:.2f} | {k / o:.2f} |")
        print(rows[-1], file=sys.stderr, flush=True)
    print(f"\n{args.threads} thread(s); fastest median of {args.runs} runs over {args.rounds} alternating rounds; "
          "outputs checked against ONNX Runtime first\n")
    print("| model | iterations | kiln ms | ORT ms | kiln us/iter | ORT us/iter | kiln/ORT |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
