#!/usr/bin/env python3
"""One training step (forward, backward, AdamW update) in Kiln (kiln.Trainer: the step compiled
as one graph) and in PyTorch eager, in the same run, from the same weights on the same batch.

Models (--models resnet18,bert,mobilenet_v2,lstm; resnet18 by default), each with a log-softmax cross-entropy loss:
  resnet18: torchvision's resnet18 (10 classes) at batch 16, 224x224, in training mode
      (BatchNormalization with the batch's statistics, exported in training form);
  bert: a BERT-base-style encoder (vocabulary 30522, 12 layers of hidden 768, 12 heads, GELU
      feed-forward 3072, post-norm, dropout 0, learned positions) at batch 8, sequence 128,
      classifying from the first token;
  mobilenet_v2: torchvision's mobilenet_v2 (10 classes) at batch 16, 224x224, in training mode,
      its classifier's Dropout set to 0 (a random mask would make the two sides' losses differ);
  lstm: the model zoo's LSTM language model (embedding, two LSTM layers of 512, a decoder to
      10000 words) at batch 8, 64 tokens, a cross-entropy per token.
Reports the compile time, the median step time over --steps after one warm-up step (the two
alternate step by step, so a change in the host's load falls on both), the ratio, and the first
step's loss on both sides (they must agree).

Then automatic checkpointing (kiln.Trainer(memory_budget=...)) on the first model: no budget, and
budgets of 50% and 20% of the unbudgeted step's activation bytes, each with the dynamic program
("dp") and Chen et al.'s sqrt(n) segments ("sqrt"): the activation and peak bytes Kiln reports at
compile time, the peak measured (the growth of the resident set over the first step, in a fresh
process per plan), the median step time (all plans alternating step by step) and the time added
over the unbudgeted step, and the recomputation (its estimated compute over the forward's). A
budget no plan meets is reported with the least Kiln reaches.

Then the loss curves: a small CNN and a small transformer trained 300 steps on synthetic tasks
(kiln.Trainer with an appended cross-entropy; torch.nn.CrossEntropyLoss and torch.optim), from
the same weights on the same batches: the final loss (mean of the last 10 steps) on both sides
and the largest relative difference of any step's loss.

    bench_training.py [--threads 2] [--steps 5] [--models resnet18[,bert][,mobilenet_v2][,lstm]] [--no-memory] [--no-curves]
                      [--write-doc]
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


class LstmLm(torch.nn.Module):
    """The model zoo's LSTM language model: vocabulary 10000, two layers of hidden 512."""

    def __init__(self, vocab=10000, hidden=512, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.lstm = torch.nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True)
        self.decoder = torch.nn.Linear(hidden, vocab)
        for p in self.parameters():
            torch.nn.init.uniform_(p, -0.1, 0.1)

    def forward(self, ids):
        out, _ = self.lstm(self.embed(ids))
        return self.decoder(out)


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
    elif name == "mobilenet_v2":
        batch = 16
        model = WithLoss(torchvision.models.mobilenet_v2(num_classes=10))
        model.model.classifier[0].p = 0.0  # the classifier's Dropout off: both sides' losses comparable
        x = torch.randn(batch, 3, 224, 224)
        classes = 10
        label = "mobilenet_v2 (BN in training form, Dropout off), AdamW"
    elif name == "lstm":
        batch = 8
        model = WithLoss(LstmLm())
        x = torch.randint(0, 10000, (batch, 64))
        classes = 10000
        label = "LSTM language model (2 x 512, vocabulary 10000, 64 tokens), AdamW"
    else:
        sys.exit(f"unknown model {name} (resnet18, bert, mobilenet_v2, lstm)")
    targets = (batch, 64) if name == "lstm" else (batch,)
    onehot = torch.nn.functional.one_hot(torch.randint(0, classes, targets), classes).float()
    return model.train(), (x, onehot), batch, label


def export_step(name):
    """The model with its loss as ONNX bytes in training form, example feeds, the parameter names
    (every float initializer but BatchNormalization's running statistics), batch and label."""
    model, (x, onehot), batch, label = build(name)
    buf = io.BytesIO()
    torch.onnx.export(model, (x, onehot), buf, input_names=["x", "onehot"], output_names=["loss"], opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    proto = onnx.load_from_string(buf.getvalue())
    params = [i.name for i in proto.graph.initializer
              if i.data_type == onnx.TensorProto.FLOAT and "running_" not in i.name]
    return model.train(), buf.getvalue(), {"x": x.numpy(), "onehot": onehot.numpy()}, params, batch, label


def resident(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def peak_child(path, budget, policy, threads):
    """In a fresh process: compile the step from `path` (its feeds in path + '.npz') under the
    budget, reset the peak resident set, run one step; prints the growth of the resident set."""
    import json

    import kiln

    proto = onnx.load(path)
    params = [i.name for i in proto.graph.initializer
              if i.data_type == onnx.TensorProto.FLOAT and "running_" not in i.name]
    feeds = dict(np.load(path + ".npz"))
    trainer = kiln.Trainer(path, params=params, optimizer="adamw", lr=1e-3, threads=threads, db="",
                           memory_budget=budget or None, checkpoint_policy=policy)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident set starts again from the current one
    before = resident("VmRSS")
    trainer.step(feeds)
    print(json.dumps({"measured": resident("VmHWM") - before}))


def memory_table(name, threads, steps):
    """Checkpointing under budgets on `name`: the table rows (markdown)."""
    import json
    import subprocess
    import tempfile

    import kiln

    _, data, feeds, params, batch, label = export_step(name)
    plans = [(0, "none", "dp")]
    base = kiln.Trainer(data, params=params, optimizer="adamw", lr=1e-3, threads=threads, db="")
    full = base.stats["activation_bytes"]
    for share in (0.5, 0.2):
        for policy in ("dp", "sqrt"):
            plans.append((int(full * share), f"{int(share * 100)}%", policy))
    rows, trainers = [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "step.onnx")
        with open(path, "wb") as f:
            f.write(data)
        np.savez(path + ".npz", **feeds)
        for budget, share, policy in plans:
            try:
                trainer = base if budget == 0 else kiln.Trainer(
                    data, params=params, optimizer="adamw", lr=1e-3, threads=threads, db="", memory_budget=budget,
                    checkpoint_policy=policy)
            except kiln.KilnError as e:
                least = str(e).split("give a budget of at least ")[-1]
                rows.append((share, policy, budget, None, f"not met: the least Kiln reaches is {least}"))
                continue
            child = subprocess.run([sys.executable, os.path.abspath(__file__), "--peak-child", path, str(budget),
                                    policy, "--threads", str(threads)], capture_output=True, text=True, check=True)
            measured = json.loads(child.stdout.strip().splitlines()[-1])["measured"]
            trainers.append(trainer)
            rows.append((share, policy, budget, trainer, measured))
    times = {id(t): [] for t in trainers}
    for t in trainers:
        t.step(feeds)
    for _ in range(steps):
        for t in trainers:
            t0 = time.perf_counter()
            t.step(feeds)
            times[id(t)].append(time.perf_counter() - t0)
    base_time = statistics.median(times[id(base)])
    mib = 1 << 20
    out = [f"{label}, batch {batch}: activations without a budget {full / mib:.1f} MiB.", "",
           "| budget | policy | activations reported MiB | peak reported MiB | peak measured MiB | "
           "measured / reported | step s | added time % | recomputed (share of the forward's compute) % |",
           "|---|---|---|---|---|---|---|---|---|"]
    for share, policy, budget, trainer, measured in rows:
        head = f"| {share}" + (f" ({budget / mib:.1f} MiB)" if budget else "") + f" | {policy if budget else '-'} |"
        if trainer is None:
            out.append(head + f" {measured} | | | | | | |")
            continue
        s = trainer.stats
        step = statistics.median(times[id(trainer)])
        out.append(head + f" {s['activation_bytes'] / mib:.1f} | {s['peak_bytes'] / mib:.1f} | "
                   f"{measured / mib:.1f} | {measured / s['peak_bytes']:.3f} | {step:.3f} | "
                   f"{100 * (step / base_time - 1):+.1f} | {100 * s.get('recompute_share', 0):.1f} |")
    return out


def measure(name, threads, steps):
    import kiln

    model, data, feeds, params, batch, label = export_step(name)
    x, onehot = torch.from_numpy(feeds["x"]), torch.from_numpy(feeds["onehot"])
    t0 = time.perf_counter()
    trainer = kiln.Trainer(data, params=params, optimizer="adamw", lr=1e-3, threads=threads, db="")
    compile_s = time.perf_counter() - t0
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
    ap.add_argument("--models", default="resnet18", help="resnet18, bert, mobilenet_v2 and/or lstm (comma-separated)")
    ap.add_argument("--no-memory", dest="memory", action="store_false",
                    help="skip the checkpointing table (budgets at 50% and 20% of the activation bytes)")
    ap.add_argument("--peak-child", nargs=3, metavar=("MODEL", "BUDGET", "POLICY"), help=argparse.SUPPRESS)
    ap.add_argument("--no-curves", dest="curves", action="store_false",
                    help="skip the 300-step loss curves of a small CNN and a small transformer")
    ap.add_argument("--write-doc", action="store_true")
    args = ap.parse_args()
    if args.peak_child:
        path, budget, policy = args.peak_child
        peak_child(path, int(budget), policy, args.threads)
        return
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
    memory = []
    if args.memory:
        memory = memory_table(args.models.split(",")[0], args.threads, args.steps)
        print("\n".join(memory), flush=True)
    curves = ["| model | steps | first loss | Kiln final loss | PyTorch final loss | final differs % | "
              "largest step difference % |", "|---|---|---|---|---|---|---|"]
    if args.curves:
        for name in ("cnn", "transformer"):
            curves.append(curve(name, args.threads))
            print(curves[-1], flush=True)
    if args.write_doc:
        write_table(DOC, "<!-- bench_training: begin -->", "<!-- bench_training: end -->", "\n".join(out))
        if args.memory:
            write_table(DOC, "<!-- bench_training memory: begin -->", "<!-- bench_training memory: end -->",
                        "\n".join(memory))
        if args.curves:
            write_table(DOC, "<!-- bench_training curves: begin -->", "<!-- bench_training curves: end -->",
                        "\n".join(curves))


if __name__ == "__main__":
    main()
