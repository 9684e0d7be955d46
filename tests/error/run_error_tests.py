#!/usr/bin/env python3
"""Malformed and adversarial models must give a clear error, never a crash.

Each case is run through the CLI (`kiln run` / `kiln info`: exit code 2, no signal, the
message names the file, node, op or input) and through the Python module (kiln.KilnError
with such a message). Python cases run in a child process, so a crash is reported as a
failure of that case instead of killing the runner.

    run_error_tests.py --kiln BUILD/bin/kiln [--work DIR] [-k REGEX] [--cli-only|--python-only]
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _model(nodes, inputs, outputs, initializers=(), opset=17, extra_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in extra_opsets]
    return helper.make_model(graph, opset_imports=opsets)


def _relu_model(shape=(2, 3)):
    return _model([helper.make_node("Relu", ["x"], ["y"], name="relu0")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))])


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)
    return path


class Case:
    """One model file. `expect`: groups of alternatives; every group must have one
    alternative in the message (case-insensitive). `{file}` is the model's base name.
    `when`: "compile" (compiling/describing fails) or "run" (the given feeds fail)."""

    def __init__(self, name, make, expect, when="compile", feeds=None, cli_args=(), info=True,
                 max_memory=None):
        self.name, self.make, self.expect, self.when = name, make, expect, when
        self.feeds = feeds or {}
        self.cli_args = list(cli_args)
        self.info = info
        self.max_memory = max_memory  # bytes: --max-memory / kiln.compile(max_memory=...)


def _ext_model(work, location, offset=None, length=None, create_file=True):
    values = np.arange(6, dtype=np.float32)
    t = numpy_helper.from_array(values, "w")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    entries = {"location": location}
    if offset is not None:
        entries["offset"] = str(offset)
    if length is not None:
        entries["length"] = str(length)
    for k, v in entries.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    if create_file:
        _write(os.path.join(work, "weights.bin"), values.tobytes())
    return _model([helper.make_node("Add", ["x", "w"], ["y"], name="add_w")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])], [t])


def cases(work):
    rng = np.random.default_rng(7)
    valid = _relu_model().SerializeToString()
    big_valid = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])],
        [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")],
    ).SerializeToString()

    def unsupported():
        return _model(
            [helper.make_node("Frobnicate", ["x"], ["t"], name="frob0", domain="kiln.test"),
             helper.make_node("Relu", ["t"], ["u"], name="relu0"),
             helper.make_node("Defrobnicate", ["u"], ["y"], name="defrob0", domain="kiln.test")],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
            extra_opsets=["kiln.test"])

    def cycle():
        return _model(
            [helper.make_node("Add", ["x", "b"], ["a"], name="cycle_add"),
             helper.make_node("Relu", ["a"], ["b"], name="cycle_relu")],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])

    def dangling():
        return _model(
            [helper.make_node("Add", ["x", "nonexistent_value"], ["y"], name="add_dangling")],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])

    def huge_input():
        return _model([helper.make_node("Relu", ["huge"], ["y"], name="relu_huge")],
                      [helper.make_tensor_value_info("huge", TensorProto.FLOAT, [10**12, 10**12])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [10**12, 10**12])])

    def huge_initializer():
        # Claims 1e24 elements but carries one float: built by hand, the helper checks sizes.
        t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[10**12, 10**12])
        t.float_data.append(1.0)
        return _model([helper.make_node("Add", ["x", "w"], ["y"], name="add_huge")],
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [10**12, 10**12])], [t])

    def inconsistent(op, inputs, outputs, inits=(), **attrs):
        # Shapes that would make a kernel read out of bounds if not rejected.
        return lambda: _model([helper.make_node(op, [i[0] for i in inputs] + [t.name for t in inits],
                                                [o for o in outputs], name="bad_" + op.lower(), **attrs)],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT if t is None else t, s)
                               for n, s, t in inputs],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                              list(inits)).SerializeToString()

    def gather(op, data_shape, ind_shape, **attrs):
        return lambda: _model([helper.make_node(op, ["x", "i"], ["y"], name="gather_oob", **attrs)],
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, data_shape),
                               helper.make_tensor_value_info("i", TensorProto.INT64, ind_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
                              ).SerializeToString()

    def shape_from_input():
        # The output's size comes from the input's values: [n, n] floats.
        return _model([helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill_huge")],
                      [helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
                      ).SerializeToString()

    def loop_model(body_outputs_extra=False, gather_in_body=False, operands=("m", "", "s0")):
        # Loop(m) over s: s + data[i] (data [3], captured); with
        # body_outputs_extra the body returns one output too many. `operands`
        # ["", "c", "s0"]: no trip count, and the body passes the condition through.
        vi = helper.make_tensor_value_info
        nodes = [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                 helper.make_node("Gather", ["data", "i"], ["picked"], name="pick", axis=0),
                 helper.make_node("Add", ["s_in", "picked"], ["s_out"])]
        outs = [vi("cond_out", TensorProto.BOOL, []), vi("s_out", TensorProto.FLOAT, [])]
        if body_outputs_extra:
            outs.append(vi("picked", TensorProto.FLOAT, []))
            outs.append(vi("s_in", TensorProto.FLOAT, []))
        body = helper.make_graph(nodes, "body", [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []),
                                                 vi("s_in", TensorProto.FLOAT, [])], outs)
        loop_outs = ["s"] + (["picks"] if body_outputs_extra else [])
        graph_inputs = [vi("m", TensorProto.INT64, []), vi("c", TensorProto.BOOL, []), vi("s0", TensorProto.FLOAT, []),
                        vi("data", TensorProto.FLOAT, [3])]
        return _model([helper.make_node("Loop", list(operands), loop_outs, name="loop_bad", body=body)],
                      [v for v in graph_inputs if v.name in operands or v.name == "data"],
                      [vi(o, TensorProto.FLOAT, None) for o in loop_outs]).SerializeToString()

    def loop_scan_model():
        # Loop(m) carrying s [1000] and stacking every iteration's s.
        vi = helper.make_tensor_value_info
        body = helper.make_graph(
            [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Neg", ["s_in"], ["s_out"]),
             helper.make_node("Identity", ["s_out"], ["s_scan"])],
            "body", [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("s_in", TensorProto.FLOAT, [1000])],
            [vi("cond_out", TensorProto.BOOL, []), vi("s_out", TensorProto.FLOAT, [1000]), vi("s_scan", TensorProto.FLOAT, [1000])])
        return _model([helper.make_node("Loop", ["m", "", "s0"], ["s", "stacked"], name="loop_huge", body=body)],
                      [vi("m", TensorProto.INT64, []), vi("s0", TensorProto.FLOAT, [1000])],
                      [vi("s", TensorProto.FLOAT, None), vi("stacked", TensorProto.FLOAT, None)]).SerializeToString()

    def if_model():
        vi = helper.make_tensor_value_info
        then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [], [vi("t", TensorProto.FLOAT, [3])])
        else_g = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [], [vi("e", TensorProto.FLOAT, [3])])
        return _model([helper.make_node("If", ["c"], ["y"], name="if_bad", then_branch=then_g, else_branch=else_g)],
                      [vi("c", TensorProto.BOOL, [2]), vi("x", TensorProto.FLOAT, [3])],
                      [vi("y", TensorProto.FLOAT, None)]).SerializeToString()

    def scan_model():
        vi = helper.make_tensor_value_info
        body = helper.make_graph([helper.make_node("Add", ["a", "b"], ["ab"]), helper.make_node("Add", ["s_in", "ab"], ["s_out"])],
                                 "body", [vi("s_in", TensorProto.FLOAT, [2]), vi("a", TensorProto.FLOAT, [2]),
                                          vi("b", TensorProto.FLOAT, [2])], [vi("s_out", TensorProto.FLOAT, [2])])
        return _model([helper.make_node("Scan", ["s0", "xa", "xb"], ["s"], name="scan_bad", body=body, num_scan_inputs=2)],
                      [vi("s0", TensorProto.FLOAT, [2]), vi("xa", TensorProto.FLOAT, ["n", 2]),
                       vi("xb", TensorProto.FLOAT, ["k", 2])],
                      [vi("s", TensorProto.FLOAT, None)]).SerializeToString()

    def static_shape_overflow():
        # A constant shape: the size is known at compile time and overflows 64 bits
        # (the static memory plan must not multiply it out; found by compile_fuzzer).
        return _model([helper.make_node("ConstantOfShape", ["s"], ["t"], name="fill_static"),
                       helper.make_node("Relu", ["t"], ["y"], name="relu_static")],
                      [],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                      [ints("s", [64, 2**59 + 1])]).SerializeToString()

    def image_decoder():
        return _model([helper.make_node("ImageDecoder", ["b"], ["y"], name="decode_img")],
                      [helper.make_tensor_value_info("b", TensorProto.UINT8, [None])],
                      [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                      opset=20).SerializeToString()

    # Each format's bytes cut to 60% (and unrecognizable bytes): an error naming
    # the node and the format at run time, never a crash.
    image_cases = []
    for fmt, name in [("jpeg", "JPEG"), ("jpeg2k", "JPEG 2000"), ("png", "PNG"), ("tiff", "TIFF"),
                      ("webp", "WebP"), ("bmp", "BMP"), ("pnm", "PNM")]:
        data = _image_bytes(fmt)
        _EXTRA_NPY[f"img_{fmt}"] = data[: len(data) * 3 // 5]
        image_cases.append(Case(f"image_truncated_{fmt}", image_decoder,
                                [["decode_img"], [f"malformed {name} image"]], when="run",
                                feeds={"b": _EXTRA_NPY[f"img_{fmt}"]}, cli_args=[f"b=img_{fmt}"]))
    _EXTRA_NPY["img_unknown"] = np.frombuffer(b"GIF89a" + bytes(40), np.uint8)
    image_cases.append(Case("image_unknown_format", image_decoder, [["decode_img"], ["not recognized"]],
                            when="run", feeds={"b": _EXTRA_NPY["img_unknown"]}, cli_args=["b=img_unknown"]))

    f32 = np.ones((2, 3), np.float32)
    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    return [
        Case("batchnorm_param_shape",
             inconsistent("BatchNormalization",
                          [("x", [1, 3, 4, 4], None), ("s", [2], None), ("b", [3], None),
                           ("m", [3], None), ("v", [3], None)], ["y"]),
             [["{file}"], ["bad_batchnormalization"], ["scale"]], info=False),
        Case("split_sizes_exceed_axis",
             inconsistent("Split", [("x", [3], None)], ["y", "z"], [ints("sizes", [1, 5])], axis=0),
             [["{file}"], ["bad_split"], ["sum"]], info=False),
        Case("gather_float_indices",
             inconsistent("Gather", [("x", [3, 4], None), ("i", [2], TensorProto.FLOAT)], ["y"]),
             [["{file}"], ["bad_gather"], ["indices"]], info=False),
        Case("conv_channel_mismatch",
             inconsistent("Conv", [("x", [1, 3, 8, 8], None), ("w", [4, 5, 3, 3], None)], ["y"]),
             [["{file}"], ["bad_conv"], ["channels"]], info=False),
        # kernel_shape [1, 1] against a 3x3 weight: the output would be sized for
        # a window the kernel does not read (grouped, it read past its products).
        Case("conv_kernel_shape_mismatch",
             inconsistent("Conv", [("x", [1, 8, 9, 9], None)], ["y"],
                          [numpy_helper.from_array(np.ones((8, 4, 3, 3), np.float32), "w")],
                          group=2, kernel_shape=[1, 1]),
             [["{file}"], ["bad_conv"], ["kernel_shape"]], info=False),
        Case("matmul_inner_mismatch",
             inconsistent("MatMul", [("a", [3, 4], None), ("b", [5, 6], None)], ["y"]),
             [["{file}"], ["bad_matmul"]], info=False),
        Case("opset_too_new",
             lambda: _model([helper.make_node("Relu", ["x"], ["y"], name="relu_new")],
                            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                            opset=99).SerializeToString(),
             [["{file}"], ["opset 99"]], info=False),
        Case("mixed_dtypes",
             inconsistent("Add", [("a", [3], None), ("b", [3], TensorProto.INT64)], ["y"]),
             [["{file}"], ["bad_add"], ["dtype"]], info=False),
        Case("truncated", lambda: big_valid[: len(big_valid) // 2], [["{file}"]]),
        Case("random_bytes", lambda: rng.bytes(4096), [["{file}"]]),
        Case("empty_file", lambda: b"", [["{file}"]]),
        Case("missing_file", None, [["{file}"]]),
        Case("unsupported_ops", lambda: unsupported().SerializeToString(),
             [["Frobnicate"], ["Defrobnicate"]], info=False),
        Case("cycle", lambda: cycle().SerializeToString(),
             [["{file}"], ["cycle_add", "cycle_relu"]]),
        Case("dangling_input", lambda: dangling().SerializeToString(),
             [["{file}"], ["nonexistent_value"]]),
        Case("huge_dims_input", lambda: huge_input().SerializeToString(), [["huge"]],
             when="compile_or_run", feeds={"huge": f32}, info=False),
        Case("huge_dims_initializer", lambda: huge_initializer().SerializeToString(),
             [["{file}"], ["w"]]),
        Case("bad_external_data_missing",
             lambda: _ext_model(work, "missing.bin", create_file=False).SerializeToString(),
             [["{file}"], ["missing.bin"]]),
        Case("bad_external_data_escape",
             lambda: _ext_model(work, "../../../../etc/passwd").SerializeToString(),
             [["{file}"], ["passwd", ".."]]),
        Case("bad_external_data_range",
             lambda: _ext_model(work, "weights.bin", offset=16, length=24).SerializeToString(),
             [["{file}"], ["weights.bin"]]),
        Case("wrong_input_dtype", lambda: valid, [["x"]], when="run",
             feeds={"x": np.ones((2, 3), np.int64)}, cli_args=["x=int64"]),
        Case("wrong_input_shape", lambda: valid, [["x"]], when="run",
             feeds={"x": np.ones((3, 2), np.float32)}, cli_args=["x=shape32"]),
        Case("wrong_input_rank", lambda: valid, [["x"]], when="run",
             feeds={"x": np.ones((6,), np.float32)}, cli_args=["x=rank1"]),
        Case("missing_input", lambda: valid, [["x"]], when="run", feeds={}),
        Case("unknown_input", lambda: valid, [["nope"]], when="run",
             feeds={"x": f32, "nope": f32}),
        # Out-of-range indices: an error naming the node (ONNX Runtime rejects them too).
        Case("gather_index_out_of_range", gather("Gather", [3, 4], [2], axis=1),
             [["gather_oob"], ["index 5"]], when="run",
             feeds={"x": np.ones((3, 4), np.float32), "i": np.array([0, 5], np.int64)},
             cli_args=["i=oob5"]),
        Case("gather_negative_index_out_of_range", gather("Gather", [3, 4], [2]),
             [["gather_oob"], ["index -4"]], when="run",
             feeds={"x": np.ones((3, 4), np.float32), "i": np.array([-1, -4], np.int64)},
             cli_args=["i=oob_neg4"]),
        Case("gather_elements_index_out_of_range", gather("GatherElements", [2, 3], [2, 3], axis=0),
             [["gather_oob"], ["index 2"]], when="run",
             feeds={"x": np.ones((2, 3), np.float32), "i": np.array([[0, 1, 0], [1, 2, 0]], np.int64)},
             cli_args=["i=oob_2x3"]),
        # Sizes from the inputs: too large for memory, or overflowing 64 bits.
        Case("shape_too_large_for_memory", shape_from_input,
             [["fill_huge"], ["100000,100000"], ["memory limit"]], when="run",
             feeds={"s": np.array([100000, 100000], np.int64)}, cli_args=["s=huge_shape"]),
        Case("shape_bytes_overflow", shape_from_input,
             [["fill_huge"], ["overflow"]], when="run",
             feeds={"s": np.array([2**40, 2**40], np.int64)}, cli_args=["s=overflow_shape"]),
        Case("static_shape_bytes_overflow", static_shape_overflow,
             [["fill_static"], ["overflow"], ["[64,576460752303423489]"]], when="run", feeds={}),
        Case("max_memory_exceeded", lambda: big_valid, [["mm"], ["memory limit"], ["[4,64]"]],
             when="run", feeds={"x": np.ones((4, 64), np.float32)}, cli_args=["x=f32_4x64"],
             max_memory=512),
        # Control flow: a body of the wrong arity; an error inside an iteration
        # names the loop, the iteration and the node; a condition that is not a
        # scalar; scan inputs of different lengths.
        Case("loop_body_output_count", lambda: loop_model(body_outputs_extra=True),
             [["loop_bad"], ["outputs"]], info=False),
        Case("loop_body_error_names_iteration", loop_model,
             [["loop_bad"], ["iteration 3"], ["index 3"]], when="run",
             feeds={"m": np.array(5, np.int64), "s0": np.array(0, np.float32), "data": np.ones(3, np.float32)},
             cli_args=["m=trips5", "s0=zero_f32", "data=ones3"]),
        # A loop that could only end by an error: refused, not run until memory runs out.
        Case("loop_without_trip_count_or_condition", lambda: loop_model(operands=("", "", "s0")),
             [["loop_bad"], ["never ends"]], info=False),
        Case("loop_condition_passed_through", lambda: loop_model(operands=("", "c", "s0")),
             [["loop_bad"], ["never end"], ["no trip count"]], when="run",
             feeds={"c": np.array(True), "s0": np.array(0, np.float32), "data": np.ones(3, np.float32)},
             cli_args=["c=true", "s0=zero_f32", "data=ones3"]),
        # A trip count whose stacked output cannot fit fails at the first iteration.
        Case("loop_trip_count_exceeds_memory", loop_scan_model, [["loop_huge"], ["memory limit"], ["10000000000000"]],
             when="run", feeds={"m": np.array(10**13, np.int64), "s0": np.ones(1000, np.float32)},
             cli_args=["m=trips_huge", "s0=ones1000"]),
        Case("if_condition_not_scalar", if_model, [["if_bad"], ["not a scalar"]], when="run",
             feeds={"c": np.array([True, False]), "x": np.ones(3, np.float32)}, cli_args=["c=bool2", "x=ones3"]),
        Case("scan_input_lengths_differ", scan_model, [["scan_bad"], ["different lengths"]], when="run",
             feeds={"s0": np.zeros(2, np.float32), "xa": np.ones((3, 2), np.float32), "xb": np.ones((4, 2), np.float32)},
             cli_args=["s0=zeros2", "xa=ones3x2", "xb=ones4x2"]),
    ] + schema_cases(inconsistent) + image_cases


def schema_cases(inconsistent):
    """ONNX's operator schemas checked before Kiln's inference: each class of
    violation is an error naming the file, the node, the op and what is wrong."""
    def op_model(op, nodes_inputs, opset=17, **attrs):
        return lambda: _model([helper.make_node(op, nodes_inputs, ["y"], name="bad_" + op.lower(), **attrs)],
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              opset=opset).SerializeToString()

    def layer_norm_symbolic():
        # Scale's dim and x's last dim are different symbols: not provably
        # equal, so compiled with a run-time check instead of refused.
        return _model([helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="bad_layernorm")],
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "d"]),
                       helper.make_tensor_value_info("s", TensorProto.FLOAT, ["k"])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]).SerializeToString()

    def two_symbolic(op, a_shape, b_shape, **attrs):
        return lambda: _model([helper.make_node(op, ["a", "b"], ["y"], name="bad_" + op.lower(), **attrs)],
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, b_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]).SerializeToString()

    def no_opset_import():
        m = onnx.load_from_string(op_model("Relu", ["x"])())
        del m.opset_import[:]
        return m.SerializeToString()

    return [
        # A node of ONNX's domain in a model that imports no opset of it has no
        # schema to check against: refused rather than guessed.
        Case("schema_no_opset_import", no_opset_import,
             [["{file}"], ["bad_relu"], ["opset_import"], ["ai.onnx"]], info=False),
        # An attribute naming an element type must name one (HannWindow's
        # output_datatype 64 is Kiln's sequence container).
        Case("attribute_names_no_dtype", inconsistent("HannWindow", [("n", [], TensorProto.INT64)], ["y"], output_datatype=64),
             [["{file}"], ["bad_hannwindow"], ["output_datatype"], ["64"]], info=False),
        Case("matmul_inner_dims_checked_at_run_time", two_symbolic("MatMul", [2, "k"], ["j", 3]),
             [["bad_matmul"], ["input 0"], ["4"], ["5"]], when="run",
             feeds={"a": np.ones((2, 4), np.float32), "b": np.ones((5, 3), np.float32)},
             cli_args=["a=ones2x4", "b=ones5x3"]),
        Case("concat_other_axis_checked_at_run_time", two_symbolic("Concat", ["n", "p"], ["m", "q"], axis=0),
             [["bad_concat"], ["input 1"], ["3"], ["4"]], when="run",
             feeds={"a": np.ones((2, 3), np.float32), "b": np.ones((2, 4), np.float32)},
             cli_args=["a=ones2x3", "b=ones2x4"]),
        # A window far longer than its input (a file's absurd kernel with padding
        # to match) would run for hours over padding: refused.
        Case("pool_window_absurd_for_input",
             inconsistent("MaxPool", [("x", [1, 1, 4, 4], None)], ["y"], kernel_shape=[4096, 1],
                          pads=[2046, 0, 2046, 0]),
             [["{file}"], ["bad_maxpool"], ["window"], ["4096"]], info=False),
        Case("conv_transpose_window_absurd_for_input",
             inconsistent("ConvTranspose", [("x", [1, 1, 3, 3], None), ("w", [1, 1, 100000, 3], None)], ["y"]),
             [["{file}"], ["bad_convtranspose"], ["window"], ["100000"]], info=False),
        Case("schema_dtype_not_accepted",
             inconsistent("Sin", [("x", [3], TensorProto.BOOL)], ["y"]),
             [["{file}"], ["bad_sin"], ["tensor(bool)"], ["sin-7"], ["tensor(float)"]], info=False),
        Case("schema_type_variable_bound_twice",
             inconsistent("Where", [("c", [3], TensorProto.BOOL), ("a", [3], None), ("b", [3], TensorProto.DOUBLE)],
                          ["y"]),
             [["{file}"], ["bad_where"], ["tensor(double)"], ["tensor(float)"], ["'a'"]], info=False),
        Case("schema_attribute_type",
             op_model("Softmax", ["x"], axis=1.5),
             [["{file}"], ["bad_softmax"], ["'axis'"], ["float"], ["int"]], info=False),
        Case("schema_unknown_attribute",
             op_model("Relu", ["x"], frobnicate=3),
             [["{file}"], ["bad_relu"], ["'frobnicate'"]], info=False),
        Case("schema_required_attribute_missing",
             op_model("Cast", ["x"]),
             [["{file}"], ["bad_cast"], ["required attribute 'to'"]], info=False),
        Case("schema_input_count",
             op_model("Relu", ["x", "x"]),
             [["{file}"], ["bad_relu"], ["2 inputs"], ["relu-14 takes 1"]], info=False),
        Case("schema_required_input_omitted",
             op_model("Max", ["x", ""]),
             [["{file}"], ["bad_max"], ["required"]], info=False),
        Case("schema_op_not_in_opset",
             op_model("GreaterOrEqual", ["x", "x"], opset=11),
             [["{file}"], ["bad_greaterorequal"], ["opset 11"], ["opset 12"]], info=False),
        Case("layer_norm_scale_checked_at_run_time", layer_norm_symbolic,
             [["{file}", "bad_layernorm"], ["bad_layernorm"], ["input 1"], ["3"], ["4"]], when="run",
             feeds={"x": np.ones((2, 4), np.float32), "s": np.ones(3, np.float32)},
             cli_args=["x=ones2x4", "s=ones3"]),
    ]


def _materialize(case, work):
    path = os.path.join(work, case.name + ".onnx")
    if case.make is None:
        return path  # the missing-file case: never created
    _write(path, case.make())
    return path


def _message_ok(message, case, path):
    low = message.lower()
    missing = []
    for group in case.expect:
        alts = [a.replace("{file}", os.path.basename(path)).lower() for a in group]
        if not any(a in low for a in alts):
            missing.append(" or ".join(alts))
    return missing


# Inputs of run-time cases made in cases() (encoded images), by spec name.
_EXTRA_NPY = {}


def _image_bytes(fmt):
    """The encoded image of the onnx package's test_image_decoder_decode_<fmt>_rgb case."""
    case = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node",
                        f"test_image_decoder_decode_{fmt}_rgb", "test_data_set_0", "input_0.pb")
    t = onnx.TensorProto()
    with open(case, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def _npy_for(spec, work):
    if spec in _EXTRA_NPY:
        path = os.path.join(work, spec + ".npy")
        np.save(path, _EXTRA_NPY[spec])
        return path
    arrays = {"int64": np.ones((2, 3), np.int64), "shape32": np.ones((3, 2), np.float32),
              "rank1": np.ones((6,), np.float32), "oob5": np.array([0, 5], np.int64),
              "oob_neg4": np.array([-1, -4], np.int64),
              "oob_2x3": np.array([[0, 1, 0], [1, 2, 0]], np.int64),
              "huge_shape": np.array([100000, 100000], np.int64),
              "overflow_shape": np.array([2**40, 2**40], np.int64),
              "f32_4x64": np.ones((4, 64), np.float32),
              "trips5": np.array(5, np.int64), "trips_huge": np.array(10**13, np.int64),
              "ones1000": np.ones(1000, np.float32), "zero_f32": np.array(0, np.float32),
              "ones3": np.ones(3, np.float32), "bool2": np.array([True, False]), "true": np.array(True),
              "zeros2": np.zeros(2, np.float32), "ones3x2": np.ones((3, 2), np.float32),
              "ones2x4": np.ones((2, 4), np.float32), "ones2x3": np.ones((2, 3), np.float32),
              "ones5x3": np.ones((5, 3), np.float32),
              "ones4x2": np.ones((4, 2), np.float32)}
    path = os.path.join(work, spec + ".npy")
    np.save(path, arrays[spec])
    return path


def run_cli(kiln, case, path, work):
    """Returns a list of problems (empty: pass)."""
    commands = []
    extra = ["--max-memory", str(case.max_memory)] if case.max_memory else []
    if case.when == "run":
        if case.cli_args:
            inputs = []
            for arg in case.cli_args:
                name, spec = arg.split("=")
                inputs += ["--input", f"{name}={_npy_for(spec, work)}"]
            commands.append([kiln, "run", path] + inputs + extra)
        else:
            return []  # missing/unknown input names are Python-API cases
    else:
        commands.append([kiln, "run", path])
        if case.info:
            commands.append([kiln, "info", path])
    problems = []
    for cmd in commands:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            problems.append(f"`{' '.join(cmd[1:2])}` timed out")
            continue
        what = f"kiln {cmd[1]}"
        if proc.returncode < 0:
            problems.append(f"{what}: killed by signal {signal.Signals(-proc.returncode).name}")
        elif proc.returncode != 2:
            problems.append(f"{what}: exit code {proc.returncode}, expected 2")
        missing = _message_ok(proc.stderr, case, path)
        if missing:
            problems.append(f"{what}: message lacks {missing}: {proc.stderr.strip()[:300]!r}")
    return problems


def cli_argument_cases(work):
    """(label, argv after `kiln`, substrings the message must contain): misuse of the CLI."""
    valid = _write(os.path.join(work, "valid.onnx"), _relu_model().SerializeToString())
    junk = _write(os.path.join(work, "junk.npy"), np.random.default_rng(3).bytes(200))
    f16 = os.path.join(work, "half.npy")
    np.save(f16, np.ones((2, 3), np.float16))
    return [
        ("no arguments", [], ["usage"]),
        ("unknown command", ["frobnicate"], ["frobnicate"]),
        ("run without model", ["run"], ["model"]),
        ("two models", ["run", valid, valid], ["model"]),
        ("unknown flag", ["run", valid, "--bogus"], ["--bogus"]),
        ("flag without value", ["run", valid, "--threads"], ["--threads"]),
        ("bad thread count", ["run", valid, "--threads", "abc"], ["--threads"]),
        ("negative runs", ["bench", valid, "--runs", "0"], ["--runs"]),
        ("bad tolerance", ["run", valid, "--test-data", work, "--atol", "-1"], ["--atol"]),
        ("junk npy", ["run", valid, "--input", f"x={junk}"], ["junk.npy"]),
        ("float16 npy", ["run", valid, "--input", f"x={f16}"], ["half.npy", "f2"]),
        ("missing npy", ["run", valid, "--input", "x=" + os.path.join(work, "nope.npy")],
         ["nope.npy"]),
        ("unknown input", ["run", valid, "--input", f"zz={junk}"], ["zz"]),
        ("malformed --input", ["run", valid, "--input", "x"], ["--input"]),
        ("missing test data", ["run", valid, "--test-data", os.path.join(work, "nodir")],
         ["nodir"]),
        ("info on missing file", ["info", os.path.join(work, "absent.onnx")], ["absent.onnx"]),
        ("tune step option without --train", ["tune", valid, "--optimizer", "adamw"], ["--optimizer", "--train"]),
        ("tune --train --enqueue", ["tune", valid, "--train", "--enqueue"], ["--enqueue", "training options"]),
        ("tune --train bad loss option", ["tune", valid, "--train", "--target", "t"], ["--target", "--loss"]),
    ]


def run_cli_arguments(kiln, work, pattern):
    failures = 0
    selected = [c for c in cli_argument_cases(work) if not pattern or re.search(pattern, c[0])]
    for label, argv, expect in selected:
        proc = subprocess.run([kiln] + argv, capture_output=True, text=True, timeout=60)
        problems = []
        if proc.returncode != 2:
            problems.append(f"exit code {proc.returncode}, expected 2")
        low = proc.stderr.lower()
        lacking = [e for e in expect if e.lower() not in low]
        if lacking:
            problems.append(f"message lacks {lacking}: {proc.stderr.strip()[:300]!r}")
        print(("ok   " if not problems else "FAIL ") + f"cli: {label}" +
              "".join(f"\n       {p}" for p in problems), flush=True)
        failures += bool(problems)
    return len(selected), failures


def run_cli_help(kiln, work):
    """Every command has --help with an example (exit 0), and every option the help of run,
    bench, profile and info lists is one the command accepts."""
    valid = _write(os.path.join(work, "help.onnx"), _relu_model().SerializeToString())
    failures = 0
    commands = ["info", "run", "bench", "profile", "compile", "train", "opt", "ops", "tune", "tune-worker", "db"]
    for command in commands:
        problems = []
        proc = subprocess.run([kiln, command, "--help"], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            problems.append(f"--help exit code {proc.returncode}")
        if f"usage: kiln {command}" not in proc.stdout or "example: kiln " not in proc.stdout:
            problems.append(f"--help lacks a usage line or an example: {proc.stdout[:200]!r}")
        if command in ("info", "run", "bench", "profile", "compile"):
            for option in sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", proc.stdout))):
                if option == "--help":
                    continue
                # The option, then a value it may take: only "unknown option" matters here.
                run = subprocess.run([kiln, command, valid, option, "1"], capture_output=True, text=True,
                                     timeout=120)
                if f"unknown option '{option}'" in run.stderr:
                    problems.append(f"--help lists {option}, which kiln {command} refuses")
        print(("ok   " if not problems else "FAIL ") + f"cli: {command} --help" +
              "".join(f"\n       {p}" for p in problems), flush=True)
        failures += bool(problems)
    return len(commands), failures


def python_case(name, work):
    """Child-process body: exit 0 when Kiln raised a proper KilnError."""
    import kiln
    case = next(c for c in cases(work) if c.name == name)
    path = os.path.join(work, name + ".onnx")
    try:
        model = kiln.compile(path, threads=1, max_memory=case.max_memory or 0)
        if case.when == "compile":
            print("compiled without error")
            return 1
        model.run(case.feeds)
        print("ran without error")
        return 1
    except kiln.KilnError as exc:
        message = str(exc)
    except Exception as exc:  # noqa: BLE001
        print(f"raised {type(exc).__name__}, not KilnError: {exc}")
        return 1
    if not isinstance(kiln.KilnError("x"), RuntimeError):
        print("KilnError is not a RuntimeError")
        return 1
    missing = _message_ok(message, case, path)
    if missing:
        print(f"message lacks {missing}: {message[:300]!r}")
        return 1
    print(message)
    return 0


def run_python(case, work):
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--python-case", case.name,
                           "--work", work], capture_output=True, text=True, timeout=300)
    if proc.returncode < 0:
        return [f"python: killed by signal {signal.Signals(-proc.returncode).name}"]
    if proc.returncode != 0:
        detail = (proc.stdout.strip() or proc.stderr.strip()[-400:])
        return [f"python: {detail}"]
    return []


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kiln", default=None, help="path of the kiln CLI")
    parser.add_argument("--work", default=None, help="directory for the generated models")
    parser.add_argument("-k", dest="pattern", default=None)
    parser.add_argument("--cli-only", action="store_true")
    parser.add_argument("--python-only", action="store_true")
    parser.add_argument("--python-case", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.python_case:
        return python_case(args.python_case, args.work)

    work = args.work or tempfile.mkdtemp(prefix="kiln-error-tests-")
    os.makedirs(work, exist_ok=True)
    selected = [c for c in cases(work) if not args.pattern or re.search(args.pattern, c.name)]
    if not args.python_only and not (args.kiln and os.access(args.kiln, os.X_OK)):
        print(f"kiln CLI not found: {args.kiln} (pass --kiln or --python-only)", file=sys.stderr)
        return 2
    failures = 0
    for case in selected:
        path = _materialize(case, work)
        problems = []
        if not args.python_only:
            problems += run_cli(args.kiln, case, path, work)
        if not args.cli_only:
            problems += run_python(case, work)
        status = "ok  " if not problems else "FAIL"
        print(f"{status} {case.name}" + "".join(f"\n       {p}" for p in problems), flush=True)
        failures += bool(problems)
    total = len(selected)
    if not args.python_only:
        n, f = run_cli_arguments(args.kiln, work, args.pattern)
        total += n
        failures += f
        if not args.pattern or re.search(args.pattern, "help"):
            n, f = run_cli_help(args.kiln, work)
            total += n
            failures += f
    print(f"\n{total - failures}/{total} error cases behave")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
