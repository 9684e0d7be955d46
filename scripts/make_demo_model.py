"""Writes a demo model and an ONNX test_data_set folder for `kiln run --test-data`.

torchvision resnet18 with random weights (fixed seed; nothing is downloaded),
BatchNorm statistics conditioned on random batches so outputs have spread,
expected outputs from ONNX Runtime.
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torchvision
from onnx import numpy_helper


def main(out_dir):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 3, 224, 224))
    model.eval()
    path = os.path.join(out_dir, "model.onnx")
    x = torch.randn(1, 3, 224, 224)
    torch.onnx.export(model, x, path, input_names=["input"], output_names=["logits"], opset_version=17)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feed = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    (expected,) = sess.run(None, {"input": feed})
    assert expected.std() > 1e-3, "reference output has no spread"
    data_dir = os.path.join(out_dir, "test_data_set_0")
    os.makedirs(data_dir, exist_ok=True)
    onnx.save_tensor(numpy_helper.from_array(feed, "input"), os.path.join(data_dir, "input_0.pb"))
    onnx.save_tensor(numpy_helper.from_array(expected, "logits"), os.path.join(data_dir, "output_0.pb"))
    print(f"wrote {path} and {data_dir}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
