"""torch_trainer's model and data (torch): a small transformer and next-token batches from a
fixed random Markov chain. train.py (and zero_train.py, activations_compare.py) import this once
their arguments are checked, so that a usage error needs no torch."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 64
D_MODEL = 64
HEADS = 4
D_MLP = 256
LAYERS = 2
SEQ = 32
BATCH = 8
HYPER = dict(lr=1e-2, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.01)
MAX_GRAD_NORM = 0.5


class SelfAttention(nn.Module):
    """Causal multi-head self-attention from four nn.Linear (q, k, v, o)."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.o = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads

        def split(y):  # (b, t, d) -> (b, h, t, d/h)
            return y.view(b, t, h, d // h).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // h)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, d_mlp: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_mlp), nn.GELU(), nn.Linear(d_mlp, d_model))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyTransformer(nn.Module):
    """Embeddings, `layers` blocks, a final LayerNorm and an LM head (this trainer's sizes by
    default; activations_compare.py builds larger ones)."""

    def __init__(self, vocab=VOCAB, seq=SEQ, d_model=D_MODEL, heads=HEADS, d_mlp=D_MLP,
                 layers=LAYERS):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, d_mlp) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def markov_batches(steps: int, seed: int = 7, batch: int = BATCH):
    """`steps` batches of (input, target) token sequences from a fixed random Markov chain whose
    every token has 3 successors (probabilities 0.7, 0.2, 0.1): entropy ~0.8 nats, against
    ln(64) ~4.16 for a uniform guess."""
    g = torch.Generator().manual_seed(seed)
    successors = torch.stack([torch.randperm(VOCAB, generator=g)[:3] for _ in range(VOCAB)])
    probs = torch.tensor([0.7, 0.2, 0.1])
    batches = []
    for _ in range(steps):
        seq = torch.empty(batch, SEQ + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(VOCAB, (batch,), generator=g)
        for t in range(SEQ):
            choice = torch.multinomial(probs, batch, replacement=True, generator=g)
            seq[:, t + 1] = successors[seq[:, t], choice]
        batches.append((seq[:, :-1], seq[:, 1:]))
    return batches


def lm_loss(model, tokens, targets):
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
