"""`kiln train` from the command line: losses printed per step equal kiln.Trainer's (the same
compiled step) bit for bit and fall; training stopped after an epoch and resumed from its
checkpoint prints the same later losses, bit for bit, as a run never stopped; the exported model
holds the trained weights (its outputs equal the trained Trainer's model's); a damaged checkpoint
and missing batch files are clear errors; a leftover temporary file from a killed save changes
nothing.

    PYTHONPATH=build/python run_kiln_train_test.py --kiln build/bin/kiln
"""
import argparse
import io
import os
import re
import subprocess
import tempfile

import numpy as np
import onnx
import torch

import kiln
from cases import case, finish

PARSER = argparse.ArgumentParser()
PARSER.add_argument("--kiln", required=True)
ARGS = PARSER.parse_args()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 12)
        self.fc2 = torch.nn.Linear(12, 3)

    def forward(self, x, onehot):
        logp = torch.log_softmax(self.fc2(torch.tanh(self.fc1(x))), dim=-1)
        return -(logp * onehot).sum() / x.shape[0]


def setup(tmp):
    torch.manual_seed(6)
    buf = io.BytesIO()
    x0, y0 = torch.zeros(4, 6), torch.zeros(4, 3)
    torch.onnx.export(Net(), (x0, y0), buf, input_names=["x", "onehot"], output_names=["loss"], opset_version=17,
                      do_constant_folding=False)
    model = os.path.join(tmp, "net.onnx")
    with open(model, "wb") as f:
        f.write(buf.getvalue())
    rng = np.random.default_rng(2)
    batches = []
    for b in range(3):
        x = rng.standard_normal((4, 6)).astype(np.float32)
        onehot = np.eye(3, dtype=np.float32)[x[:, :3].argmax(axis=1)]
        d = os.path.join(tmp, "data", f"batch_{b}")
        os.makedirs(d)
        np.save(os.path.join(d, "x.npy"), x)
        np.save(os.path.join(d, "onehot.npy"), onehot)
        batches.append({"x": x, "onehot": onehot})
    return model, batches


def train(model, data, *extra, check=True):
    cmd = [ARGS.kiln, "train", model, "--data", data, "--optimizer", "adamw", "--lr", "0.05", "--threads", "2",
           "--weight-decay", "0.01", "--clip-norm", "1", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def losses(stdout):
    return re.findall(r"step (\d+) loss (\S+)", stdout)


@case
def train_resume_and_export():
    with tempfile.TemporaryDirectory() as tmp:
        model, batches = setup(tmp)
        data = os.path.join(tmp, "data")
        whole = train(model, data, "--epochs", "3", "--checkpoint", os.path.join(tmp, "a.ckpt"),
                      "-o", os.path.join(tmp, "trained.onnx")).stdout
        steps = losses(whole)
        assert [s for s, _ in steps] == [str(k) for k in range(1, 10)], whole
        values = [float(v) for _, v in steps]
        assert values[-1] < values[0] - 0.1, values

        # The same compiled step through the Python API: the same losses, bit for bit.
        trainer = kiln.Trainer(model, optimizer="adamw", lr=0.05, weight_decay=0.01, clip_norm=1.0, threads=2,
                               params=[i.name for i in onnx.load(model).graph.initializer], db="")
        py = [trainer.step(b) for _ in range(3) for b in batches]
        assert [np.float32(v) for v in py] == [np.float32(v) for v in values], (py, values)

        # Stopped after one epoch, resumed: the later losses as never stopped.
        ckpt = os.path.join(tmp, "b.ckpt")
        first = losses(train(model, data, "--epochs", "1", "--checkpoint", ckpt).stdout)
        with open(ckpt + ".tmp99999", "wb") as f:  # what a save killed half way leaves
            f.write(b"KILNCKPT 1\nepoch 9")
        rest = train(model, data, "--epochs", "3", "--checkpoint", ckpt, "--resume").stdout
        assert "resumed from" in rest, rest
        assert first + losses(rest) == steps, (first, losses(rest), steps)

        # The exported model holds the trained weights.
        trained = onnx.load(os.path.join(tmp, "trained.onnx"))
        weights = {i.name: onnx.numpy_helper.to_array(i) for i in trained.graph.initializer}
        for name, value in trainer.params.items():
            assert np.array_equal(weights[name], value), name
        m = kiln.compile(os.path.join(tmp, "trained.onnx"), db="")
        assert abs(float(m.run(batches[0])["loss"]) - float(trainer._impl.run(
            dict(batches[0], **trainer.params, **trainer.state, **{"kiln.lr": np.float32(0), "kiln.step": np.float32(1)}),
            None)["loss"])) < 1e-6

        # Errors.
        with open(ckpt, "r+b") as f:
            f.seek(30)
            f.write(b"garbage")
        bad = train(model, data, "--epochs", "3", "--checkpoint", ckpt, "--resume", check=False)
        assert bad.returncode == 2 and "is damaged or not a Kiln checkpoint" in bad.stderr, bad.stderr
        os.remove(os.path.join(data, "batch_1", "onehot.npy"))
        missing = train(model, data, check=False)
        assert missing.returncode == 2 and "batch_1" in missing.stderr and "onehot.npy" in missing.stderr, missing.stderr


class Logits(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 12)
        self.fc2 = torch.nn.Linear(12, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


@case
def appended_cross_entropy_loss():
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(7)
        buf = io.BytesIO()
        torch.onnx.export(Logits(), (torch.zeros(4, 6),), buf, input_names=["x"], output_names=["logits"],
                          opset_version=17, do_constant_folding=False)
        model = os.path.join(tmp, "logits.onnx")
        with open(model, "wb") as f:
            f.write(buf.getvalue())
        rng = np.random.default_rng(3)
        batches = []
        for b in range(3):
            x = rng.standard_normal((4, 6)).astype(np.float32)
            label = x[:, :3].argmax(axis=1).astype(np.int64)
            d = os.path.join(tmp, "data", f"batch_{b}")
            os.makedirs(d)
            np.save(os.path.join(d, "x.npy"), x)
            np.save(os.path.join(d, "label.npy"), label)
            batches.append({"x": x, "label": label})
        out = train(model, os.path.join(tmp, "data"), "--epochs", "2", "--loss", "cross-entropy", "--target", "label",
                    "-o", os.path.join(tmp, "trained.onnx")).stdout
        values = [float(v) for _, v in losses(out)]
        assert len(values) == 6 and values[-1] < values[0], out
        trainer = kiln.Trainer(model, loss="cross_entropy", target="label", optimizer="adamw", lr=0.05,
                               weight_decay=0.01, clip_norm=1.0, threads=2, db="",
                               params=[i.name for i in onnx.load(model).graph.initializer])
        py = [trainer.step(b) for _ in range(2) for b in batches]
        assert [np.float32(v) for v in py] == [np.float32(v) for v in values], (py, values)
        # The exported model is the logits model (no loss, no target input) with the trained weights.
        trained = onnx.load(os.path.join(tmp, "trained.onnx"))
        assert [i.name for i in trained.graph.input] == ["x"], trained.graph.input
        weights = {i.name: onnx.numpy_helper.to_array(i) for i in trained.graph.initializer}
        for name, value in trainer.params.items():
            assert np.array_equal(weights[name], value), name
        bad = train(model, os.path.join(tmp, "data"), "--target", "label", check=False)
        assert bad.returncode == 2 and "--target and --prediction go with" in bad.stderr, bad.stderr


if __name__ == "__main__":
    finish()
