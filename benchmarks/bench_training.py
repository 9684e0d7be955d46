#!/usr/bin/env python3
"""One training step (forward, backward, AdamW update) in Kiln (kiln.Trainer: the step compiled
as one graph) and in PyTorch eager, in the same run, from the same weights on the same batch.

Models (--models resnet18,bert; resnet18 by default), each with a log-softmax cross-entropy loss:
  resnet18: torchvision's resnet18 (10 classes) at batch 16, 224x224, in training mode
      (BatchNormalization with the batch's statistics, exported in training form);
  bert: a BERT-base-style encoder (vocabulary 30522, 12 layers of hidden 768, 12 heads, GELU
      feed-forward 3072, post-norm, dropout 0, learned positions) at batch 8, sequence 128,
      classifying from the first token.
Reports the compile time, the median step time over --steps after one warm-up step (the two
alternate step by step, so a change in the host's load falls on both), the ratio, and the first
step's loss on both sides (they must agree).

Then the loss curves: a small CNN and a small transformer trained 300 steps on synthetic tasks
(kiln.Trainer with an appended cross-entropy; torch.nn.CrossEntropyLoss and torch.optim), from
the same weights on the same batches: the final loss (mean of the last 10 steps) on both sides
and the largest relative difference of any step's loss.

    bench_training.py [--threads 2] [--steps 5] [--models resnet18[,bert]] [--no-curves] [--write-doc]
"""
import argparse
import copy
import io
import os
import statistics
import sys
import time

import numpy as np
import onnx
import torch
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from report import host_name, write_table  # noqa: E402

DOC = os.path.join(os.path.dirname(HERE), "docs", "training.md")


class WithLoss(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, onehot):
        return -(torch.log_softmax(self.model(x), -1) * onehot).sum() / x.shape[0]


class Encoder(torch.nn.Module):
    def __init__(self, vocab=30522, hidden=768, layers=12, heads=12, ff=3072, seq=128, classes=2):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, hidden)
        self.positions = torch.nn.Parameter(torch.randn(seq, hidden) * 0.02)
        self.norm = torch.nn.LayerNorm(hidden)
        layer = torch.nn.TransformerEncoderLayer(hidden, heads, ff, dropout=0.0, activation="gelu", batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, ids):
        h = self.norm(self.tokens(ids) + self.positions)
        return self.head(self.encoder(h)[:, 0])


def build(name):
    """(module with its loss, example inputs, input names, export in training form?, label)."""
    torch.manual_seed(0)
    if name == "resnet18":
        batch = 16
        model = WithLoss(torchvision.models.resnet18(num_classes=10))
        x = torch.randn(batch, 3, 224, 224)
        classes = 10
        label = "resnet18 (BN in training form), AdamW"
    elif name == "bert":
        batch = 8
        model = WithLoss(Encoder())
        x = torch.randint(0, 30522, (batch, 128))
        classes = 2
        label = "BERT-base-style encoder (seq 128), AdamW"
    else:
        sys.exit(f"unknown model {name} (resnet18, bert)")
    onehot = torch.nn.functional.one_hot(torch.randint(0, classes, (batch,)), classes).float()
    return model.train(), (x, onehot), batch, label


def measure(name, threads, steps):
    import kiln

    model, (x, onehot), batch, label = build(name)
    buf = io.BytesIO()
    torch.onnx.export(model, (x, onehot), buf, input_names=["x", "onehot"], output_names=["loss"], opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    model.train()
    proto = onnx.load_from_string(buf.getvalue())
    params = [i.name for i in proto.graph.initializer
              if i.data_type == onnx.TensorProto.FLOAT and "running_" not in i.name]
    t0 = time.perf_counter()
    trainer = kiln.Trainer(buf.getvalue(), params=params, optimizer="adamw", lr=1e-3, threads=threads, db="")
    compile_s = time.perf_counter() - t0
    feeds = {"x": x.numpy(), "onehot": onehot.numpy()}
    opt = torch.optim.AdamW([p for n, p in model.named_parameters()], lr=1e-3)

    def torch_step():
        opt.zero_grad()
        loss = model(x, onehot)
        loss.backward()
        opt.step()
        return float(loss)

    kiln_times, torch_times = [], []
    kiln_first, torch_first = trainer.step(feeds), torch_step()
    for _ in range(steps):
        t0 = time.perf_counter()
        trainer.step(feeds)
        kiln_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        torch_step()
        torch_times.append(time.perf_counter() - t0)
    k, p = statistics.median(kiln_times), statistics.median(torch_times)
    assert abs(kiln_first - torch_first) <= 1e-4 * abs(torch_first), (kiln_first, torch_first)
    return (f"| {label} | {batch} | {compile_s:.1f} | {k:.2f} | {p:.2f} | {k / p:.2f} | "
            f"{kiln_first:.6f} / {torch_first:.6f} |")


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU())
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(self.features(x).mean(dim=(2, 3)))


class SmallTransformer(torch.nn.Module):
    def __init__(self, vocab=16, seq=12, hidden=32):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, hidden)
        self.positions = torch.nn.Parameter(torch.randn(seq, hidden) * 0.1)
        layer = torch.nn.TransformerEncoderLayer(hidden, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(hidden, 4)

    def forward(self, ids):
        return self.head(self.encoder(self.tokens(ids) + self.positions).mean(dim=1))


def synthetic(name, steps, batch, rng):
    """Batches of a task each model can learn: the quadrant of a bright square in a noisy 16x16
    image; the largest token of a sequence, in 4 classes."""
    out = []
    for _ in range(steps):
        if name == "cnn":
            label = rng.integers(0, 4, batch)
            x = rng.standard_normal((batch, 1, 16, 16)).astype(np.float32) * 0.5
            for i, q in enumerate(label):
                r, c = 8 * (q // 2) + rng.integers(0, 4), 8 * (q % 2) + rng.integers(0, 4)
                x[i, 0, r:r + 4, c:c + 4] += 2.0
        else:
            x = rng.integers(0, 16, (batch, 12)).astype(np.int64)
            label = x.max(axis=1) // 4
        out.append((x, label.astype(np.int64)))
    return out


def curve(name, threads, steps=300):
    """Trains the model `steps` steps in Kiln (an appended cross-entropy) and in PyTorch from the
    same weights on the same batches: the final losses and the largest deviation on the way."""
    import kiln

    torch.manual_seed(1)
    module = SmallCNN() if name == "cnn" else SmallTransformer()
    data = synthetic(name, steps, 32, np.random.default_rng(2))
    x0 = torch.from_numpy(data[0][0])
    buf = io.BytesIO()
    torch.onnx.export(module.train(), (x0,), buf, input_names=["x"], output_names=["logits"], opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    reference = copy.deepcopy(module).train()  # after the export's traced run (BN statistics)
    if name == "cnn":
        # lr 0.02: at higher rates the trajectory turns on the rounding of BatchNormalization's
        # statistics, so the curves would compare rounding (docs/training.md).
        trainer = kiln.Trainer(buf.getvalue(), loss="cross_entropy", target="label", optimizer="sgd", lr=0.02,
                               momentum=0.9, threads=threads, db="")
        opt = torch.optim.SGD(reference.parameters(), lr=0.02, momentum=0.9)
    else:
        trainer = kiln.Trainer(buf.getvalue(), loss="cross_entropy", target="label", optimizer="adamw", lr=3e-3,
                               weight_decay=0.01, threads=threads, db="")
        opt = torch.optim.AdamW(reference.parameters(), lr=3e-3, weight_decay=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    ours, theirs = [], []
    for x, label in data:
        ours.append(trainer.step({"x": x, "label": label}))
        opt.zero_grad()
        loss = loss_fn(reference(torch.from_numpy(x)), torch.from_numpy(label))
        loss.backward()
        opt.step()
        theirs.append(float(loss))
    tail_k, tail_t = float(np.mean(ours[-10:])), float(np.mean(theirs[-10:]))
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    label = "small CNN (conv, BN training form, max pool), SGD momentum" if name == "cnn" else \
        "small transformer (2 layers, hidden 32), AdamW"
    return (f"| {label} | {steps} | {theirs[0]:.4f} | {tail_k:.4f} | {tail_t:.4f} | "
            f"{100 * abs(tail_k - tail_t) / tail_t:.2f} | {100 * worst:.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--models", default="resnet18", help="resnet18 and/or bert (comma-separated)")
    ap.add_argument("--no-curves", dest="curves", action="store_false",
                    help="skip the 300-step loss curves of a small CNN and a small transformer")
    ap.add_argument("--write-doc", action="store_true")
    args = ap.parse_args()
    import kiln

    torch.set_num_threads(args.threads)
    out = [f"Host: {host_name()} ({os.cpu_count()} cores); Kiln {kiln.__version__}, PyTorch {torch.__version__}; "
           f"{args.threads} threads; median of {args.steps} steps after one warm-up.", "",
           "| model | batch | Kiln compile s | Kiln step s | PyTorch eager step s | Kiln / PyTorch | first loss Kiln / PyTorch |",
           "|---|---|---|---|---|---|---|"]
    for name in args.models.split(","):
        out.append(measure(name, args.threads, args.steps))
        print(out[-1], flush=True)
    print("\n".join(out))
    curves = ["| model | steps | first loss | Kiln final loss | PyTorch final loss | final differs % | "
              "largest step difference % |", "|---|---|---|---|---|---|---|"]
    if args.curves:
        for name in ("cnn", "transformer"):
            curves.append(curve(name, args.threads))
            print(curves[-1], flush=True)
    if args.write_doc:
        write_table(DOC, "<!-- bench_training: begin -->", "<!-- bench_training: end -->", "\n".join(out))
        if args.curves:
            write_table(DOC, "<!-- bench_training curves: begin -->", "<!-- bench_training curves: end -->",
                        "\n".join(curves))


if __name__ == "__main__":
    main()
