"""What torch_trainer trains (torch): model.py's TinyTransformer on its Markov batches
(--model=tiny, the default), or gpt.py's GPT (--model=gpt with --layers/--d-model/... or a
preset such as --model=gpt-xl) on gpt.synthetic_batch(). train.py and zero_train.py see only a Workload."""

from __future__ import annotations

import torch


def choose_device(requested: str, backend: str):
    """(torch.device, None) where the model computes for --device=`requested` (auto, cpu,
    cuda) and strata's runtime `backend`, or (None, the usage error). On CUDA the GPU is the
    runtime's (STRATA_DEVICE, else LOCAL_RANK, else 0: strata.Runtime().config["device"]),
    passed in as `backend` == "cuda:<ordinal>"."""
    kind, _, ordinal = backend.partition(":")
    if requested == "auto" and kind == "cuda" and not torch.cuda.is_available():
        return None, ("--device=auto: strata's runtime is on the cuda backend but torch has no "
                      "CUDA device; set STRATA_BACKEND=host to train on the CPU")
    if requested == "auto":
        requested = "cuda" if kind == "cuda" else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        return None, "--device=cuda: torch has no CUDA device"
    if requested == "cuda" and kind != "cuda":
        return None, (f"--device=cuda: strata's runtime is on the {kind} backend (its 'gpu' tier "
                      "is host memory); set STRATA_BACKEND=cuda")
    if requested == "cpu" and kind == "cuda":
        return None, ("--device=cpu: strata's runtime is on the cuda backend; set "
                      "STRATA_BACKEND=host to train on the CPU")
    if requested == "cuda":
        return torch.device("cuda", int(ordinal or 0)), None
    return torch.device("cpu"), None


class Workload:
    """build(): the model (the same values on every call, rank and process); batch(step):
    step's global batch (inputs, targets), 1-based steps; loss(model, x, y); block: the
    transformer block class (a ZeRO unit with --units=block); hyper, max_grad_norm: AdamW's."""

    def __init__(self, name, build, batch, loss, block, hyper, max_grad_norm, describe,
                 parameters, build_meta=None, param_init=None):
        self.name = name
        self.build = build
        self.batch = batch
        self.loss = loss
        self.block = block
        self.hyper = hyper
        self.max_grad_norm = max_grad_norm
        self.describe = describe  # a line: the sizes
        self.parameters = parameters  # the count, known before building
        # GPT: the model on the meta device and each parameter's initial values by name, for
        # zero_shard(param_init=...): no fp32 copy of the model before the engine's.
        self.build_meta = build_meta
        self.param_init = param_init


def gpt_config(args):
    """The GPTConfig of --model (gpt: gpt-tiny's sizes; a preset: its) with the size flags
    given over it."""
    import gpt
    base = gpt.preset("gpt-tiny" if args.model == "gpt" else args.model)
    sizes = {k: getattr(args, k) for k in ("vocab", "seq_len", "d_model", "heads", "layers")
             if getattr(args, k) is not None}
    if args.untied:
        sizes["tied"] = False
    return gpt.GPTConfig(**{**base.__dict__, "d_mlp": 0, **sizes}) if sizes else base


def make(args, steps: int, batch: int) -> Workload:
    if args.model == "tiny":
        import model as m
        data = m.markov_batches(steps, batch=batch)

        def build():
            torch.manual_seed(1234)
            return m.TinyTransformer()

        return Workload("tiny", build, lambda step: data[step - 1], m.lm_loss, m.Block, m.HYPER,
                        m.MAX_GRAD_NORM,
                        f"{m.LAYERS} blocks, d_model {m.D_MODEL}, {m.HEADS} heads, vocab "
                        f"{m.VOCAB}, seq {m.SEQ}", None)
    import gpt
    c = gpt_config(args)

    def build():  # on the meta device, then materialized block by block
        return gpt.materialize_in_pieces(gpt.GPT(c, device="meta"), "cpu")

    return Workload(args.model, build, lambda step: gpt.synthetic_batch(c, step, batch),
                    gpt.lm_loss, gpt.Block, dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8,
                                                 weight_decay=0.1), 1.0,
                    f"GPT {args.model}: {c.layers} blocks, d_model {c.d_model}, {c.heads} heads, "
                    f"vocab {c.vocab}, seq {c.seq_len}, {'tied' if c.tied else 'untied'} head",
                    gpt.parameter_count(c), build_meta=lambda: gpt.GPT(c, device="meta"),
                    param_init=lambda name, shape: gpt.init_parameter(name, shape, c))


class ExposedOptimizer:
    """--overlap-step's figures, per step: the optimizer time the step exposed after backward
    (the optimizer's last_step_ns: with overlap what step() adds once the last gradient is in,
    without it the whole step) and, with overlap, the elements whose Adam ran early and was
    kept, or the rollback (clipping bit: the early work was redone)."""

    def __init__(self, overlap: bool):
        self.overlap = overlap
        self.ns = []
        self.early_steps = 0
        self.rollbacks = 0

    def record(self, result: dict, stats: dict) -> str:
        """Adds a step (step()'s result, the optimizer's stats() after it); returns the text its
        table row ends with."""
        self.ns.append(stats["last_step_ns"])
        self.early_steps += result["early_elements"] > 0
        self.rollbacks += result["rolled_back"]
        text = f"  {stats['last_step_ns'] / 1e6:7.3f}"
        if self.overlap:
            text += "  rolled back" if result["rolled_back"] else \
                f"  {result['early_elements']} early"
        return text

    def summary(self) -> str:
        later = self.ns[1:] or self.ns  # the first step runs with cold caches
        mean = sum(later) / max(len(later), 1) / 1e6
        text = (f"optimizer time exposed after backward: {mean:.3f} ms a step (mean"
                f"{' after step 1' if len(self.ns) > 1 else ''})")
        if self.overlap:
            text += (f"; overlapped step: {self.early_steps} of {len(self.ns)} steps kept early "
                     f"work, {self.rollbacks} rolled back")
        return text
