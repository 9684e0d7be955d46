"""Training steps against PyTorch's: kiln.Trainer compiles forward, backward, gradient clipping
and the optimizer's update as one graph; from the same initial weights and batches, every
step's loss and the final parameters must equal what torch.optim gives, for SGD (momentum,
Nesterov, weight decay), Adam and AdamW, with and without clipping by global norm; the loss
must actually fall (an informative comparison).

    PYTHONPATH=build/python run_torch_training_test.py
"""
import copy
import io

import numpy as np
import torch

import kiln
from cases import case, finish


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(12, 24)
        self.norm = torch.nn.LayerNorm(24)
        self.fc2 = torch.nn.Linear(24, 4)

    def forward(self, x, onehot):
        h = torch.tanh(self.norm(self.fc1(x)))
        logp = torch.log_softmax(self.fc2(h), dim=-1)
        return -(logp * onehot).sum() / x.shape[0]


def batches(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal((8, 12)).astype(np.float32)
        labels = (x[:, :4].argmax(axis=1))
        out.append({"x": x, "onehot": np.eye(4, dtype=np.float32)[labels]})
    return out


def export(module):
    buf = io.BytesIO()
    data = batches(1, 0)[0]
    torch.onnx.export(module, (torch.from_numpy(data["x"]), torch.from_numpy(data["onehot"])), buf,
                      input_names=["x", "onehot"], output_names=["loss"], opset_version=17,
                      do_constant_folding=False)
    return buf.getvalue()


def train_both(make_optimizer, clip_norm=0.0, steps=8, lr=0.05, **kiln_args):
    torch.manual_seed(3)
    module = Classifier()
    reference = copy.deepcopy(module)
    trainer = kiln.Trainer(export(module), loss="loss", params=[n for n, _ in module.named_parameters()],
                           lr=lr, clip_norm=clip_norm, threads=2, db="", **kiln_args)
    opt = make_optimizer(reference.parameters(), lr)
    kiln_losses, torch_losses = [], []
    for feeds in batches(steps, 1):
        kiln_losses.append(trainer.step(feeds))
        opt.zero_grad()
        loss = reference(torch.from_numpy(feeds["x"]), torch.from_numpy(feeds["onehot"]))
        loss.backward()
        if clip_norm:
            torch.nn.utils.clip_grad_norm_(reference.parameters(), clip_norm)
        opt.step()
        torch_losses.append(float(loss))
    np.testing.assert_allclose(kiln_losses, torch_losses, rtol=1e-4, atol=1e-5)
    assert torch_losses[-1] < torch_losses[0] - 0.05, f"the loss did not fall: {torch_losses}"
    for name, p in reference.named_parameters():
        want = p.detach().numpy()
        np.testing.assert_allclose(trainer.params[name], want, rtol=1e-3, atol=1e-4 * float(np.abs(want).max()),
                                   err_msg=name)
    return kiln_losses


@case
def sgd_with_momentum_and_weight_decay():
    train_both(lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9, weight_decay=0.01),
               optimizer="sgd", momentum=0.9, weight_decay=0.01)


@case
def sgd_nesterov_with_clipping():
    train_both(lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.8, nesterov=True), clip_norm=0.5,
               optimizer="sgd", momentum=0.8, nesterov=True)


@case
def adam():
    train_both(lambda ps, lr: torch.optim.Adam(ps, lr=lr), lr=0.01, optimizer="adam")


@case
def adamw_with_clipping():
    train_both(lambda ps, lr: torch.optim.AdamW(ps, lr=lr, weight_decay=0.05), lr=0.01, clip_norm=1.0,
               optimizer="adamw", weight_decay=0.05)


class BatchNormNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x, onehot):
        h = torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))
        return -(torch.log_softmax(self.fc(h), dim=-1) * onehot).sum() / x.shape[0]


@case
def batch_norm_in_training_form():
    # BatchNormalization with the batch's statistics (exported in training mode): the losses
    # and parameters of torch's train() mode, and the running mean updated as torch does.
    torch.manual_seed(8)
    module = BatchNormNet()
    rng = np.random.default_rng(9)
    data = []
    for _ in range(3):
        x = (rng.standard_normal((6, 3, 5, 5)) * 2 + 1).astype(np.float32)
        data.append({"x": x, "onehot": np.eye(3, dtype=np.float32)[(x[:, 0].mean(axis=(1, 2)) > 1).astype(int)]})
    buf = io.BytesIO()
    torch.onnx.export(module.train(), (torch.from_numpy(data[0]["x"]), torch.from_numpy(data[0]["onehot"])), buf,
                      input_names=["x", "onehot"], output_names=["loss"], opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    proto = buf.getvalue()
    # Copied after the export: tracing ran the module once, which updated its running statistics
    # before the exporter stored them.
    reference = copy.deepcopy(module).train()
    trainer = kiln.Trainer(proto, lr=0.05, optimizer="sgd", momentum=0.9, threads=2, db="")
    assert "bn.weight" in trainer.params and "bn.running_mean" not in trainer.params, list(trainer.params)
    assert "bn.running_mean" in trainer.state, list(trainer.state)
    opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    kiln_losses, torch_losses = [], []
    for feeds in data * 4:
        kiln_losses.append(trainer.step(feeds))
        opt.zero_grad()
        loss = reference(torch.from_numpy(feeds["x"]), torch.from_numpy(feeds["onehot"]))
        loss.backward()
        opt.step()
        torch_losses.append(float(loss))
    np.testing.assert_allclose(kiln_losses, torch_losses, rtol=1e-4, atol=1e-6)
    assert sum(torch_losses[-3:]) < sum(torch_losses[:3]) - 0.1, torch_losses  # the same batches, epochs 4 and 1
    for name, p in reference.named_parameters():
        want = p.detach().numpy()
        np.testing.assert_allclose(trainer.params[name], want, rtol=1e-3, atol=1e-4 * float(np.abs(want).max()),
                                   err_msg=name)
    np.testing.assert_allclose(trainer.state["bn.running_mean"], reference.bn.running_mean.numpy(), rtol=1e-4,
                               atol=1e-5)
    # The running variance follows ONNX (the batch's biased variance), torch keeps the unbiased
    # one: they differ by about n / (n - 1) = 150 / 149 here, so only its having moved is checked.
    assert not np.allclose(trainer.state["bn.running_var"], 1.0), trainer.state["bn.running_var"]


@case
def bad_settings_are_errors():
    data = export(Classifier())
    for kwargs, fragment in (({"optimizer": "lion"}, "Kiln has sgd, adam and adamw"),
                             ({"nesterov": True}, "nesterov needs"),
                             ({"loss": "nope"}, "no value 'nope'")):
        try:
            kiln.Trainer(data, db="", **kwargs)
        except kiln.KilnError as e:
            assert fragment in str(e), (fragment, str(e))
            continue
        raise AssertionError(f"no error for {kwargs}")
    try:
        kiln.Trainer(data, db="", params=["nope"])
    except kiln.KilnError as e:
        assert "not initializers" in str(e), str(e)
    else:
        raise AssertionError("no error for an unknown parameter")


if __name__ == "__main__":
    finish()
