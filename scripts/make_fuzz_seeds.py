"""Writes the seed corpus of the fuzz targets (scripts/fuzz.sh).

    make_fuzz_seeds.py OUT_DIR [--zoo-dir DIR]

Seeds: every model.onnx of the ONNX backend node tests shipped with the pinned onnx
package, and the zoo's models (tests/models; exported into DIR when given) with their
weights made small: each initializer of more than 64 elements becomes a ConstantOfShape
node of the same shape, so the graph, its ops and its shapes stay as exported while the
file shrinks from megabytes to kilobytes (the fuzzers mutate small inputs quickly).
"""
import argparse
import glob
import hashlib
import os
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper


def small_zoo_model(path):
    model = onnx.load(path)
    graph = model.graph
    keep, nodes = [], []
    for init in graph.initializer:
        dims = list(init.dims)
        if int(np.prod(dims)) <= 64:
            keep.append(init)
            continue
        shape_name = init.name + "__shape"
        nodes.append(helper.make_node("Constant", [], [shape_name],
                                      value=numpy_helper.from_array(np.array(dims, np.int64))))
        fill = np.array([0.01], dtype=onnx.helper.tensor_dtype_to_np_dtype(init.data_type))
        nodes.append(helper.make_node("ConstantOfShape", [shape_name], [init.name],
                                      value=numpy_helper.from_array(fill)))
    del graph.initializer[:]
    graph.initializer.extend(keep)
    names = {n.output[0] for n in nodes}
    inputs = [i for i in graph.input if i.name not in names]
    del graph.input[:]
    graph.input.extend(inputs)
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + rest)
    return model.SerializeToString()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--zoo-dir", default=None)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    node_dir = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")
    count = 0

    def write(data):
        nonlocal count
        name = hashlib.sha1(data).hexdigest()
        with open(os.path.join(args.out_dir, name), "wb") as f:
            f.write(data)
        count += 1

    for path in sorted(glob.glob(os.path.join(node_dir, "*", "model.onnx"))):
        with open(path, "rb") as f:
            write(f.read())
    zoo = 0
    if args.zoo_dir:
        for path in sorted(glob.glob(os.path.join(args.zoo_dir, "*.onnx"))):
            write(small_zoo_model(path))
            zoo += 1
    print(f"{count} seeds ({zoo} from the zoo) in {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
