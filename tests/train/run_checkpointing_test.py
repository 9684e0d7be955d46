"""Automatic checkpointing (kiln.Trainer(memory_budget=...), docs/training.md): a step under a
budget recomputes forward values in the backward and must give the unbudgeted step's losses and
parameters bit for bit, with its planned activation memory under the budget (here the backward's
own working set, a convolution's columns for its weight gradient, bounds what any plan reaches); the dynamic program
must recompute no more than Chen et al.'s sqrt(n) segments at the same budget; a budget it cannot
meet, and a budget on symbolic shapes, are errors saying why; the CLI reports the plan.

    PYTHONPATH=build/python run_checkpointing_test.py --kiln build/bin/kiln
"""
import argparse
import io
import os
import subprocess
import tempfile

import numpy as np
import torch

import kiln
from cases import case, finish

parser = argparse.ArgumentParser()
parser.add_argument("--kiln", required=True)
ARGS = parser.parse_args()


class Net(torch.nn.Module):
    """Eight conv + BN + ReLU blocks (one residual), pooled, then a linear layer: a forward whose
    activations dominate the step's memory."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
            for _ in range(8))
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = self.stem(x)
        for i, b in enumerate(self.blocks):
            y = b(y) + y if i == 3 else b(y)
        return self.fc(y.mean(dim=(2, 3)))


def export(dynamic=False):
    buf = io.BytesIO()
    net = Net().train()
    torch.onnx.export(net, torch.zeros(4, 3, 32, 32), buf, input_names=["x"], output_names=["y"], opset_version=17,
                      do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING,
                      dynamic_axes={"x": {0: "n"}, "y": {0: "n"}} if dynamic else None)
    return buf.getvalue()


MODEL = export()


def batches(n=3):
    rng = np.random.default_rng(7)
    return [{"x": rng.standard_normal((4, 3, 32, 32)).astype(np.float32),
             "target": rng.integers(0, 5, size=(4,)).astype(np.int64)} for _ in range(n)]


def trainer(**kw):
    return kiln.Trainer(MODEL, loss="cross_entropy", optimizer="adamw", lr=0.01, threads=2, **kw)


def run(t):
    losses = [t.step(b) for b in batches()]
    return losses, {k: v.copy() for k, v in t.params.items()}


BASE = trainer()
BASE_LOSSES, BASE_PARAMS = run(BASE)
FULL = BASE.stats["activation_bytes"]


def same_training(t):
    losses, params = run(t)
    assert losses == BASE_LOSSES, (losses, BASE_LOSSES)
    for k, v in params.items():
        assert np.array_equal(v, BASE_PARAMS[k]), k
    assert np.std(BASE_PARAMS["fc.weight"]) > 0 and len(set(BASE_LOSSES)) == len(BASE_LOSSES)


def refused(what, make, *fragments):
    """make() must raise KilnError whose message holds every fragment."""
    try:
        make()
    except kiln.KilnError as e:
        assert all(f in str(e) for f in fragments), (what, str(e))
    else:
        raise AssertionError(f"{what} was accepted")


@case
def budget_is_met_bit_for_bit():
    budget = int(FULL * 0.6)
    t = trainer(memory_budget=budget)
    s = t.stats
    assert s["unbudgeted_activation_bytes"] == FULL, (s, FULL)
    assert s["activation_bytes"] <= budget, s
    assert s["recomputed_calls"] > 0 and s["recomputed_segments"] + s["recomputed_values"] > 0, s
    assert 0 < s["recompute_share"] <= 1.0, s
    same_training(t)


@case
def dp_recomputes_no_more_than_sqrt_n():
    for share in (0.8, 0.6):
        budget = int(FULL * share)
        dp = trainer(memory_budget=budget).stats
        sq = trainer(memory_budget=budget, checkpoint_policy="sqrt")
        assert sq.stats["activation_bytes"] <= budget, sq.stats
        assert dp["recompute_share"] <= sq.stats["recompute_share"] + 1e-12, (share, dp, sq.stats)
    same_training(sq)


@case
def values_recomputed_alone_go_below_segments():
    # The dp drops single values (a BatchNormalization's or ReLU's output, made again from the
    # convolution output the backward keeps anyway) as well as segments: at 40% it fits where
    # equal segments cannot.
    budget = int(FULL * 0.4)
    refused("sqrt segments at 40%", lambda: trainer(memory_budget=budget, checkpoint_policy="sqrt"), "cannot be met")
    t = trainer(memory_budget=budget)
    s = t.stats
    assert s["activation_bytes"] <= budget and s["recomputed_values"] > 0, s
    same_training(t)


@case
def gradients_die_at_their_update():
    # Four 128-channel 3x3 conv + BN + ReLU blocks on 4x4 images: the weight gradients dwarf the
    # activations. Each parameter's AdamW update runs as soon as its gradient exists, so the
    # step never holds all four weight gradients (it held five weights' worth before).
    torch.manual_seed(5)
    net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Conv2d(128, 128, 3, padding=1),
                                                    torch.nn.BatchNorm2d(128), torch.nn.ReLU())
                                for _ in range(4)]).train()
    buf = io.BytesIO()
    torch.onnx.export(net, torch.zeros(2, 128, 4, 4), buf, input_names=["x"], output_names=["y"], opset_version=17,
                      do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING)
    t = kiln.Trainer(buf.getvalue(), loss="mse", optimizer="adamw", lr=0.01, threads=1)
    weight = 128 * 128 * 9 * 4
    assert 0 < t.stats["activation_bytes"] <= 3 * weight, (t.stats, weight)


@case
def budget_above_need_recomputes_nothing():
    s = trainer(memory_budget=FULL * 2).stats
    assert s["activation_bytes"] == FULL and s.get("recomputed_calls", 0) == 0, s


@case
def budget_too_small_says_the_least():
    refused("a 1 KB budget", lambda: trainer(memory_budget="1KB"), "cannot be met", "at least", "1024 bytes")


@case
def budget_needs_static_shapes():
    refused("a budget on a symbolic batch",
            lambda: kiln.Trainer(export(dynamic=True), loss="cross_entropy", memory_budget="1MB"), "static shapes")


@case
def bad_budget_values():
    for bad, text in ((-5, "positive"), ("12 parsecs", "byte size"), ("3XB", "unit")):
        refused(f"memory_budget={bad!r}", lambda: trainer(memory_budget=bad), text)
    refused("an unknown policy", lambda: trainer(memory_budget="1MB", checkpoint_policy="greedy"), "dp and sqrt")


@case
def cli_reports_the_plan():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "net.onnx")
        with open(path, "wb") as f:
            f.write(MODEL)
        base = [ARGS.kiln, "info", path, "--train", "--loss", "cross-entropy", "--optimizer", "adamw", "--memory",
                "--threads", "2", "--no-db"]
        out = subprocess.run(base, capture_output=True, text=True, check=True).stdout
        assert "activations" in out and "peak a run allocates" in out and "recomputed" not in out, out
        assert "largest at the peak" in out and BASE.stats["peak_at"] in out, (out, BASE.stats)
        assert BASE.stats["peak_values"] and all(b > 0 for _, b in BASE.stats["peak_values"]), BASE.stats
        out = subprocess.run(base + ["--memory-budget", str(int(FULL * 0.7))], capture_output=True, text=True,
                             check=True).stdout
        assert "activations without budget" in out and "recomputed:" in out, out
        bad = subprocess.run(base + ["--memory-budget", "1K"], capture_output=True, text=True)
        assert bad.returncode != 0 and "cannot be met" in bad.stderr and path in bad.stderr, bad.stderr
        bad = subprocess.run([ARGS.kiln, "info", path, "--memory-budget", "1M"], capture_output=True, text=True)
        assert bad.returncode != 0 and "--memory-budget goes with --train" in bad.stderr, bad.stderr


finish()
