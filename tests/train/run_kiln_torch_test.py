"""kiln.torch.compile: a module whose forward and backward run in Kiln, in an ordinary PyTorch
training loop with torch.optim, against the same loop on the plain module: every step's loss,
the input's gradient and the final parameters equal; the parameters stay PyTorch's (the
optimizer's updates are what the next call reads). BatchNormalization in training form (its
running statistics too), then eval(); batches of changing sizes; Dropout in training form (the
backward uses the forward's mask); parameters of equal values kept apart.

    PYTHONPATH=build/python run_kiln_torch_test.py
"""
import copy

import numpy as np
import torch

import kiln.torch
from cases import case, finish


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.fc1 = torch.nn.Linear(4 * 6 * 6, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x):
        h = torch.relu(self.conv(x)).flatten(1)
        return self.fc2(torch.tanh(self.norm(self.fc1(h))))


@case
def a_training_loop_matches_pytorch():
    torch.manual_seed(4)
    plain = Net()
    compiled = kiln.torch.compile(copy.deepcopy(plain), threads=2)
    assert {n for n, _ in compiled.named_parameters()} == {"module." + n for n, _ in plain.named_parameters()}
    opt_a = torch.optim.AdamW(plain.parameters(), lr=0.01)
    opt_b = torch.optim.AdamW(compiled.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(5)
    losses_a, losses_b = [], []
    for step in range(6):
        x = torch.randn(5, 2, 6, 6, generator=gen)
        target = torch.randn(5, 3, generator=gen)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        for model, opt, xi, losses in ((plain, opt_a, xa, losses_a), (compiled, opt_b, xb, losses_b)):
            opt.zero_grad()
            loss = ((model(xi) - target) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        np.testing.assert_allclose(xb.grad.numpy(), xa.grad.numpy(), rtol=1e-3,
                                   atol=1e-4 * float(xa.grad.abs().max()), err_msg=f"input gradient, step {step}")
    np.testing.assert_allclose(losses_b, losses_a, rtol=1e-4)
    assert losses_a[-1] < losses_a[0], losses_a
    for (name, p), (_, q) in zip(plain.named_parameters(), compiled.module.named_parameters()):
        np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), rtol=1e-3,
                                   atol=1e-4 * float(p.abs().max()), err_msg=name)


@case
def not_a_module_is_refused():
    try:
        kiln.torch.compile(lambda x: x)
    except TypeError as e:
        assert "torch.nn.Module" in str(e)
        return
    raise AssertionError("no TypeError")


class BnNet(torch.nn.Module):
    def __init__(self, dropout=0.0):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.drop = torch.nn.Dropout(dropout)
        self.fc = torch.nn.Linear(4 * 6 * 6, 3)

    def forward(self, x):
        return self.fc(self.drop(torch.relu(self.bn(self.conv(x)))).flatten(1))


def steps(plain, compiled, batches, lr=0.05):
    """SGD steps of both on the same batches; the losses and the inputs' gradients of each."""
    opt_a = torch.optim.SGD(plain.parameters(), lr=lr, momentum=0.9)
    opt_b = torch.optim.SGD(compiled.parameters(), lr=lr, momentum=0.9)
    out = []
    for x, target in batches:
        row = []
        for model, opt in ((plain, opt_a), (compiled, opt_b)):
            xi = x.clone().requires_grad_()
            opt.zero_grad()
            loss = ((model(xi) - target) ** 2).mean()
            loss.backward()
            opt.step()
            row.append((float(loss), xi.grad.numpy()))
        out.append(row)
    return out


def close(b, a, what):
    np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4 * float(np.abs(a).max() + 1e-30), err_msg=what)


@case
def batch_norm_in_training_form_matches_pytorch():
    # Normalized with the batch's statistics, running statistics updated as PyTorch's (unbiased
    # variance, batches counted); then eval() uses them: another program, the same answers.
    torch.manual_seed(6)
    plain = BnNet().train()
    compiled = kiln.torch.compile(copy.deepcopy(plain), threads=2)
    gen = torch.Generator().manual_seed(7)
    batches = [(torch.randn(5, 2, 6, 6, generator=gen) * 3 + 1, torch.randn(5, 3, generator=gen)) for _ in range(4)]
    for step, ((la, ga), (lb, gb)) in enumerate(steps(plain, compiled, batches)):
        np.testing.assert_allclose(lb, la, rtol=1e-4, err_msg=f"loss, step {step}")
        close(gb, ga, f"input gradient, step {step}")
    for (name, p), (_, q) in zip(plain.state_dict().items(), compiled.module.state_dict().items()):
        close(q.numpy().astype(np.float64), p.numpy().astype(np.float64), name)
    assert int(compiled.module.bn.num_batches_tracked) == 4
    # The running statistics moved from their start (0 and 1), so the comparison above says something.
    assert float((plain.bn.running_var - 1).abs().max()) > 0.1, plain.bn.running_var
    assert float(plain.bn.running_mean.abs().max()) > 0.1, plain.bn.running_mean
    plain.eval()
    compiled.eval()
    x = torch.randn(3, 2, 6, 6, generator=gen)
    with torch.no_grad():
        close(compiled(x).numpy(), plain(x).numpy(), "eval output")
    assert len(compiled._built) == 2


@case
def each_input_shape_gets_its_program():
    torch.manual_seed(8)
    plain = Net()
    compiled = kiln.torch.compile(copy.deepcopy(plain), threads=2)
    gen = torch.Generator().manual_seed(9)
    batches = [(torch.randn(n, 2, 6, 6, generator=gen), torch.randn(n, 3, generator=gen)) for n in (3, 7, 3)]
    for step, ((la, ga), (lb, gb)) in enumerate(steps(plain, compiled, batches, lr=0.01)):
        np.testing.assert_allclose(lb, la, rtol=1e-4, err_msg=f"loss, step {step}")
        close(gb, ga, f"input gradient, step {step}")
    assert len(compiled._built) == 2


class DropNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 64)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.fc(x))


@case
def dropout_in_training_form_masks_forward_and_backward_alike():
    # Kiln draws the masks (not PyTorch's generator): each call a fresh one, about half dropped,
    # and the backward uses the forward's: d/dx of <y, g> = ((y != 0) * 2 g) W.
    torch.manual_seed(12)
    compiled = kiln.torch.compile(DropNet().train(), threads=2)
    w = compiled.module.fc.weight.detach()
    gen = torch.Generator().manual_seed(13)
    kept = []
    for step in range(2):
        x = torch.randn(64, 64, generator=gen).requires_grad_()
        g = torch.randn(64, 64, generator=gen)
        rng = torch.get_rng_state()
        y = compiled(x)
        # The export (its trace draws a Dropout mask) leaves PyTorch's generator as it was.
        assert torch.equal(torch.get_rng_state(), rng)
        (y * g).sum().backward()
        keep = (y != 0).float()
        kept.append(keep)
        assert 0.45 < float(keep.mean()) < 0.55, float(keep.mean())
        close(x.grad.numpy(), ((keep * 2 * g) @ w).numpy(), f"input gradient, step {step}")
        with torch.no_grad():
            close(y.numpy(), (keep * 2 * compiled.module.fc(x)).numpy(), f"output, step {step}")
    assert not torch.equal(kept[0], kept[1])
    compiled.eval()
    x = torch.randn(4, 64, generator=gen)
    with torch.no_grad():
        close(compiled(x).numpy(), compiled.module(x).numpy(), "eval output")


class TwoNorms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(8)
        self.fc = torch.nn.Linear(8, 8)
        self.norm2 = torch.nn.LayerNorm(8)

    def forward(self, x):
        return self.norm2(self.fc(self.norm1(x)))


@case
def parameters_of_equal_values_stay_apart():
    # Two fresh LayerNorms have equal weights (ones) and biases (zeros): exporting in eval mode
    # (training in eval mode: frozen statistics) would merge them into one graph input, and the
    # second's would neither be read nor trained.
    torch.manual_seed(10)
    plain = TwoNorms().eval()
    compiled = kiln.torch.compile(copy.deepcopy(plain), threads=2)
    gen = torch.Generator().manual_seed(11)
    batches = [(torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen)) for _ in range(3)]
    for step, ((la, ga), (lb, gb)) in enumerate(steps(plain, compiled, batches)):
        np.testing.assert_allclose(lb, la, rtol=1e-4, err_msg=f"loss, step {step}")
    for (name, p), (_, q) in zip(plain.named_parameters(), compiled.module.named_parameters()):
        close(q.detach().numpy(), p.detach().numpy(), name)
    assert not torch.equal(plain.norm1.weight, plain.norm2.weight)


if __name__ == "__main__":
    finish()
