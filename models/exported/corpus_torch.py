"""PyTorch models of the corpus, each exported with both torch.onnx exporters.

dynamo=False is the TorchScript-based exporter (dynamic_axes); dynamo=True is the
torch.export-based one (dynamic_shapes, onnxscript's op library). Every model is built from a
fixed seed and exported in eval mode with a symbolic batch dimension.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import torch
from corpus_common import HERE, SEED, export_recorded, failed_entry, save_model
from torch import nn

LEGACY_OPSET = 17
DYNAMO_OPSET = 18
B = "batch"


def _versions():
    import onnx
    import onnxruntime

    out = {"torch": torch.__version__, "onnx": onnx.__version__,
           "onnxruntime_used_for_expected": onnxruntime.__version__}
    try:
        import onnxscript

        out["onnxscript"] = onnxscript.__version__
    except ImportError:
        pass
    return out


# ---------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------


class LSTMCellStacked(nn.Module):
    """One LSTMCell step whose state travels as one tensor: state[0] = h, state[1] = c."""

    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(64, 128)

    def forward(self, x, state):
        h, c = self.cell(x, (state[0], state[1]))
        return torch.stack([h, c])


class GRUCellStep(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(64, 128)

    def forward(self, x, h):
        return self.cell(x, h)


class LSTMCellLoop(nn.Module):
    """An LSTMCell run over a fixed 8-step sequence by a Python loop (unrolled when exported)."""

    steps = 8

    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(64, 128)

    def forward(self, x, h, c):  # x: [B, 8, 64]
        hs = []
        for t in range(self.steps):
            h, c = self.cell(x[:, t], (h, c))
            hs.append(h)
        return torch.stack(hs, dim=1)  # [B, 8, 128]


class SeqRNN(nn.Module):
    """nn.LSTM / nn.GRU over [seq, batch, 64], optionally with initial states as inputs."""

    def __init__(self, kind: str, layers: int, bidirectional: bool, with_state: bool):
        super().__init__()
        cls = nn.LSTM if kind == "lstm" else nn.GRU
        self.kind = kind
        self.with_state = with_state
        self.rnn = cls(64, 128, num_layers=layers, bidirectional=bidirectional)

    def forward(self, x, h0=None, c0=None):
        if not self.with_state:
            y, hidden = self.rnn(x)
        elif self.kind == "lstm":
            y, hidden = self.rnn(x, (h0, c0))
        else:
            y, hidden = self.rnn(x, h0)
        if self.kind == "lstm":
            return y, hidden[0], hidden[1]
        return y, hidden


class BertEncoder(nn.Module):
    """transformers.BertModel with a random config; returns (last_hidden_state, pooler_output)."""

    def __init__(self, layers: int):
        super().__init__()
        from transformers import BertConfig, BertModel

        config = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=layers,
                            num_attention_heads=4, intermediate_size=128,
                            max_position_embeddings=128)
        config._attn_implementation = "eager"
        self.bert = BertModel(config)

    def forward(self, input_ids, attention_mask):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        return out.last_hidden_state, out.pooler_output


def _conv_bn(cin, cout, k, stride=1, groups=1, act=None):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class MobileBlock(nn.Module):
    """Inverted residual: 1x1 expand (HardSwish), 3x3 depthwise (HardSwish), 1x1 project, + x."""

    def __init__(self, c, expand):
        super().__init__()
        self.expand = _conv_bn(c, c * expand, 1, act=nn.Hardswish)
        self.dw = _conv_bn(c * expand, c * expand, 3, groups=c * expand, act=nn.Hardswish)
        self.project = _conv_bn(c * expand, c, 1)

    def forward(self, x):
        return x + self.project(self.dw(self.expand(x)))


class MobileNetTiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = _conv_bn(3, 16, 3, stride=2, act=nn.SiLU)             # 16x16
        self.block1 = MobileBlock(16, 4)
        self.down = nn.Sequential(                                         # 8x8
            _conv_bn(16, 16, 3, stride=2, groups=16, act=nn.SiLU),
            _conv_bn(16, 32, 1, act=nn.Hardswish))
        self.block2 = MobileBlock(32, 4)
        self.head = _conv_bn(32, 128, 1, act=nn.SiLU)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        x = self.head(self.block2(self.down(self.block1(self.stem(x)))))
        return self.fc(torch.flatten(self.pool(x), 1))


class DenoiserTiny(nn.Module):
    """DnCNN-style image denoiser, fully convolutional at full resolution: Conv(3 -> 16)-ReLU,
    three Conv(16 -> 16)-BN-ReLU, Conv(16 -> 3) predicting the noise, subtracted from the input.
    The batch norms carry running statistics as training leaves them (not the init's 0 and 1)."""

    def __init__(self):
        super().__init__()
        layers = [nn.Conv2d(3, 16, 3, 1, 1), nn.ReLU()]
        for _ in range(3):
            layers.append(_conv_bn(16, 16, 3, act=nn.ReLU))
        layers.append(nn.Conv2d(16, 3, 3, 1, 1))
        self.body = nn.Sequential(*layers)
        generator = torch.Generator().manual_seed(SEED)
        for module in self.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.copy_(0.1 * torch.randn(16, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(16, generator=generator))
                module.weight.data.copy_(1 + 0.1 * torch.randn(16, generator=generator))
                module.bias.data.copy_(0.1 * torch.randn(16, generator=generator))

    def forward(self, x):
        return x - self.body(x)


class ResidualBlock(nn.Module):
    """ResNet basic block: Conv-BN-ReLU, Conv-BN, + the input (a strided 1x1 Conv-BN where the
    shape changes), ReLU."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.a = _conv_bn(cin, cout, 3, stride, act=nn.ReLU)
        self.b = _conv_bn(cout, cout, 3)
        self.shortcut = nn.Identity() if cin == cout and stride == 1 else _conv_bn(cin, cout, 1, stride)

    def forward(self, x):
        return torch.relu(self.b(self.a(x)) + self.shortcut(x))


class ResNetCifarTiny(nn.Module):
    """A CIFAR-style ResNet: a 16-channel stride-1 stem and stage at 32 x 32, then strided 32- and
    64-channel stages, global average pool, Linear(64, 10). Running statistics as training leaves
    them, as in DenoiserTiny."""

    def __init__(self):
        super().__init__()
        self.stem = _conv_bn(3, 16, 3, act=nn.ReLU)
        self.stage1 = nn.Sequential(ResidualBlock(16, 16, 1), ResidualBlock(16, 16, 1))
        self.stage2 = ResidualBlock(16, 32, 2)
        self.stage3 = ResidualBlock(32, 64, 2)
        self.fc = nn.Linear(64, 10)
        generator = torch.Generator().manual_seed(SEED)
        for module in self.modules():
            if isinstance(module, nn.BatchNorm2d):
                n = module.num_features
                module.running_mean.copy_(0.1 * torch.randn(n, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(n, generator=generator))

    def forward(self, x):
        x = self.stage3(self.stage2(self.stage1(self.stem(x))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class MlpMnist(nn.Module):
    """An MNIST MLP: [B, 1, 28, 28] flattened, Linear(784, 320)-ReLU, Linear(320, 64)-ReLU,
    Linear(64, 10). Its first two layers sum over more than 256 inputs (784: three blocks of 256
    and 16 more; 320: one block and 64 more), which onnxruntime's GEMM sums in blocks."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(784, 320), nn.ReLU(), nn.Linear(320, 64), nn.ReLU(),
                                    nn.Linear(64, 10))

    def forward(self, x):
        return self.layers(x)


class TransformerLayer(nn.Module):
    """nn.TransformerEncoderLayer(64, 4 heads, 128, batch_first): attention by
    nn.MultiheadAttention, post-norm, ReLU FFN. PyTorch's fused fast path (one aten op the
    TorchScript exporter cannot write) is turned off, as it is for any export of the layer."""

    def __init__(self):
        super().__init__()
        torch.backends.mha.set_fastpath_enabled(False)
        self.layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)

    def forward(self, x):
        return self.layer(x)


class PreNormBlock(nn.Module):
    """A pre-norm decoder-style block of the layers a current model mixes: LayerNorm then
    nn.MultiheadAttention (batch_first), RMSNorm then a hand-written attention through
    F.scaled_dot_product_attention (4 heads of 8), LayerNorm then a GELU (erf) FFN; each with a
    residual Add. Exported with the dynamo exporter's defaults too (opset 20: the Gelu op;
    weights in a .onnx.data file)."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        torch.backends.mha.set_fastpath_enabled(False)
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.mha = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm3 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x):  # x: [B, S, dim]
        h = self.norm1(x)
        x = x + self.mha(h, h, h, need_weights=False)[0]
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm2(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        o = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(o.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm3(x))))


class VitBlock(nn.Module):
    """torchvision's ViT encoder block at a small size: LayerNorm, nn.MultiheadAttention
    (batch_first) over a fixed number of patches, residual; LayerNorm, Linear-GELU-Linear,
    residual. The sequence is static (the patches of a fixed image size) and the batch symbolic,
    as a ViT is exported for serving: the attention's out-projection then reads `[17*batch, 32]`."""

    def __init__(self, dim: int = 32, heads: int = 4, hidden: int = 64):
        super().__init__()
        torch.backends.mha.set_fastpath_enabled(False)
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x):  # x: [B, 17, dim]
        h = self.ln_1(x)
        x = x + self.self_attention(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class BranchyCell(nn.Module):
    """Data-dependent branch: if the input's mean is positive an LSTMCell step, else a 2-layer
    MLP gating c. Both branches return new (h, c) of shape [B, 128] (torch.cond forbids a
    branch returning an input unchanged)."""

    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(64, 128)
        self.fc1 = nn.Linear(64 + 128, 128)
        self.fc2 = nn.Linear(128, 128)

    def lstm_branch(self, x, h, c):
        h2, c2 = self.cell(x, (h, c))
        return h2, c2

    def mlp_branch(self, x, h, c):
        z = torch.tanh(self.fc1(torch.cat([x, h], dim=1)))
        c2 = torch.sigmoid(self.fc2(z)) * c
        return torch.tanh(c2), c2

    def forward(self, x, h, c):
        if bool(x.mean() > 0):
            h2, c2 = self.lstm_branch(x, h, c)
        else:
            h2, c2 = self.mlp_branch(x, h, c)
        return h2, c2


class BranchyCellCond(BranchyCell):
    """The same module for torch.export: the branch through torch.cond."""

    def forward(self, x, h, c):
        return torch.cond(x.mean() > 0, self.lstm_branch, self.mlp_branch, (x, h, c))


# ---------------------------------------------------------------------------------------
# Specs: name stem, module factory, example inputs, input/output names, dynamic dims
# ---------------------------------------------------------------------------------------


def _randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _specs():
    rng = np.random.default_rng(SEED)
    specs = []
    nb = 4  # batch of the recorded inputs

    specs.append(dict(
        stem="lstm_cell_stacked", make=LSTMCellStacked,
        computes="one nn.LSTMCell(64, 128) step; state [2, B, 128] stacks h and c; returns "
                 "torch.stack([h', c'])",
        feeds={"x": _randn(rng, nb, 64), "state": _randn(rng, 2, nb, 128)},
        outputs=["state_out"], batch_axes={"x": 0, "state": 1}))
    specs.append(dict(
        stem="gru_cell", make=GRUCellStep,
        computes="one nn.GRUCell(64, 128) step; h [B, 128] -> h'",
        feeds={"x": _randn(rng, nb, 64), "h": _randn(rng, nb, 128)},
        outputs=["h_out"], batch_axes={"x": 0, "h": 0}))
    specs.append(dict(
        stem="lstm_cell_loop8", make=LSTMCellLoop,
        computes="nn.LSTMCell(64, 128) over x [B, 8, 64] by an 8-step Python loop (unrolled); "
                 "returns all hidden states [B, 8, 128]",
        feeds={"x": _randn(rng, nb, 8, 64), "h": _randn(rng, nb, 128), "c": _randn(rng, nb, 128)},
        outputs=["hs"], batch_axes={"x": 0, "h": 0, "c": 0}))
    seq = 32
    for kind, layers, bidir in (("lstm", 2, True), ("gru", 1, False), ("gru", 2, True)):
        dirs = 2 if bidir else 1
        for with_state in (False, True):
            stem = f"{kind}_{layers}l{'_bi' if bidir else ''}{'_state' if with_state else ''}"
            feeds = {"x": _randn(rng, seq, nb, 64)}
            axes = {"x": (0, 1)}
            if with_state:
                feeds["h0"] = _randn(rng, layers * dirs, nb, 128)
                axes["h0"] = 1
                if kind == "lstm":
                    feeds["c0"] = _randn(rng, layers * dirs, nb, 128)
                    axes["c0"] = 1
            outs = ["y", "h_n", "c_n"] if kind == "lstm" else ["y", "h_n"]
            specs.append(dict(
                stem=stem,
                make=(lambda k=kind, n=layers, b=bidir, s=with_state: SeqRNN(k, n, b, s)),
                computes=f"nn.{kind.upper()}(64, 128, num_layers={layers}, bidirectional={bidir}) "
                         f"over x [S, B, 64] (S=32 in the inputs), "
                         + ("initial states as inputs" if with_state else "zero initial states"),
                feeds=feeds, outputs=outs, batch_axes=axes,
                dynamo_static_seq=(
                    "sequence length fixed at 32 for dynamo=True: with Dim('seq') the exporter "
                    "(torch 2.13, onnxscript 0.7.2) declared x as [seq, batch, 64] but baked 32 "
                    "into the Reshape after each LSTM/GRU (Reshape to [32, -1, H]) and into the "
                    "output shapes, so onnxruntime failed at any other length; dynamo=False "
                    "keeps seq symbolic")))
    for layers in (2, 12, 24):
        ids_rng = np.random.default_rng(SEED + layers)
        bs, sl = 2, 16
        ids = ids_rng.integers(1, 1000, size=(bs, sl)).astype(np.int64)
        ids[:, 0] = 101 % 1000  # a [CLS]-like first token
        mask = np.ones((bs, sl), dtype=np.int64)
        mask[1, 11:] = 0  # second sequence is padded
        ids[1, 11:] = 0
        specs.append(dict(
            stem=f"bert_tiny_{layers}l", make=(lambda n=layers: BertEncoder(n)),
            computes=f"transformers BertModel, random weights, vocab 1000, hidden 64, {layers} "
                     "layers, 4 heads, intermediate 128, eager attention; returns "
                     "last_hidden_state [B, S, 64] and pooler_output [B, 64]",
            feeds={"input_ids": ids, "attention_mask": mask},
            outputs=["last_hidden_state", "pooler_output"],
            batch_axes={"input_ids": (0, 1), "attention_mask": (0, 1)},
            rtol=1e-3, atol=1e-4))
    specs.append(_image_model(
        rng, "mobilenet_tiny", MobileNetTiny, "logits",
        "MobileNet-style CNN on [B, 3, 32, 32]: Conv-BN-SiLU stem, two inverted residual blocks (1x1 "
        "Conv-BN-HardSwish, depthwise 3x3 Conv-BN-HardSwish, 1x1 Conv-BN, residual Add), a depthwise "
        "stride-2 Conv-BN-SiLU, 1x1 Conv-BN-SiLU head, global average pool, flatten, Linear(128, 10)"))
    # Last, so the feeds drawn for the models above stay what they were.
    specs.append(_image_model(
        rng, "denoiser_tiny", DenoiserTiny, "denoised",
        "DnCNN-style denoiser on [B, 3, 32, 32]: Conv(3->16)-ReLU, three Conv(16->16)-BN-ReLU, "
        "Conv(16->3), subtracted from the input; every Conv 3x3, stride 1, padding 1"))
    specs.append(_image_model(
        rng, "resnet_cifar_tiny", ResNetCifarTiny, "logits",
        "CIFAR-style ResNet on [B, 3, 32, 32]: Conv-BN-ReLU stem (3->16), two 16-channel basic "
        "blocks, strided basic blocks to 32 and 64 channels (1x1 strided shortcut), global average "
        "pool, Linear(64, 10)"))
    specs.append(_image_model(
        rng, "mlp_mnist", MlpMnist, "logits",
        "MNIST MLP on [B, 1, 28, 28]: flatten, Linear(784, 320)-ReLU, Linear(320, 64)-ReLU, "
        "Linear(64, 10)", image=(1, 28, 28)))
    specs.append(dict(
        stem="transformer_layer", make=TransformerLayer,
        computes="nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0, "
                 "batch_first=True) on x [B, S, 64]: multi-head self-attention (nn.MultiheadAttention), "
                 "residual + LayerNorm, Linear-ReLU-Linear, residual + LayerNorm",
        feeds={"x": _randn(rng, nb, 16, 64)}, outputs=["y"], batch_axes={"x": (1, 0)}))  # [B, S]: seq is axis 1
    specs.append(dict(
        stem="prenorm_block", make=PreNormBlock,
        computes="pre-norm block on x [B, S, 32]: LayerNorm + nn.MultiheadAttention(32, 4, "
                 "batch_first=True), RMSNorm + Linear(32, 96) split into 4 heads of 8 + "
                 "F.scaled_dot_product_attention + Linear(32, 32), LayerNorm + Linear(32, 64)-GELU-"
                 "Linear(64, 32), each with a residual Add",
        feeds={"x": _randn(rng, nb, 10, 32)}, outputs=["y"], batch_axes={"x": (1, 0)},
        dynamo_defaults=True))
    specs.append(dict(
        stem="vit_block", make=VitBlock,
        computes="torchvision-style ViT encoder block on x [B, 17, 32] (16 patches and a class token; "
                 "the sequence static, the batch symbolic): LayerNorm + nn.MultiheadAttention(32, 4, "
                 "batch_first=True) + residual, LayerNorm + Linear(32, 64)-GELU-Linear(64, 32) + residual",
        feeds={"x": _randn(rng, nb, 17, 32)}, outputs=["y"], batch_axes={"x": 0}))
    return specs


def _image_model(rng, stem, make, output, computes, image=(3, 32, 32)):
    """A CNN's spec: one batch of eight images as its recorded input, the batch symbolic."""
    return dict(stem=stem, make=make, computes=computes, feeds={"x": _randn(rng, 8, *image)},
                outputs=[output], batch_axes={"x": 0})




def _named_axes(spec):
    """input -> {axis: symbolic name}: batch first, sequence second where there are two axes."""
    out = {}
    for name, a in spec["batch_axes"].items():
        if isinstance(a, int):
            out[name] = {a: B}
        elif name == "x":  # the RNNs' [S, B, 64]
            out[name] = {a[0]: "seq", a[1]: B}
        else:  # BERT's [B, S]
            out[name] = {a[0]: B, a[1]: "seq"}
    return out


def _export_legacy(module, spec, path, scripted=False):
    names = list(spec["feeds"])
    args = tuple(torch.from_numpy(spec["feeds"][n]) for n in names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, path, dynamo=False, opset_version=LEGACY_OPSET,
                          input_names=names, output_names=spec["outputs"],
                          dynamic_axes=_named_axes(spec), do_constant_folding=True)
    return {"dynamo": False, "opset_version": LEGACY_OPSET, "do_constant_folding": True,
            "dynamic_axes": {k: {str(a): n for a, n in v.items()}
                             for k, v in _named_axes(spec).items()},
            "torch_jit_script": scripted}


def _export_dynamo(module, spec, path):
    from torch.export import Dim

    names = list(spec["feeds"])
    args = tuple(torch.from_numpy(spec["feeds"][n]) for n in names)
    dims = {B: Dim("batch", min=1, max=4096), "seq": Dim("seq", min=2, max=128)}
    named = _named_axes(spec)
    if spec.get("dynamo_static_seq"):
        named = {n: {a: s for a, s in ax.items() if s != "seq"} for n, ax in named.items()}
    dyn = {n: {a: dims[s] for a, s in ax.items()} for n, ax in named.items()}
    dyn_tuple = tuple(dyn.get(n) for n in names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(module, args, dynamo=True, opset_version=DYNAMO_OPSET,
                                 input_names=names, output_names=spec["outputs"],
                                 dynamic_shapes=dyn_tuple, optimize=True, verbose=False)
        prog.save(path, external_data=False)
    _relative_paths(path)
    out = {"dynamo": True, "opset_version": DYNAMO_OPSET, "optimize": True,
           "dynamic_shapes": {k: {str(a): s for a, s in v.items()} for k, v in named.items()}}
    if spec.get("dynamo_static_seq"):
        out["note"] = spec["dynamo_static_seq"]
    return out


def _export_dynamo_defaults(module, spec, path):
    """torch.onnx.export(module, args, path, dynamo=True) as a user calls it: the exporter's own
    opset (20 in torch 2.13) and its default external_data=True, which writes the weights to
    `<name>.onnx.data` beside the model however small they are."""
    from torch.export import Dim

    names = list(spec["feeds"])
    args = tuple(torch.from_numpy(spec["feeds"][n]) for n in names)
    dims = {B: Dim("batch", min=1, max=4096), "seq": Dim("seq", min=2, max=128)}
    named = _named_axes(spec)
    dyn = tuple({a: dims[s] for a, s in named[n].items()} if n in named else None for n in names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, path, dynamo=True, input_names=names,
                          output_names=spec["outputs"], dynamic_shapes=dyn)
    _relative_paths(path)
    import onnx

    return {"dynamo": True, "opset_version": onnx.load(path, load_external_data=False).opset_import[0].version,
            "defaults": "opset_version, optimize and external_data left at the exporter's defaults",
            "external_data": os.path.basename(path) + ".data",
            "dynamic_shapes": {k: {str(a): s for a, s in v.items()} for k, v in named.items()}}


REPO_ROOT = os.path.dirname(os.path.dirname(HERE))


def _relative_paths(path):
    """The dynamo exporter records each node's Python stack trace (metadata_props
    pkg.torch.onnx.stack_trace) with absolute file paths. Keep the traces, but make the paths
    relative to the repository or to site-packages, so the file does not depend on where the
    repository and the virtualenv live."""
    import re

    import onnx

    model = onnx.load(path, load_external_data=False)  # external weights stay where they are
    pattern = re.compile(r'File "([^"]*)"')

    def fix(match):
        f = match.group(1)
        if f.startswith(REPO_ROOT + os.sep):
            f = os.path.relpath(f, REPO_ROOT)
        elif "site-packages" + os.sep in f:
            f = "<site-packages>/" + f.split("site-packages" + os.sep, 1)[1]
        return f'File "{f}"'

    def walk(graph):
        for node in graph.node:
            for prop in node.metadata_props:
                prop.value = pattern.sub(fix, prop.value)
            for attr in node.attribute:
                if attr.HasField("g"):
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(model.graph)
    for fn in model.functions:
        for node in fn.node:
            for prop in node.metadata_props:
                prop.value = pattern.sub(fix, prop.value)
    onnx.save(model, path)


def _reference(module, spec):
    with torch.no_grad():
        out = module(*(torch.from_numpy(v) for v in spec["feeds"].values()))
    out = out if isinstance(out, (tuple, list)) else (out,)
    return [o.numpy() for o in out]


def _one(spec, exporter, entries, only=None):
    name = f"{spec['stem']}_{exporter}"
    if only and name not in only:
        return
    path = os.path.join(HERE, f"{name}.onnx")
    torch.manual_seed(SEED)
    module = spec["make"]().eval()
    entry = {"exporter": f"torch.onnx.export(dynamo={exporter != 'ts'})",
             "versions": _versions(), "computes": spec["computes"],
             "source": "models/exported/corpus_torch.py"}
    for stale in (path, path + ".data"):
        if os.path.exists(stale):
            os.remove(stale)

    def export() -> dict:
        ref = _reference(module, spec)
        write = {"ts": _export_legacy, "dynamo": _export_dynamo,
                 "dynamo_defaults": _export_dynamo_defaults}[exporter]
        entry["options"] = write(module, spec, path)
        return save_model(name, path, spec["feeds"], entry, reference=ref,
                          rtol=spec.get("rtol", 1e-4), atol=spec.get("atol", 1e-4))

    export_recorded(entries, name, path, entry, export)


def _branchy(entries, only=None):
    rng = np.random.default_rng(SEED + 100)
    feeds = {"x": np.abs(_randn(rng, 4, 64)), "h": _randn(rng, 4, 128), "c": _randn(rng, 4, 128)}
    spec = dict(stem="branchy_cell", feeds=feeds, outputs=["h_out", "c_out"],
                batch_axes={"x": 0, "h": 0, "c": 0},
                computes="if mean(x) > 0: one LSTMCell(64, 128) step, else c' = sigmoid(Linear(tanh("
                         "Linear(cat(x, h))))) * c, h' = tanh(c'); returns (h', c'). The recorded inputs "
                         "take the LSTM branch.")
    # TorchScript exporter: torch.jit.script keeps the Python `if` as an ONNX If.
    name = "branchy_cell_ts"
    if not only or name in only:
        path = os.path.join(HERE, f"{name}.onnx")
        torch.manual_seed(SEED)
        module = BranchyCell().eval()
        entry = {"exporter": "torch.onnx.export(dynamo=False) of torch.jit.script(module)",
                 "versions": _versions(), "computes": spec["computes"],
                 "source": "models/exported/corpus_torch.py"}
        try:
            ref = _reference(module, spec)
            scripted = torch.jit.script(module)
            entry["options"] = _export_legacy(scripted, spec, path, scripted=True)
            entries[name] = save_model(name, path, feeds, entry, reference=ref)
        except Exception as exc:
            entries[name] = failed_entry(entry, exc)
        print(f"{name}: {entries[name]['status']} "
              f"{entries[name].get('node_count', entries[name].get('error', ''))}", flush=True)
    # torch.export exporter: torch.cond becomes an If.
    name = "branchy_cell_dynamo"
    if not only or name in only:
        path = os.path.join(HERE, f"{name}.onnx")
        torch.manual_seed(SEED)
        module = BranchyCellCond().eval()
        entry = {"exporter": "torch.onnx.export(dynamo=True) of a module using torch.cond",
                 "versions": _versions(), "computes": spec["computes"],
                 "source": "models/exported/corpus_torch.py"}
        try:
            ref = _reference(module, spec)
            entry["options"] = _export_dynamo(module, spec, path)
            entries[name] = save_model(name, path, feeds, entry, reference=ref)
        except Exception as exc:
            if os.path.exists(path):
                os.remove(path)
            entries[name] = failed_entry(entry, exc)
        print(f"{name}: {entries[name]['status']} "
              f"{entries[name].get('node_count', entries[name].get('error', ''))}", flush=True)


def build(only=None) -> dict:
    torch.set_num_threads(1)
    entries: dict = {}
    for spec in _specs():
        for exporter in ("ts", "dynamo") + (("dynamo_defaults",) if spec.get("dynamo_defaults") else ()):
            _one(spec, exporter, entries, only)
    _branchy(entries, only)
    return entries
