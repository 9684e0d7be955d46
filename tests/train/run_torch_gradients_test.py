"""Whole models' gradients against PyTorch's: a torch module whose forward ends in a loss is
exported to ONNX; kiln.compile(..., gradient_of="loss") appends the backward graph (reverse mode
over the graph IR, src/train) and compiles forward and backward together; every parameter's
gradient must match torch's autograd on the same inputs, and have spread (an informative
comparison). The models: an MLP, an attention block, CNNs with grouped and depthwise
convolutions, a two-layer LSTM language model. Also: an op without a gradient rule is an error naming every such op at once.

    PYTHONPATH=build/python run_torch_gradients_test.py
"""
import io

import numpy as np
import torch

import kiln
from cases import case, finish


def export(module, inputs, names):
    buf = io.BytesIO()
    torch.onnx.export(module, tuple(inputs), buf, input_names=names, output_names=["loss"], opset_version=17,
                      do_constant_folding=False)
    return buf.getvalue()


def compare(module, inputs, names, rtol=2e-3):
    """Kiln's gradients of every parameter against torch's, on the same inputs."""
    module.zero_grad()
    loss = module(*inputs)
    loss.backward()
    want = {n: p.grad.detach().numpy() for n, p in module.named_parameters()}
    model = kiln.compile(export(module, inputs, names), threads=2, db="", gradient_of="loss",
                         gradient_wrt=list(want))
    got = model.run({n: t.detach().numpy() for n, t in zip(names, inputs)})
    np.testing.assert_allclose(got["loss"], loss.detach().numpy(), rtol=1e-4, atol=1e-5)
    for name, g in want.items():
        assert g.std() > 1e-4, f"torch's gradient of {name} has no spread: the comparison would say nothing"
        k = got[name + "_grad"]
        scale = float(np.abs(g).max())
        np.testing.assert_allclose(k, g, rtol=rtol, atol=rtol * scale, err_msg=name)
    return len(want)


class Mlp(torch.nn.Module):
    """Embedding, LayerNorm, GELU (erf), a residual Linear, log-softmax cross-entropy against
    one-hot targets (the loss written out: the graph's ops are differentiated, not a loss op)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)
        self.out = torch.nn.Linear(16, 5)

    def forward(self, tokens, onehot):
        h = self.norm(self.emb(tokens))
        h = h + self.fc2(torch.nn.functional.gelu(self.fc1(h)))
        logp = torch.log_softmax(self.out(h), dim=-1)
        return -(logp * onehot).sum() / tokens.numel()


class Attention(torch.nn.Module):
    """One self-attention block: softmax(q k^T / sqrt(d)) v, batched MatMuls, Transpose, Reshape."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads, self.d = heads, d
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)

    def forward(self, x, target):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        split = lambda t: t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        return ((self.proj(y) - target) ** 2).mean()


class Cnn(torch.nn.Module):
    """Convolutions (padding, stride 2), ReLU, global average pooling, a Linear, MSE."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 6, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, x, target):
        h = torch.relu(self.c1(x))
        h = torch.relu(self.c2(h))
        h = torch.nn.functional.adaptive_avg_pool2d(h, 1).flatten(1)
        return ((self.fc(h) - target) ** 2).mean()


class MobileBlock(torch.nn.Module):
    """An inverted residual as in MobileNetV2: 1x1 expansion, ReLU6, a depthwise 3x3 (stride 1
    with the residual, and stride 2), a grouped 3x3 (2 groups), a 1x1 projection; MSE."""

    def __init__(self):
        super().__init__()
        self.expand = torch.nn.Conv2d(4, 12, 1)
        self.dw = torch.nn.Conv2d(12, 12, 3, padding=1, groups=12)
        self.dw2 = torch.nn.Conv2d(12, 24, 3, stride=2, padding=1, groups=12)
        self.grouped = torch.nn.Conv2d(24, 8, 3, padding=1, groups=2)
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x, target):
        h = torch.nn.functional.relu6(self.expand(x))
        h = h + torch.nn.functional.relu6(self.dw(h))
        h = torch.relu(self.grouped(self.dw2(h)))
        h = torch.nn.functional.adaptive_avg_pool2d(h, 1).flatten(1)
        return ((self.fc(h) - target) ** 2).mean()


class LstmModel(torch.nn.Module):
    """A two-layer LSTM language model's shape: Embedding, nn.LSTM (exported as two ONNX LSTM
    ops with their weights reordered from PyTorch's gate order), a Linear decoder, log-softmax
    cross-entropy against one-hot targets."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 8)
        self.lstm = torch.nn.LSTM(8, 6, num_layers=2)
        self.out = torch.nn.Linear(6, 5)

    def forward(self, tokens, onehot):
        h, _ = self.lstm(self.emb(tokens))
        logp = torch.log_softmax(self.out(h), dim=-1)
        return -(logp * onehot).sum() / tokens.numel()


@case
def lstm_language_model():
    torch.manual_seed(4)
    tokens = torch.randint(0, 20, (7, 3))
    onehot = torch.nn.functional.one_hot(torch.randint(0, 5, (7, 3)), 5).float()
    assert compare(LstmModel(), [tokens, onehot], ["tokens", "onehot"]) == 11


@case
def mlp_with_embedding_layernorm_gelu():
    torch.manual_seed(0)
    tokens = torch.randint(0, 20, (4, 6))
    onehot = torch.nn.functional.one_hot(torch.randint(0, 5, (4, 6)), 5).float()
    assert compare(Mlp(), [tokens, onehot], ["tokens", "onehot"]) == 9


@case
def attention_block():
    torch.manual_seed(1)
    assert compare(Attention(), [torch.randn(2, 5, 16), torch.randn(2, 5, 16)], ["x", "target"]) == 4


@case
def convolutional_network():
    torch.manual_seed(2)
    assert compare(Cnn(), [torch.randn(2, 3, 9, 9), torch.randn(2, 4)], ["x", "target"]) == 6


@case
def depthwise_and_grouped_convolutions():
    torch.manual_seed(3)
    assert compare(MobileBlock(), [torch.randn(3, 4, 10, 9), torch.randn(3, 3)], ["x", "target"]) == 10


@case
def ops_without_a_rule_are_named_at_once():
    class Rounded(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x):
            h = self.c(x)
            return torch.floor(h).sum() + torch.round(h).sum() + h.sum()

    module = Rounded()
    data = export(module, [torch.randn(1, 3, 8, 8)], ["x"])
    try:
        kiln.compile(data, db="", gradient_of="loss")
    except kiln.KilnError as e:
        message = str(e)
        assert "no gradient rule for 2 ops between the parameters and the loss" in message, message
        assert "Floor (" in message and "Round (" in message, message
        return
    raise AssertionError("compiled without the missing rules")


if __name__ == "__main__":
    finish()
