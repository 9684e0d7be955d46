"""`kiln info MODEL --graph -o graph.html` checked in headless Chromium (Debian's chromium):
the page's script runs without a console message, draws a box for every node, input and output
(the DOM after scripts ran: `chromium --headless --dump-dom`), and names every node; a node
named like markup ("</script>") cannot break the page.

    run_graph_html_test.py --kiln build/bin/kiln
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def model(path):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"], name="proj"),
        helper.make_node("Add", ["xw", "b"], ["pre"], name="bias"),
        helper.make_node("Relu", ["pre"], ["act"], name="</script><b>relu"),
        helper.make_node("Reshape", ["act", "shape"], ["flat"], name="flatten"),
        helper.make_node("ReduceSum", ["act"], ["total"], name="sum", keepdims=0),
        helper.make_node("Softmax", ["flat"], ["y"], name="softmax"),
    ]
    graph = helper.make_graph(
        nodes, "graph_html",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
         numpy_helper.from_array(np.array([-1], np.int64), "shape")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--chromium", default=shutil.which("chromium"))
    args = ap.parse_args()
    if not args.chromium:
        print("chromium not found (scripts/install_deps.sh installs Debian's chromium)", file=sys.stderr)
        return 1
    tmp = tempfile.mkdtemp(prefix="kiln_graph_html_")
    try:
        path, page = os.path.join(tmp, "m.onnx"), os.path.join(tmp, "graph.html")
        model(path)
        out = subprocess.run([args.kiln, "info", path, "--graph", "-o", page, "--threads", "1"], check=True,
                             capture_output=True, text=True).stdout
        print(out.strip())
        m = re.search(r"\((\d+) nodes, (\d+) kernels\)", out)
        assert m, out
        nodes = int(m.group(1))
        html = open(page, encoding="utf-8").read()
        assert "<script src" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", ""), \
            "the page loads something from elsewhere"
        proc = subprocess.run(
            [args.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--user-data-dir=" + os.path.join(tmp, "profile"), "--enable-logging=stderr",
             "--v=0", "--virtual-time-budget=5000", "--dump-dom", "file://" + page],
            capture_output=True, text=True, timeout=180)
        dom, log = proc.stdout, proc.stderr
        assert proc.returncode == 0, (proc.returncode, log[-2000:])
        console = [line for line in log.splitlines() if "CONSOLE" in line or "Uncaught" in line]
        assert not console, "console messages:\n" + "\n".join(console)
        rendered = re.search(r'data-rendered="(\d+)"', dom)
        assert rendered, "the page's script did not finish (no data-rendered on <body>)"
        # Every node, the input x and the two outputs.
        assert int(rendered.group(1)) == nodes + 3, (rendered.group(1), nodes)
        for name in ("proj", "softmax", "sum", "&lt;/script&gt;&lt;b&gt;relu"):
            assert f'data-name="{name}"' in dom, name
        assert 'class="node io"' in dom and "kernels," in dom
        print(f"graph page rendered in headless Chromium: {rendered.group(1)} boxes, no console messages")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
