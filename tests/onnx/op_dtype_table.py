#!/usr/bin/env python3
"""The operator x dtype table of docs/ops.md, measured.

For every op of the onnx package's node suite that has a single-node case, and for every
tensor dtype its ONNX schema allows for each type constraint (T, T1, ...), a variant of the
case is made with that dtype: the inputs and outputs bound to the constraint retyped, the
case's input data cast to it (integers scaled so they are not all zero), the expected outputs
computed by the ONNX reference evaluator (onnx.reference). The variants run through Kiln with
the backend driver (run_backend_tests.py --cases-dir), which also records how each ran:
compiled kernels, a runtime kernel, or neither (a view, or values known when compiling).

Dtypes numpy or the reference evaluator cannot represent here (bfloat16, the float8 and 4-bit
types, complex) are not checked; a dtype the reference evaluator fails on is not counted.

    op_dtype_table.py [--out docs/op_dtypes.md] [-k REGEX] [-j N] [--keep DIR]
"""

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run_backend_tests as rbt  # noqa: E402

# ONNX type strings checked, with Kiln's short names (support/dtype.cc).
CHECKED = {
    "tensor(float)": (TensorProto.FLOAT, "f32"),
    "tensor(double)": (TensorProto.DOUBLE, "f64"),
    "tensor(float16)": (TensorProto.FLOAT16, "f16"),
    "tensor(int8)": (TensorProto.INT8, "i8"),
    "tensor(int16)": (TensorProto.INT16, "i16"),
    "tensor(int32)": (TensorProto.INT32, "i32"),
    "tensor(int64)": (TensorProto.INT64, "i64"),
    "tensor(uint8)": (TensorProto.UINT8, "u8"),
    "tensor(uint16)": (TensorProto.UINT16, "u16"),
    "tensor(uint32)": (TensorProto.UINT32, "u32"),
    "tensor(uint64)": (TensorProto.UINT64, "u64"),
    "tensor(bool)": (TensorProto.BOOL, "bool"),
    "tensor(string)": (TensorProto.STRING, "string"),
}
SHORT = {code: short for code, short in CHECKED.values()}
ORDER = [short for _, short in CHECKED.values()]


def op_key(node):
    return f"{node.domain}:{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type


def single_node_cases():
    """{op key: [case dir, ...]} for node-suite cases whose graph is one node."""
    root = os.path.join(rbt.data_root(), "node")
    by_op = collections.defaultdict(list)
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name, "model.onnx")
        if name.endswith("_expanded") or not os.path.isfile(path):
            continue
        model = onnx.load(path, load_external_data=False)
        if len(model.graph.node) != 1:
            continue
        by_op[op_key(model.graph.node[0])].append(os.path.join(root, name))
    return by_op


def schema_of(model, node):
    domain = node.domain or ""
    version = max((o.version for o in model.opset_import if o.domain in (domain, "ai.onnx" if not domain else domain)),
                  default=None)
    try:
        return onnx.defs.get_schema(node.op_type, version, domain) if version else None
    except Exception:  # noqa: BLE001: an op the installed onnx does not know
        return None


def bound_values(schema, node, type_param):
    """Names of the node's inputs and outputs whose formal type is `type_param`."""
    names = []
    for actuals, formals in ((node.input, schema.inputs), (node.output, schema.outputs)):
        for i, name in enumerate(actuals):
            if not name or not formals:
                continue
            formal = formals[min(i, len(formals) - 1)]
            if i >= len(formals) and formal.option != onnx.defs.OpSchema.FormalParameterOption.Variadic:
                continue
            if formal.type_str == type_param:
                names.append(name)
    return names


def cast_data(x, code):
    """The case's data `x` as ONNX dtype `code`, kept informative."""
    np_type = helper.tensor_dtype_to_np_dtype(code)
    if code == TensorProto.STRING:
        return np.array([str(v) for v in x.ravel()], dtype=object).reshape(x.shape)
    if x.dtype == object:
        return None
    if code == TensorProto.BOOL:
        return x != 0
    if np.issubdtype(np_type, np.integer):
        info = np.iinfo(np_type)
        if np.issubdtype(x.dtype, np.floating):
            scale = 1.0 if np.max(np.abs(x), initial=0) > 4 else 4.0
            x = np.round(x.astype(np.float64) * scale)
        x = np.nan_to_num(x.astype(np.float64))
        return np.clip(x, max(info.min, -100), min(info.max, 100)).astype(np_type)
    return x.astype(np_type)


def make_variant(case, tc_param, code, out_root, index):
    """Writes a variant case of `case` with constraint `tc_param` as dtype `code`; None when
    it cannot be made or the reference evaluator cannot run it."""
    from onnx.reference import ReferenceEvaluator
    model = onnx.load(os.path.join(case, "model.onnx"))
    node = model.graph.node[0]
    schema = schema_of(model, node)
    names = set(bound_values(schema, node, tc_param))
    if not names:
        return None
    data_dir = os.path.join(case, "test_data_set_0")
    feeds = {}
    for i, vi in enumerate(model.graph.input):
        path = os.path.join(data_dir, f"input_{i}.pb")
        if not vi.type.HasField("tensor_type") or not os.path.exists(path):
            return None
        t = onnx.TensorProto()
        with open(path, "rb") as f:
            t.ParseFromString(f.read())
        x = numpy_helper.to_array(t)
        if vi.name in names:
            x = cast_data(x, code)
            if x is None:
                return None
            vi.type.tensor_type.elem_type = code
        feeds[vi.name] = x
    for vo in model.graph.output:
        if not vo.type.HasField("tensor_type"):
            return None
        if vo.name in names:
            vo.type.tensor_type.elem_type = code
    # Attributes holding a tensor of the constraint's type (ConstantOfShape's value, ...).
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.TENSOR and node.output and node.output[0] in names:
            value = numpy_helper.to_array(attr.t)
            cast = cast_data(value, code)
            if cast is None:
                return None
            attr.t.CopyFrom(numpy_helper.from_array(cast, attr.t.name))
    try:
        onnx.checker.check_model(model)
        # A retyped output that an attribute fixes (Cast's `to`) is not a variant.
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        refs = ReferenceEvaluator(model).run(None, feeds)
    except Exception:  # noqa: BLE001: the reference cannot run this variant
        return None
    try:
        blobs = {f"input_{i}.pb": numpy_helper.from_array(np.asarray(feeds[vi.name]), vi.name).SerializeToString()
                 for i, vi in enumerate(model.graph.input)}
        for i, (vo, ref) in enumerate(zip(model.graph.output, refs)):
            want = helper.tensor_dtype_to_np_dtype(vo.type.tensor_type.elem_type)
            ref = np.asarray(ref)
            if ref.dtype != want:
                ref = ref.astype(want)
            blobs[f"output_{i}.pb"] = numpy_helper.from_array(ref, vo.name).SerializeToString()
    except Exception:  # noqa: BLE001: the reference's result does not fit the declared type
        return None
    name = f"{os.path.basename(case)}__{tc_param}__{SHORT[code]}__{index}"
    d = os.path.join(out_root, name)
    os.makedirs(os.path.join(d, "test_data_set_0"))
    onnx.save(model, os.path.join(d, "model.onnx"))
    for file, blob in blobs.items():
        with open(os.path.join(d, "test_data_set_0", file), "wb") as f:
            f.write(blob)
    tol = {"rtol": 1e-3, "atol": 1e-7}
    src = os.path.join(case, "data.json")
    if os.path.exists(src):
        with open(src) as f:
            tol.update({k: v for k, v in json.load(f).items() if k in ("rtol", "atol")})
    if code == TensorProto.FLOAT16:
        # Kiln computes f16 in f32 and rounds once; the reference rounds after each step.
        tol = {"rtol": max(tol["rtol"], 1e-2), "atol": max(tol["atol"], 1e-3)}
    with open(os.path.join(d, "data.json"), "w") as f:
        json.dump(tol, f)
    return name


def how_it_ran(result):
    if result.get("runtime_kernels"):
        return "runtime kernel"
    if result.get("kernels"):
        return "compiled"
    return "no kernel"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(HERE, "..", "..", "docs", "op_dtypes.md"))
    parser.add_argument("-k", dest="pattern", default=None, help="regex selecting op names")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--keep", default=None, help="write the variant cases here and keep them")
    args = parser.parse_args()

    root = args.keep or tempfile.mkdtemp(prefix="kiln_op_dtypes_")
    if args.keep:
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
    by_op = single_node_cases()
    if args.pattern:
        by_op = {k: v for k, v in by_op.items() if re.search(args.pattern, k)}
    # variant name -> (op, constraint, dtype); per (op, constraint, dtype) up to 2 templates.
    variants = {}
    constraints = {}
    for op, cases in sorted(by_op.items()):
        constraints[op] = []
        for tc_index, case in enumerate(cases):
            model = onnx.load(os.path.join(case, "model.onnx"), load_external_data=False)
            schema = schema_of(model, model.graph.node[0])
            if schema is None:
                continue
            for tc in schema.type_constraints:
                if tc.type_param_str not in constraints[op]:
                    constraints[op].append(tc.type_param_str)
                for type_str in tc.allowed_type_strs:
                    if type_str not in CHECKED:
                        continue
                    code, short = CHECKED[type_str]
                    key = (op, tc.type_param_str, short)
                    if sum(1 for v in variants.values() if v == key) >= 2:
                        continue
                    name = make_variant(case, tc.type_param_str, code, root, tc_index)
                    if name:
                        variants[name] = key
    print(f"{len(variants)} variants of {len(by_op)} ops in {root}", flush=True)
    results_path = os.path.join(root, "results.json")
    cmd = [sys.executable, os.path.join(HERE, "run_backend_tests.py"), "--cases-dir", root,
           "--filter", os.devnull, "--json", results_path, "-j", str(args.jobs)]
    subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False)
    with open(results_path) as f:
        results = json.load(f)

    # (op, constraint, dtype) -> best outcome over its templates.
    outcome = {}
    for name, key in variants.items():
        r = results.get(name)
        if r is None:
            continue
        if r["status"] == "pass":
            got = ("pass", how_it_ran(r))
        else:
            kind, _ = rbt.failure_kind(r)
            got = (kind, (r["message"].splitlines() or [""])[0][:120])
        if key not in outcome or (outcome[key][0] != "pass" and got[0] == "pass"):
            outcome[key] = got

    kiln_ops = {}
    listing = subprocess.run([os.path.join(HERE, "..", "..", "build", "bin", "kiln"), "ops"],
                             capture_output=True, text=True, check=True).stdout
    for line in listing.splitlines():
        op, _, how = line.partition("\t")
        kiln_ops[op] = how

    lines = [
        "# Operators by dtype",
        "",
        "Generated by `tests/onnx/op_dtype_table.py` (`scripts/update_ops_doc.sh --dtypes`): for every",
        "op of the onnx package's node suite with a single-node case, every tensor dtype its schema",
        "allows per type constraint, a variant of the case in that dtype run through Kiln and compared",
        "with the ONNX reference evaluator. \"compiled\": it ran generated kernels; \"runtime kernel\": a",
        "C++ kernel; \"no kernel\": a view, or values known when compiling. Refused: Kiln rejects the",
        "dtype with an error (unsupported dtype or op); failing: it ran and differed, or failed",
        "otherwise. bfloat16, float8, 4-bit and complex dtypes are not checked here (the backend suite",
        "covers some of them: `tests/onnx/filter.txt`).",
        "",
        "| op | constraint | passing (how it runs) | refused | failing |",
        "|---|---|---|---|---|",
    ]
    totals = collections.Counter()
    for op in sorted(by_op):
        for tc in constraints.get(op, []):
            cells = {k[2]: v for k, v in outcome.items() if k[0] == op and k[1] == tc}
            if not cells:
                continue
            passing = collections.defaultdict(list)
            refused, failing = [], []
            for short in ORDER:
                if short not in cells:
                    continue
                status, detail = cells[short]
                totals[status] += 1
                if status == "pass":
                    passing[detail].append(short)
                elif status.startswith("unsupported"):
                    refused.append(short)
                else:
                    failing.append(f"{short} ({status})")
            ok = "; ".join(f"{' '.join(v)}: {how}" for how, v in passing.items())
            lines.append(f"| {op} | {tc} | {ok} | {' '.join(refused)} | {', '.join(failing)} |")
    uncovered = sorted(op for op in kiln_ops if op not in by_op)
    lines += ["", f"Checked {sum(totals.values())} op x constraint x dtype combinations: "
              f"{totals['pass']} pass, "
              f"{sum(v for k, v in totals.items() if k.startswith('unsupported'))} refused, "
              f"{sum(v for k, v in totals.items() if k != 'pass' and not k.startswith('unsupported'))} fail.",
              "",
              f"Ops Kiln registers without a single-node case in the suite ({len(uncovered)}; their dtypes "
              f"are not checked here): {', '.join(uncovered)}."]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}: {dict(totals)}")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
