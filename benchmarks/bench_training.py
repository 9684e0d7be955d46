#!/usr/bin/env python3
"""One training step (forward, backward, AdamW update) in Kiln (kiln.Trainer: the step compiled
as one graph) and in PyTorch eager, in the same run, from the same weights on the same batch.

torchvision's resnet18 (10 classes) at batch 16, 224x224, in training mode (BatchNormalization
with the batch's statistics, exported in training form) and a log-softmax cross-entropy loss.
Reports the compile time, the median step time over --steps after one warm-up step (the two
alternate step by step, so a change in the host's load falls on both), the ratio, and the first
step's loss on both sides (they must agree).

    bench_training.py [--threads 2] [--steps 5] [--batch 16] [--write-doc]
"""
import argparse
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--write-doc", action="store_true")
    args = ap.parse_args()
    import kiln

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = WithLoss(torchvision.models.resnet18(num_classes=10)).train()
    x = torch.randn(args.batch, 3, 224, 224)
    onehot = torch.nn.functional.one_hot(torch.randint(0, 10, (args.batch,)), 10).float()
    buf = io.BytesIO()
    torch.onnx.export(model, (x, onehot), buf, input_names=["x", "onehot"], output_names=["loss"], opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    model.train()
    proto = onnx.load_from_string(buf.getvalue())
    params = [i.name for i in proto.graph.initializer if "running_" not in i.name and "num_batches" not in i.name]
    t0 = time.perf_counter()
    trainer = kiln.Trainer(buf.getvalue(), params=params, optimizer="adamw", lr=1e-3, threads=args.threads, db="")
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
    for _ in range(args.steps):
        t0 = time.perf_counter()
        trainer.step(feeds)
        kiln_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        torch_step()
        torch_times.append(time.perf_counter() - t0)
    k, p = statistics.median(kiln_times), statistics.median(torch_times)
    assert abs(kiln_first - torch_first) <= 1e-4 * abs(torch_first), (kiln_first, torch_first)
    out = [f"Host: {host_name()} ({os.cpu_count()} cores); Kiln {kiln.__version__}, PyTorch {torch.__version__}; "
           f"{args.threads} threads; median of {args.steps} steps after one warm-up.", "",
           "| model | batch | Kiln compile s | Kiln step s | PyTorch eager step s | Kiln / PyTorch | first loss Kiln / PyTorch |",
           "|---|---|---|---|---|---|---|",
           f"| resnet18 (BN in training form), AdamW | {args.batch} | {compile_s:.1f} | {k:.2f} | {p:.2f} | {k / p:.2f} | "
           f"{kiln_first:.6f} / {torch_first:.6f} |"]
    print("\n".join(out))
    if args.write_doc:
        write_table(DOC, "<!-- bench_training: begin -->", "<!-- bench_training: end -->", "\n".join(out))


if __name__ == "__main__":
    main()
