"""kiln.torch.compile: a module whose forward and backward run in Kiln, in an ordinary PyTorch
training loop with torch.optim, against the same loop on the plain module: every step's loss,
the input's gradient and the final parameters equal; the parameters stay PyTorch's (the
optimizer's updates are what the next call reads).

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


if __name__ == "__main__":
    finish()
