"""The model zoo shared by the model tests (tests/models) and the benchmarks.

Every model is built with fixed seeds and no downloaded weights, exported to ONNX
(opset 17, torch 1.13's exporter) into a cache directory, and fed the same fixed random
inputs everywhere. `export_models.py` fills the cache; `run_model_test.py` and
`benchmarks/bench_models.py` read it.
"""

import math
import os
import sys
from dataclasses import dataclass, field

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_CACHE_DIR = os.path.join(REPO_ROOT, "build", "models")
OPSET = 17
SEED = 1234


def cache_dir(override=None):
    """The export cache: --cache-dir, else $KILN_MODEL_CACHE, else <repo>/build/models."""
    return override or os.environ.get("KILN_MODEL_CACHE") or DEFAULT_CACHE_DIR


@dataclass
class ModelSpec:
    name: str
    kind: str                      # "vision", "bert" or "gpt2"
    image_size: int = 224          # vision models only
    seq_lengths: list = field(default_factory=lambda: [128])  # text models only
    # Comparison tolerance against onnxruntime: |kiln - ort| <= atol + rtol * |ort|.
    atol: float = 1e-4
    rtol: float = 1e-3
    reason: str = ""

    def path(self, cache=None):
        return os.path.join(cache_dir(cache), self.name + ".onnx")


_FP32_DEEP = ("fp32 reassociation in convolutions/matmuls (different blocking and "
              "summation order than ORT's MLAS) accumulates over depth")
_TRANSFORMER = ("12 transformer layers: summation-order differences in K=768/3072 matmuls, "
                "softmax and LayerNorm reductions compound; logits/hidden states are O(1)")

MODELS = [
    ModelSpec("resnet18", "vision", atol=1e-4, rtol=1e-3, reason=_FP32_DEEP),
    ModelSpec("resnet50", "vision", atol=2e-4, rtol=1e-3, reason=_FP32_DEEP + " (50 layers)"),
    ModelSpec("mobilenet_v2", "vision", atol=1e-4, rtol=1e-3, reason=_FP32_DEEP),
    ModelSpec("mobilenet_v3_small", "vision", atol=1e-4, rtol=1e-3,
              reason=_FP32_DEEP + "; hardswish/hardsigmoid are exact"),
    ModelSpec("efficientnet_b0", "vision", atol=2e-4, rtol=1e-3,
              reason=_FP32_DEEP + "; sigmoid/SiLU use different exp approximations"),
    ModelSpec("squeezenet1_1", "vision", atol=1e-4, rtol=1e-3, reason=_FP32_DEEP),
    ModelSpec("densenet121", "vision", atol=2e-4, rtol=1e-3,
              reason=_FP32_DEEP + " (121 layers, concatenated features)"),
    ModelSpec("inception_v3", "vision", image_size=299, atol=2e-4, rtol=1e-3,
              reason=_FP32_DEEP),
    ModelSpec("convnext_tiny", "vision", atol=5e-4, rtol=2e-3,
              reason=_FP32_DEEP + "; LayerNorm over channels and erf-GELU in every block"),
    ModelSpec("vit_b_16", "vision", atol=5e-4, rtol=2e-3, reason=_TRANSFORMER),
    ModelSpec("bert", "bert", seq_lengths=[128], atol=5e-4, rtol=2e-3, reason=_TRANSFORMER),
    ModelSpec("gpt2", "gpt2", seq_lengths=[1, 17, 128], atol=5e-4, rtol=2e-3,
              reason=_TRANSFORMER + "; tanh-GELU"),
    ModelSpec("lstm", "lstm", seq_lengths=[64], atol=1e-4, rtol=1e-3,
              reason="fp32 gate matmuls and sigmoid/tanh approximations over 64 steps and 2 layers"),
]
MODELS_BY_NAME = {m.name: m for m in MODELS}

BERT_VOCAB = 30522
GPT2_VOCAB = 50257
LSTM_VOCAB = 10000


def make_inputs(spec, seq_len=None):
    """Fixed random inputs for a model (the same on every call and in every tool)."""
    rng = np.random.default_rng(SEED)
    if spec.kind == "vision":
        shape = (1, 3, spec.image_size, spec.image_size)
        return {"input": rng.standard_normal(shape, dtype=np.float32)}
    seq = seq_len if seq_len is not None else spec.seq_lengths[-1]
    vocab = {"bert": BERT_VOCAB, "gpt2": GPT2_VOCAB, "lstm": LSTM_VOCAB}[spec.kind]
    return {"input_ids": rng.integers(0, vocab, size=(1, seq), dtype=np.int64)}


# ---------------------------------------------------------------------------
# Model definitions (torch is imported lazily: the test runner does not need it).


def _build_torch_model(spec):
    import torch
    torch.manual_seed(SEED)
    if spec.kind == "vision":
        import torchvision.models as tvm
        kwargs = {"weights": None}
        if spec.name == "inception_v3":
            kwargs.update(aux_logits=False, init_weights=True)
        model = getattr(tvm, spec.name)(**kwargs)
        _reinit_zero_heads(model)
        _condition_batchnorm(model, spec.image_size)
        return model.eval()
    if spec.kind == "bert":
        return _bert_model().eval()
    if spec.kind == "lstm":
        return _lstm_model().eval()
    return _gpt2_model().eval()


def _condition_batchnorm(model, image_size, batches=4, batch_size=4):
    """Runs random batches in train mode so BatchNorm running statistics are those of
    the data, not the identity (mean 0, var 1): without this, activations of a freshly
    initialized deep network vanish or explode in eval mode. Momentum None makes the
    running statistics the plain average over the batches."""
    import torch
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    saved = [bn.momentum for bn in bns]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    gen = torch.Generator().manual_seed(SEED + 1)
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(batch_size, 3, image_size, image_size, generator=gen))
    for bn, momentum in zip(bns, saved):
        bn.momentum = momentum
    model.eval()


def _reinit_zero_heads(model):
    """torchvision zero-initializes some classifier heads (ViT): with weights=None every
    logit would be 0. Give them N(0, 0.02) weights so the output has spread."""
    import torch
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and not m.weight.detach().any():
            torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)


def _bert_model():
    import torch
    from torch import nn

    hidden, layers, heads, ffn, max_pos = 768, 12, 12, 3072, 512

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(hidden, hidden)
            self.k = nn.Linear(hidden, hidden)
            self.v = nn.Linear(hidden, hidden)
            self.out = nn.Linear(hidden, hidden)

        def forward(self, x):
            b, s, _ = x.shape
            d = hidden // heads

            def split(t):
                return t.view(b, s, heads, d).transpose(1, 2)

            q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
            att = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
            att = torch.softmax(att, dim=-1)
            y = torch.matmul(att, v).transpose(1, 2).reshape(b, s, hidden)
            return self.out(y)

    def gelu_erf(x):
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = SelfAttention()
            self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
            self.fc1 = nn.Linear(hidden, ffn)
            self.fc2 = nn.Linear(ffn, hidden)
            self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

        def forward(self, x):
            x = self.ln1(x + self.attn(x))
            return self.ln2(x + self.fc2(gelu_erf(self.fc1(x))))

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(BERT_VOCAB, hidden)
            self.pos = nn.Embedding(max_pos, hidden)
            self.ln = nn.LayerNorm(hidden, eps=1e-12)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            _init_transformer(self)

        def forward(self, input_ids):
            s = input_ids.shape[1]
            pos = torch.arange(s, dtype=torch.long).unsqueeze(0)
            x = self.ln(self.tok(input_ids) + self.pos(pos))
            for layer in self.layers:
                x = layer(x)
            return x

    return Bert()


def _gpt2_model():
    import torch
    from torch import nn

    hidden, layers, heads, max_pos = 768, 12, 12, 1024

    class CausalAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.out = nn.Linear(hidden, hidden)
            mask = torch.tril(torch.ones(max_pos, max_pos, dtype=torch.bool))
            self.register_buffer("mask", mask.view(1, 1, max_pos, max_pos), persistent=False)

        def forward(self, x):
            b, s, _ = x.shape
            d = hidden // heads
            q, k, v = self.qkv(x).split(hidden, dim=2)

            def split(t):
                return t.view(b, s, heads, d).transpose(1, 2)

            q, k, v = split(q), split(k), split(v)
            att = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
            causal = self.mask[:, :, :s, :s]
            att = torch.where(causal, att, torch.tensor(torch.finfo(att.dtype).min))
            att = torch.softmax(att, dim=-1)
            y = torch.matmul(att, v).transpose(1, 2).reshape(b, s, hidden)
            return self.out(y)

    def gelu_tanh(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(hidden)
            self.attn = CausalAttention()
            self.ln2 = nn.LayerNorm(hidden)
            self.fc = nn.Linear(hidden, 4 * hidden)
            self.proj = nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.proj(gelu_tanh(self.fc(self.ln2(x))))

    class Gpt2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(GPT2_VOCAB, hidden)
            self.wpe = nn.Embedding(max_pos, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(hidden)
            _init_transformer(self)

        def forward(self, input_ids):
            s = input_ids.shape[1]
            pos = torch.arange(s, dtype=torch.long).unsqueeze(0)
            x = self.wte(input_ids) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            # Tied embeddings: the LM head reuses the token embedding matrix.
            return torch.matmul(self.ln_f(x), self.wte.weight.t())

    return Gpt2()


def _lstm_model():
    """A word-level LSTM language model: embedding 512, 2 LSTM layers of 512, linear decoder."""
    import torch
    from torch import nn

    hidden, layers = 512, 2

    class LstmLm(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(LSTM_VOCAB, hidden)
            self.lstm = nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True)
            self.decoder = nn.Linear(hidden, LSTM_VOCAB)
            # Uniform(-0.1, 0.1) as in the PyTorch word-LM example: gates neither saturate
            # nor vanish, so hidden states and logits keep their spread over 64 steps.
            for p in self.parameters():
                nn.init.uniform_(p, -0.1, 0.1)

        def forward(self, input_ids):
            out, _ = self.lstm(self.embed(input_ids))
            return self.decoder(out)

    return LstmLm()


def _init_transformer(module):
    """BERT/GPT-2 initialization: N(0, 0.02) weights, zero biases, unit LayerNorm."""
    from torch import nn
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def export(spec, path):
    """Builds the model with fixed seeds and exports it to `path` (ONNX, opset 17)."""
    import torch
    model = _build_torch_model(spec)
    inputs = make_inputs(spec)
    args = tuple(torch.from_numpy(v) for v in inputs.values())
    input_names = list(inputs.keys())
    dynamic_axes = None
    if spec.kind == "gpt2":
        dynamic_axes = {"input_ids": {0: "batch", 1: "seq"}, "output": {0: "batch", 1: "seq"}}
    tmp = path + ".tmp"
    # Gradients stay enabled: under no_grad torch 1.13 takes nn.MultiheadAttention's fast path
    # (aten::_native_multi_head_attention), which its ONNX exporter cannot export (vit_b_16).
    torch.onnx.export(model, args, tmp, opset_version=OPSET, input_names=input_names,
                      output_names=["output"], dynamic_axes=dynamic_axes,
                      do_constant_folding=True)
    os.replace(tmp, path)


def run_main(main):
    """Exits with main()'s status; any exception is exit code 2 with its message."""
    try:
        sys.exit(main())
    except Exception as exc:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(2)
