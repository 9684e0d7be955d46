"""`kiln train` under MPI (Debian's OpenMPI): `mpirun -np 2 kiln train ...` (each process on half
of every batch, gradients averaged across them with MPI_Allreduce) prints the losses of one
process trained on the whole batches, within float tolerance, and exports the same weights; a
batch whose rows do not split evenly across the processes ends the job with an error naming
the file (not a hang).

    PYTHONPATH=build/python run_kiln_train_mpi_test.py --kiln build/bin/kiln
"""
import argparse
import io
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np
import onnx
import torch

from cases import case, finish

PARSER = argparse.ArgumentParser()
PARSER.add_argument("--kiln", required=True)
ARGS = PARSER.parse_args()


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, x):
        h = torch.relu(self.conv(x)).mean(dim=(2, 3))
        return self.fc(h)


def mpirun():
    exe = shutil.which("mpirun")
    assert exe, "mpirun is not installed (scripts/install_deps.sh installs openmpi-bin)"
    cmd = [exe, "-np", "2", "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def setup(tmp, rows=8):
    torch.manual_seed(11)
    buf = io.BytesIO()
    torch.onnx.export(ConvNet(), (torch.zeros(rows, 3, 6, 6),), buf, input_names=["x"], output_names=["logits"],
                      opset_version=17, do_constant_folding=False, dynamic_axes={"x": {0: "n"}})
    model = os.path.join(tmp, "net.onnx")
    with open(model, "wb") as f:
        f.write(buf.getvalue())
    rng = np.random.default_rng(4)
    data = os.path.join(tmp, "data")
    for b in range(3):
        x = rng.standard_normal((rows, 3, 6, 6)).astype(np.float32)
        label = (x[:, 0].mean(axis=(1, 2)) > 0).astype(np.int64) + 2 * (x[:, 1].mean(axis=(1, 2)) > 0)
        d = os.path.join(data, f"batch_{b}")
        os.makedirs(d)
        np.save(os.path.join(d, "x.npy"), x)
        np.save(os.path.join(d, "label.npy"), label.astype(np.int64))
    return model, data


def train(prefix, model, data, out):
    cmd = prefix + [ARGS.kiln, "train", model, "--data", data, "--loss", "cross-entropy", "--target", "label",
                    "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.2", "--epochs", "3", "--threads", "1",
                    "-o", out]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def losses(stdout):
    return [float(v) for v in re.findall(r"step \d+ loss (\S+)", stdout)]


@case
def two_processes_equal_one_on_the_whole_batch():
    with tempfile.TemporaryDirectory() as tmp:
        model, data = setup(tmp)
        single = train([], model, data, os.path.join(tmp, "single.onnx"))
        assert single.returncode == 0, single.stderr
        parallel = train(mpirun(), model, data, os.path.join(tmp, "mpi.onnx"))
        assert parallel.returncode == 0, parallel.stderr + parallel.stdout
        one, two = losses(single.stdout), losses(parallel.stdout)
        # Only process 0 prints: one line per step.
        assert len(one) == 9 and len(two) == 9, (single.stdout, parallel.stdout)
        np.testing.assert_allclose(two, one, rtol=1e-5)
        assert one[6] < one[0] - 0.05, one  # the first batch, in the third epoch and the first
        a = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(os.path.join(tmp, "single.onnx")).graph.initializer}
        b = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(os.path.join(tmp, "mpi.onnx")).graph.initializer}
        assert a.keys() == b.keys()
        for name in a:
            assert not np.array_equal(a[name], onnx.numpy_helper.to_array(
                next(i for i in onnx.load(model).graph.initializer if i.name == name))), f"{name} did not train"
            np.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-5, err_msg=name)


@case
def uneven_batch_ends_the_job_with_an_error():
    with tempfile.TemporaryDirectory() as tmp:
        model, data = setup(tmp, rows=7)
        r = train(mpirun(), model, data, os.path.join(tmp, "mpi.onnx"))
        assert r.returncode != 0, r.stdout
        assert "not a multiple of the 2 processes" in r.stderr and "x.npy" in r.stderr, r.stderr


if __name__ == "__main__":
    finish()
