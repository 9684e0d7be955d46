"""`pip install .` end to end: the wheel scikit-build-core builds from this
source tree, installed into a fresh virtual environment (no system site
packages, no sys.path edits, numpy from the local wheelhouse that
scripts/install_deps.sh fills), then `import kiln` and the `kiln` command
line used from outside the source tree.

    run_wheel_test.py --wheelhouse DIR [--keep]
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

# Runs inside the fresh environment. The expected output is computed there
# with numpy from the weights the model file holds.
CHECK_SCRIPT = r"""
import os, sys
import numpy as np
import kiln
here = os.path.dirname(os.path.abspath(kiln.__file__))
assert here.startswith(sys.prefix), (here, sys.prefix)
model_path, weights_path = sys.argv[1], sys.argv[2]
w = np.load(weights_path)
m = kiln.compile(model_path, threads=1, db="")
x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
(y,) = m.run({"x": x}).values()
want = np.maximum(x @ w, 0)
assert want.std() > 0.1, want.std()
np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
m2 = kiln.compile(open(model_path, "rb").read(), threads=1, db="")
np.testing.assert_array_equal(m2.run({"x": x})["y"], y)
print("kiln", kiln.__version__, "from", here, "ok")
"""


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def make_model(path, weights_path):
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((64, 32)) / 8).astype(np.float32)
    np.save(weights_path, w)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Relu", ["xw"], ["y"])],
        "wheel_test",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])],
        [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheelhouse", required=True, help="wheels of kiln's dependencies (numpy)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kiln_wheel_")
    try:
        dist = os.path.join(tmp, "dist")
        # The build requirement (scikit-build-core, pinned in requirements.txt)
        # is already in this environment: nothing is downloaded.
        run([sys.executable, "-m", "pip", "wheel", SOURCE_DIR, "--no-build-isolation", "--no-deps",
             "--disable-pip-version-check", "-w", dist])
        wheels = [f for f in os.listdir(dist) if f.startswith("kiln-") and f.endswith(".whl")]
        assert len(wheels) == 1, wheels
        venv = os.path.join(tmp, "venv")
        base_python = getattr(sys, "_base_executable", sys.executable)
        run([base_python, "-m", "venv", venv])
        py = os.path.join(venv, "bin", "python")
        run([py, "-m", "pip", "install", "--no-index", "--disable-pip-version-check", "--find-links",
             args.wheelhouse, os.path.join(dist, wheels[0])])
        model = os.path.join(tmp, "model.onnx")
        weights = os.path.join(tmp, "w.npy")
        make_model(model, weights)
        # From a directory outside the source tree, with a clean environment:
        # nothing but the venv provides `kiln`.
        env = {"PATH": os.path.join(venv, "bin") + os.pathsep + "/usr/bin:/bin", "HOME": tmp, "KILN_DB": "off"}
        run([py, "-c", CHECK_SCRIPT, model, weights], cwd=tmp, env=env)
        cli = shutil.which("kiln", path=env["PATH"])
        assert cli == os.path.join(venv, "bin", "kiln"), cli
        out = subprocess.run(["kiln", "run", model, "--threads", "1"], cwd=tmp, env=env, check=True,
                             capture_output=True, text=True).stdout
        print(out)
        assert "y" in out, out
        print("wheel test passed")
    finally:
        if args.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
