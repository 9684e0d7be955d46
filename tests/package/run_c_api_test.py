"""The C API as a user gets it: `cmake --install` of the build into a fresh prefix, then
tests/package/c_api_test.c and examples/c/run_model.c compiled with the system C compiler
against PREFIX/include and PREFIX/lib only (-Wall -Wextra -Werror), and a C++ file including
only <kiln/kiln.h> compiled against PREFIX/include (the public headers stand alone).
run_model is also linked against libkiln_runtime, which must need no LLVM, protobuf or
SQLite (its dynamic dependencies are read with readelf) and runs a package written by
`kiln compile` to the same sum; it refuses to compile an ONNX file, saying so.

    run_c_api_test.py --build-dir build
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", required=True)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kiln_c_api_")
    try:
        prefix = os.path.join(tmp, "prefix")
        run(["cmake", "--install", args.build_dir, "--prefix", prefix])
        for f in ("include/kiln/kiln_c.h", "include/kiln/kiln.h", "lib/libkiln.so", "lib/libkiln_runtime.so", "bin/kiln"):
            assert os.path.exists(os.path.join(prefix, f)), f
        cc = shutil.which("cc")
        cxx = shutil.which("c++")
        flags = ["-Wall", "-Wextra", "-Werror", "-I", os.path.join(prefix, "include")]
        link = ["-L", os.path.join(prefix, "lib"), "-lkiln", "-Wl,-rpath," + os.path.join(prefix, "lib"), "-lm"]
        test_bin, example_bin = os.path.join(tmp, "c_api_test"), os.path.join(tmp, "run_model")
        run([cc, "-std=c11"] + flags + [os.path.join(SOURCE_DIR, "tests/package/c_api_test.c"), "-o", test_bin] + link)
        run([cc, "-std=c11"] + flags + [os.path.join(SOURCE_DIR, "examples/c/run_model.c"), "-o", example_bin] + link)
        runtime_bin = os.path.join(tmp, "run_model_runtime")
        run([cc, "-std=c11"] + flags + [os.path.join(SOURCE_DIR, "examples/c/run_model.c"), "-o", runtime_bin,
             "-L", os.path.join(prefix, "lib"), "-lkiln_runtime", "-Wl,-rpath," + os.path.join(prefix, "lib"), "-lm"])
        runtime_lib = os.path.join(prefix, "lib", "libkiln_runtime.so")
        dynamic = run(["readelf", "-d", runtime_lib], capture_output=True, text=True).stdout
        needed = [line.split("[")[1].split("]")[0] for line in dynamic.splitlines() if "(NEEDED)" in line]
        print("libkiln_runtime.so needs:", ", ".join(needed))
        for forbidden in ("llvm", "LLVM", "protobuf", "sqlite", "xgboost", "pq", "kiln.so"):
            assert not any(forbidden in n for n in needed), (forbidden, needed)
        symbols = run(["nm", "-D", "--defined-only", runtime_lib], capture_output=True, text=True).stdout
        assert "kiln_load" in symbols and "kiln_run" in symbols, symbols
        assert "llvm" not in symbols.lower(), "libkiln_runtime exports LLVM symbols"
        print(f"libkiln_runtime.so: {os.path.getsize(runtime_lib) / 2**20:.1f} MB "
              f"(libkiln.so: {os.path.getsize(os.path.join(prefix, 'lib', 'libkiln.so')) / 2**20:.1f} MB)")
        cpp = os.path.join(tmp, "public_headers.cc")
        with open(cpp, "w") as f:
            f.write('#include <kiln/kiln.h>\n#include <kiln/kiln_c.h>\n'
                    'int main() { kiln::CompileOptions o; o.threads = 1; return o.threads - 1; }\n')
        run([cxx, "-std=c++20", "-fsyntax-only"] + flags + [cpp])

        rng = np.random.default_rng(5)
        w = (rng.standard_normal((64, 32)) / 8).astype(np.float32)
        x = rng.standard_normal((4, 64)).astype(np.float32)
        y = np.maximum(x @ w, 0).astype(np.float32)
        assert y.std() > 0.1
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Relu", ["xw"], ["y"])],
            "c_api", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])], [numpy_helper.from_array(w, "w")])
        model = os.path.join(tmp, "model.onnx")
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
        x.tofile(os.path.join(tmp, "x.bin"))
        y.tofile(os.path.join(tmp, "y.bin"))
        env = dict(os.environ, KILN_DB="off")
        run([test_bin, model, os.path.join(tmp, "x.bin"), os.path.join(tmp, "y.bin")], env=env)
        out = run([example_bin, model, "2"], env=env, capture_output=True, text=True).stdout
        print(out)
        assert "output y: [4, 32]" in out, out
        # run_model's inputs are sin(0.1 k): its sum checked against numpy's.
        xs = np.sin(0.1 * np.arange(4 * 64)).astype(np.float32).reshape(4, 64)
        want = float(np.maximum(xs @ w, 0).sum())
        got = float(out.split("sum ")[1].split()[0])
        assert abs(got - want) <= 1e-3 * max(1.0, abs(want)), (got, want)

        # The same model as a package, run through libkiln_runtime: the same sum, bit for bit.
        package = os.path.join(tmp, "model.kiln")
        run([os.path.join(prefix, "bin", "kiln"), "compile", model, "-o", package, "--threads", "1"], env=env)
        out_rt = run([runtime_bin, package, "2"], env=env, capture_output=True, text=True).stdout
        print(out_rt)
        assert out_rt.split("output y")[1] == out.split("output y")[1], (out_rt, out)
        refused = subprocess.run([runtime_bin, model, "1"], env=env, capture_output=True, text=True)
        assert refused.returncode == 2 and "libkiln_runtime does not compile models" in refused.stderr, refused
        print("c api test passed")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
