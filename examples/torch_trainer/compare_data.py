"""compare_data: the comparison's batches, built once by compare.py and handed to every worker
(compare_worker.py --data=FILE), so that no worker rebuilds gpt.synthetic_batch's Markov chain
(one torch.randperm per token of the vocabulary: ~10 s at vocab 32768).

    import compare_data, gpt
    c = gpt.GPTConfig(vocab=..., seq_len=..., d_model=..., heads=..., layers=..., tied=False)
    compare_data.write_data("/tmp/batches.pt", c, steps=6, batch=8)   # the parent, once
    batches = compare_data.load_data("/tmp/batches.pt", c, steps=6, batch=8)   # each worker
    x, y = batches[0]                                                 # step 1's batch

The file (torch.save of a dict, written to FILE.tmp and renamed, so a reader never sees half of
it): "format" FORMAT; "x", "y": int64 tensors [steps, batch, seq_len], row s - 1 being exactly
gpt.synthetic_batch(c, s, batch, seed=seed) for step s (the same bits); "vocab", "seq_len",
"batch", "steps", "seed": what it was built for; "digest": digest(x, y). A worker refuses a
file built for another vocabulary, sequence length or batch, or with fewer steps than it runs.
"""

from __future__ import annotations

import hashlib
import os

FORMAT = "strata-compare-data/1"


def digest(x, y) -> str:
    """A short hash of the batches' bits (the workers report it: the same data, verifiably)."""
    h = hashlib.sha256()
    for t in (x, y):
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def build(c, steps: int, batch: int, seed: int = 7):
    """(x, y): int64 [steps, batch, seq_len] of gpt.synthetic_batch(c, s, batch, seed=seed)
    for s = 1 .. steps."""
    import torch
    import gpt
    pairs = [gpt.synthetic_batch(c, s, batch, seed=seed) for s in range(1, steps + 1)]
    return (torch.stack([x for x, _ in pairs]).contiguous(),
            torch.stack([y for _, y in pairs]).contiguous())


def write_data(path: str, c, steps: int, batch: int, seed: int = 7) -> dict:
    """Writes the batches of steps 1 .. steps to `path` (the module docstring); returns the
    dict's metadata (everything but the tensors)."""
    import torch
    if steps < 1 or batch < 1:
        raise ValueError(f"write_data: steps={steps} and batch={batch} must be at least 1")
    x, y = build(c, steps, batch, seed)
    meta = {"format": FORMAT, "vocab": c.vocab, "seq_len": c.seq_len, "batch": batch,
            "steps": steps, "seed": seed, "digest": digest(x, y)}
    tmp = f"{path}.tmp"
    torch.save({**meta, "x": x, "y": y}, tmp)
    os.replace(tmp, path)
    return meta


def load_data(path: str, c, steps: int, batch: int):
    """The batches of steps 1 .. steps from `path`: ([(x, y) per step], metadata). ValueError
    names what does not match (another size, too few steps, not such a file)."""
    import torch
    try:
        d = torch.load(path)
    except Exception as e:  # noqa: BLE001 - the file is the user's input: say which and why
        raise ValueError(f"--data={path}: cannot read it: {type(e).__name__}: {e}") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ValueError(f"--data={path}: not a file of compare_data.write_data (format "
                         f"{d.get('format') if isinstance(d, dict) else type(d).__name__!r}, "
                         f"want {FORMAT!r})")
    want = {"vocab": c.vocab, "seq_len": c.seq_len, "batch": batch}
    for key, value in want.items():
        if d.get(key) != value:
            raise ValueError(f"--data={path}: built for {key} {d.get(key)}, this run has "
                             f"{value}: write it with write_data for this size")
    if d.get("steps", 0) < steps:
        raise ValueError(f"--data={path}: holds {d.get('steps')} steps, this run takes {steps}")
    x, y = d["x"], d["y"]
    shape = (d["steps"], batch, c.seq_len)
    if tuple(x.shape) != shape or tuple(y.shape) != shape or x.dtype != torch.int64:
        raise ValueError(f"--data={path}: tensors of shape {tuple(x.shape)} {x.dtype}, want "
                         f"{shape} int64")
    meta = {k: d[k] for k in ("format", "vocab", "seq_len", "batch", "steps", "seed", "digest")}
    return [(x[s], y[s]) for s in range(steps)], meta
