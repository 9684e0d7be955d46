"""Losses against PyTorch's: kiln.Trainer with a loss Kiln appends (mse, l1, bce of logits,
cross-entropy of logits against class indices, also with spatial dims), and a model exported
with torch.nn.CrossEntropyLoss inside (SoftmaxCrossEntropyLoss, with weights and ignore_index);
from the same weights and batches, every SGD step's loss and the final parameters must equal
torch.optim's, and the loss must fall. A target of the wrong shape or dtype is an error naming it.

    PYTHONPATH=build/python run_losses_test.py
"""
import copy
import io

import numpy as np
import torch

import kiln
from cases import case, finish


class Net(torch.nn.Module):
    """[N, 6] -> [N, 5], or with spatial=True [N, 6, 3] -> [N, 5, 3] (per-position logits)."""

    def __init__(self, spatial=False):
        super().__init__()
        self.spatial = spatial
        self.fc1 = torch.nn.Linear(6, 16)
        self.fc2 = torch.nn.Linear(16, 5)

    def forward(self, x):
        if self.spatial:
            x = x.transpose(1, 2)
        y = self.fc2(torch.tanh(self.fc1(x)))
        return y.transpose(1, 2) if self.spatial else y


def export(module, example, names=("x",)):
    buf = io.BytesIO()
    torch.onnx.export(module, example, buf, input_names=list(names), output_names=["y"], opset_version=17,
                      do_constant_folding=False)
    return buf.getvalue()


def batches(kind, spatial, n=6, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((8, 6, 3) if spatial else (8, 6)).astype(np.float32)
        out_shape = (8, 5, 3) if spatial else (8, 5)
        if kind == "cross_entropy":
            t = x[:, :5].argmax(axis=1).astype(np.int64)
        elif kind == "bce":
            t = (rng.random(out_shape) < 0.5).astype(np.float32)
        else:
            t = np.tanh(x[:, :5] * 2).astype(np.float32)
        out.append({"x": x, "target": t})
    return out


TORCH_LOSS = {"mse": torch.nn.MSELoss(), "l1": torch.nn.L1Loss(), "bce": torch.nn.BCEWithLogitsLoss(),
              "cross_entropy": torch.nn.CrossEntropyLoss()}


def compare(trainer, reference, opt, data, torch_loss):
    """Steps the trainer and torch.optim over `data`: equal losses, a falling loss, equal parameters."""
    kiln_losses, torch_losses = [], []
    for feeds in data:
        kiln_losses.append(trainer.step(feeds))
        opt.zero_grad()
        loss = torch_loss(feeds)
        loss.backward()
        opt.step()
        torch_losses.append(float(loss))
    np.testing.assert_allclose(kiln_losses, torch_losses, rtol=1e-4, atol=1e-6)
    assert torch_losses[-1] < torch_losses[0], f"the loss did not fall: {torch_losses}"
    for name, p in reference.named_parameters():
        want = p.detach().numpy()
        np.testing.assert_allclose(trainer.params[name], want, rtol=1e-3, atol=1e-4 * float(np.abs(want).max()),
                                   err_msg=name)


def train_both(kind, spatial=False, lr=0.1):
    torch.manual_seed(5)
    module = Net(spatial)
    reference = copy.deepcopy(module)
    data = batches(kind, spatial)
    trainer = kiln.Trainer(export(module, (torch.from_numpy(data[0]["x"]),)), loss=kind,
                           params=[n for n, _ in module.named_parameters()], lr=lr, optimizer="sgd",
                           momentum=0.5, threads=2, db="")
    opt = torch.optim.SGD(reference.parameters(), lr=lr, momentum=0.5)
    compare(trainer, reference, opt, data,
            lambda f: TORCH_LOSS[kind](reference(torch.from_numpy(f["x"])), torch.from_numpy(f["target"])))
    return trainer


@case
def mse():
    train_both("mse")


@case
def l1():
    train_both("l1")


@case
def bce_of_logits():
    train_both("bce")


@case
def cross_entropy_of_class_indices():
    train_both("cross_entropy")


@case
def cross_entropy_per_position():
    train_both("cross_entropy", spatial=True)


class WithCrossEntropy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = Net()
        self.loss = torch.nn.CrossEntropyLoss(weight=torch.tensor([0.5, 1.0, 2.0, 1.5, 0.75]), ignore_index=2)

    def forward(self, x, target):
        return self.loss(self.net(x), target)


@case
def exported_cross_entropy_with_weights_and_ignore_index():
    torch.manual_seed(6)
    module = WithCrossEntropy()
    reference = copy.deepcopy(module)
    data = batches("cross_entropy", False)
    assert any((b["target"] == 2).any() for b in data), "no ignored target in the batches"
    proto = export(module, (torch.from_numpy(data[0]["x"]), torch.from_numpy(data[0]["target"])), ("x", "target"))
    assert b"SoftmaxCrossEntropyLoss" in proto, "torch exported no SoftmaxCrossEntropyLoss"
    params = [n for n, _ in module.named_parameters()]
    trainer = kiln.Trainer(proto, loss="y", params=params, lr=0.1, optimizer="sgd", threads=2, db="")
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    compare(trainer, reference, opt, data, lambda f: reference(torch.from_numpy(f["x"]), torch.from_numpy(f["target"])))


@case
def wrong_targets_are_errors():
    trainer = train_both("mse")
    feeds = batches("mse", False, n=1)[0]
    for target, fragment in ((feeds["target"][:, :3], "target"), (feeds["target"].astype(np.float64), "target")):
        try:
            trainer.step({"x": feeds["x"], "target": target})
        except kiln.KilnError as e:
            assert fragment in str(e), str(e)
            continue
        raise AssertionError(f"no error for a target {target.shape} {target.dtype}")
    try:
        kiln.Trainer(export(Net(), (torch.from_numpy(feeds["x"]),)), loss="mse", target="x", db="")
    except kiln.KilnError as e:
        assert "already has a value named 'x'" in str(e), str(e)
    else:
        raise AssertionError("no error for a target named like an input")


if __name__ == "__main__":
    finish()
