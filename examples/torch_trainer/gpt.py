"""torch_trainer's GPT (torch): a GPT-2-style causal language model of any size, built on the
meta device and initialized in pieces, and synthetic next-token batches.

    config = gpt.preset("gpt-xl")              # or gpt.GPTConfig(vocab=..., layers=..., ...)
    model = gpt.GPT(config, device="meta")      # instant: no memory behind the parameters
    gpt.materialize(model.blocks[0], "cpu", config)   # one block at a time, or
    gpt.materialize(model, "cpu", config)       # the whole model
    x, y = gpt.synthetic_batch(config, step, batch=8, rank=r, ranks=n)

The model: token and position embeddings, `layers` pre-LayerNorm blocks (causal multi-head
self-attention from a fused q/k/v nn.Linear and an output projection, then an MLP of 4 x d_model
with GELU, each with a residual), a final LayerNorm and an LM head without bias, tied to the
token embedding by default (GPT-2). Attention is plain matmuls and softmax (torch 1.13 has no
scaled_dot_product_attention; where torch has it, it is used when `fused_attention` is set).

Parameter count (exactly what parameter_count() and the module report):
    (vocab + seq_len) * d + layers * (4 d^2 + 2 d m + 9 d + m) + 2 d  [+ vocab * d if untied]
with d = d_model and m = d_mlp (4 d by default, giving 12 d^2 + 13 d per block): GPT-2 small
(vocab 50257, seq 1024, d 768, 12 layers, tied) has 124,439,808.

Initialization (GPT-2's): weights normal(0, 0.02), the residual projections' (attn.proj,
mlp.proj) scaled by 1/sqrt(2 layers), biases zero, LayerNorms one and zero. Each parameter draws
from its own generator, seeded from `seed` and the parameter's name, so any piece of the model
initialized in any order, on any rank, gets the same values as the whole model initialized at
once: ranks need no broadcast, and a model too large for host memory is initialized one block
at a time where it is going.
"""

from __future__ import annotations

import dataclasses
import math
import zlib

import torch
from torch import nn
from torch.nn import functional as F

INIT_STD = 0.02


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    vocab: int = 64
    seq_len: int = 64
    d_model: int = 64
    heads: int = 4
    layers: int = 2
    d_mlp: int = 0  # 0: 4 x d_model
    tied: bool = True  # the LM head is the token embedding
    seed: int = 1234  # of the initialization (per parameter, see init_parameter)

    def __post_init__(self):
        for field in ("vocab", "seq_len", "d_model", "heads", "layers"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GPTConfig.{field}={value!r}: a positive integer")
        if self.d_model % self.heads:
            raise ValueError(f"GPTConfig: d_model={self.d_model} is not a multiple of "
                             f"heads={self.heads}")
        if self.d_mlp == 0:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        elif not isinstance(self.d_mlp, int) or self.d_mlp < 1:
            raise ValueError(f"GPTConfig.d_mlp={self.d_mlp!r}: a positive integer (0: 4 x d_model)")


# Sizes of GPT-2 (small to xl) and of GPT-3's table (2.7b to 13b), and two beyond: vocab 50257,
# 1024 or 2048 positions. gpt-tiny is the CI size (a few hundred KiB).
PRESETS = {
    "gpt-tiny": GPTConfig(vocab=64, seq_len=64, d_model=64, heads=4, layers=2),
    "gpt-mini": GPTConfig(vocab=4096, seq_len=256, d_model=256, heads=8, layers=4),
    "gpt-small": GPTConfig(vocab=50257, seq_len=1024, d_model=768, heads=12, layers=12),
    "gpt-medium": GPTConfig(vocab=50257, seq_len=1024, d_model=1024, heads=16, layers=24),
    "gpt-large": GPTConfig(vocab=50257, seq_len=1024, d_model=1280, heads=20, layers=36),
    "gpt-xl": GPTConfig(vocab=50257, seq_len=1024, d_model=1600, heads=25, layers=48),
    "gpt-2.7b": GPTConfig(vocab=50257, seq_len=2048, d_model=2560, heads=32, layers=32),
    "gpt-6.7b": GPTConfig(vocab=50257, seq_len=2048, d_model=4096, heads=32, layers=32),
    "gpt-13b": GPTConfig(vocab=50257, seq_len=2048, d_model=5120, heads=40, layers=40),
    "gpt-20b": GPTConfig(vocab=50257, seq_len=2048, d_model=6144, heads=48, layers=44),
    "gpt-30b": GPTConfig(vocab=50257, seq_len=2048, d_model=7168, heads=56, layers=48),
}


def preset(name: str) -> GPTConfig:
    if name not in PRESETS:
        raise ValueError(f"no GPT preset {name!r}: use one of {', '.join(PRESETS)}")
    return PRESETS[name]


def parameter_count(c: GPTConfig) -> int:
    """The model's parameters (the formula in the module docstring)."""
    d, m = c.d_model, c.d_mlp
    block = 4 * d * d + 2 * d * m + 9 * d + m
    return (c.vocab + c.seq_len) * d + c.layers * block + 2 * d + (0 if c.tied else c.vocab * d)


class CausalSelfAttention(nn.Module):
    def __init__(self, c: GPTConfig, device=None):
        super().__init__()
        self.heads = c.heads
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model, device=device)
        self.proj = nn.Linear(c.d_model, c.d_model, device=device)
        self.fused = False  # set by GPT(fused_attention=True) where torch has it

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (y.view(b, t, h, d // h).transpose(1, 2) for y in (q, k, v))
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            y = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, c: GPTConfig, device=None):
        super().__init__()
        self.fc = nn.Linear(c.d_model, c.d_mlp, device=device)
        self.proj = nn.Linear(c.d_mlp, c.d_model, device=device)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """One pre-LayerNorm transformer block (a ZeRO unit with units=(gpt.Block,))."""

    def __init__(self, c: GPTConfig, device=None):
        super().__init__()
        self.ln1 = nn.LayerNorm(c.d_model, device=device)
        self.attn = CausalSelfAttention(c, device)
        self.ln2 = nn.LayerNorm(c.d_model, device=device)
        self.mlp = MLP(c, device)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """The model (module docstring). device="meta": parameters without memory, for
    materialize() piece by piece; any other device: materialized and initialized."""

    def __init__(self, c: GPTConfig, device="cpu", fused_attention: bool = False):
        super().__init__()
        self.config = c
        meta = torch.device("meta")
        self.tok = nn.Embedding(c.vocab, c.d_model, device=meta)
        self.pos = nn.Embedding(c.seq_len, c.d_model, device=meta)
        self.blocks = nn.ModuleList(Block(c, meta) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.d_model, device=meta)
        self.head = nn.Linear(c.d_model, c.vocab, bias=False, device=meta)
        if c.tied:
            self.head.weight = self.tok.weight
        if fused_attention and hasattr(F, "scaled_dot_product_attention"):
            for block in self.blocks:
                block.attn.fused = True
        if torch.device(device) != meta:
            materialize(self, device, c)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _seed_of(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 63)


def init_parameter(name: str, shape, c: GPTConfig) -> torch.Tensor:
    """The initial value of the parameter `name` (its name in GPT, e.g. "blocks.3.mlp.fc.weight")
    as a float32 CPU tensor: a function of the name, the shape and c.seed alone."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return torch.zeros(shape)
    if ".ln" in "." + name:  # LayerNorm weight
        return torch.ones(shape)
    std = INIT_STD
    if name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
        std /= math.sqrt(2 * c.layers)
    g = torch.Generator().manual_seed(_seed_of(c.seed, name))
    return torch.randn(shape, generator=g) * std


def materialize(module: nn.Module, device, c: GPTConfig, prefix: str | None = None) -> nn.Module:
    """Gives `module` (GPT or any submodule of it, on the meta device) memory on `device` and its
    initial values, parameter by parameter. `prefix`: the module's name in GPT ("blocks.3");
    found by identity when `module` is part of a GPT built from `c`, else ""."""
    if prefix is None:
        prefix = getattr(module, "_gpt_prefix", "")
    module.to_empty(device=device)
    if isinstance(module, GPT) and c.tied:  # to_empty gives each module its own Parameter
        module.head.weight = module.tok.weight
    with torch.no_grad():
        for name, p in module.named_parameters():
            full = f"{prefix}.{name}" if prefix else name
            if c.tied and full == "head.weight":
                full = "tok.weight"
            p.copy_(init_parameter(full, tuple(p.shape), c).to(p.dtype))
    return module


def name_pieces(model: GPT) -> list:
    """[(prefix, module)]: the pieces materialize() initializes one at a time (each block, then
    the rest), their prefixes recorded on them."""
    pieces = [(f"blocks.{i}", b) for i, b in enumerate(model.blocks)]
    pieces += [("tok", model.tok), ("pos", model.pos), ("ln_f", model.ln_f), ("head", model.head)]
    for prefix, m in pieces:
        m._gpt_prefix = prefix
    return pieces


def materialize_in_pieces(model: GPT, device, order=None) -> GPT:
    """materialize() each piece of name_pieces() in turn (`order`: indices into it)."""
    pieces = name_pieces(model)
    for i in order if order is not None else range(len(pieces)):
        prefix, m = pieces[i]
        if prefix == "head" and model.config.tied:
            continue  # the token embedding's, materialized with "tok"
        materialize(m, device, model.config, prefix)
    if model.config.tied:
        model.head.weight = model.tok.weight  # to_empty on "tok" made a new Parameter
    return model


def _successors(c: GPTConfig, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(c.vocab, generator=g)[:3] for _ in range(c.vocab)])


_CHAINS: dict = {}


def synthetic_batch(c: GPTConfig, step: int, batch: int, rank: int = 0, ranks: int = 1,
                    seed: int = 7, seq_len: int | None = None):
    """Step `step`'s global batch of `batch` sequences (inputs, targets), each of seq_len tokens
    (c.seq_len by default) from a fixed random Markov chain over the vocabulary (every token has
    3 successors, probabilities 0.7, 0.2, 0.1: ~0.8 nats, against ln(vocab) for a uniform
    guess), and this rank's slice of it (batch / ranks sequences, rank's in order). A function
    of (c.vocab, seed, step, batch) only: every rank and one process see the same global batch."""
    if batch % ranks:
        raise ValueError(f"batch={batch} does not divide among {ranks} ranks")
    t = c.seq_len if seq_len is None else seq_len
    key = (c.vocab, seed)
    if key not in _CHAINS:
        _CHAINS[key] = _successors(c, seed)
    successors = _CHAINS[key]
    g = torch.Generator().manual_seed(_seed_of(seed, f"step {step}"))
    seq = torch.empty(batch, t + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(c.vocab, (batch,), generator=g)
    choice = torch.multinomial(torch.tensor([0.7, 0.2, 0.1]), batch * t, replacement=True,
                               generator=g).view(batch, t)
    for i in range(t):
        seq[:, i + 1] = successors[seq[:, i], choice[:, i]]
    per = batch // ranks
    mine = seq[rank * per:(rank + 1) * per]
    return mine[:, :-1], mine[:, 1:]


def lm_loss(model, tokens, targets):
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
