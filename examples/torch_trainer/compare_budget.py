"""compare_budget: the bytes each system of compare.py needs in each place (GPU, host RAM, pinned
host memory, NVMe) for a GPT of given sizes, what a machine offers, the STRATA_* sizes a strata
worker runs with, and why a run cannot start. No torch at module level: the parent calls it
before any worker starts.

    res = Resources.measure("cuda", nvme_path="/mnt/nvme")      # or Resources.parse("gpu=80GiB,...")
    n = need("strata-cpu", model, "cuda", settings)             # Need(gpu, host, pinned, nvme)
    why = check("strata-cpu", model, "cuda", res, settings)     # None, or the message
    env = strata_env("strata-cpu", model, "cuda", res, settings)  # {"STRATA_CPU_BYTES": ...}

`model`: anything with vocab, seq_len, d_model, heads and layers (compare.py's args, a
gpt.GPTConfig, Model); the head is untied (compare.py's GPT). `settings`: a dict, an argparse
namespace or Settings (batch, strata's arena and fetch sizes; Settings' docstring). Model,
Settings and Resources live in compare_sizes.py and are re-exported here.

Places. "pinned" is host memory that is page-locked (strata's CPU tier, FSDP2's offloaded
parameters and gradients); "host" is all the host memory a worker touches, pinned included, so a
need fits when pinned <= Resources.pinned and host <= Resources.host. "gpu" is the device
memory a worker takes (strata's arena, torch's tensors, the CUDA context); on the CPU device the
GPU figure is 0 and strata's "GPU tier" (the host backend's arena) is host memory.

Every figure is a sum of named items (Need.items: place, what and why, bytes), each built from
the constants below, each with its reason; docs/bench.md has the table. strata's figures follow
its code exactly (the ZeRO layout of parameters into groups, each tier's granularity, the
optimizer's chunks); what torch and FSDP2 keep is derived from their code and is an estimate
(activations above all), which compare_search.py's probes confirm.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from compare_sizes import (  # noqa: F401  (re-exported: compare_budget's API)
    ALIGNMENT, BUCKET_BYTES, GRADIENT_BUCKETS, PERSIST_BELOW_BYTES, PLACES, GiB, KiB, MiB, Model,
    Resources, Settings, fmt, gpu_free_bytes, mem_available, parse_size)

SYSTEMS = ("strata-cpu", "strata-nvme", "fsdp2", "fsdp2-nooffload", "torch")

# --- strata: from its code (docs/zero.md, docs/optimizer.md, docs/nvme.md, docs/store.md) ---
# OffloadOptimizer::add_param: a rank's slice has an fp32 master and the two fp32 Adam moments
# (.master, .exp_avg, .exp_avg_sq), each a CPU-tier tensor when state_home is the CPU tier.
ADAM_STATE_BYTES = 12
# With state_home NVMe the same 12 bytes lie in each of a chunk's two swap slots (a step writes
# the slot not holding the committed state and flips them when every write is done:
# OffloadOptimizerStats::nvme_state_bytes). The issue-35 fault: 20 bytes were budgeted.
NVME_STATE_BYTES = 2 * ADAM_STATE_BYTES
# Each of a chunk's three arrays is as long as its elements rounded up to 1024 (4 KiB of fp32,
# O_DIRECT's alignment): optimizer_impl.h kNvmeChunkGranule.
NVME_STATE_GRANULE = 1024
# A state chunk travels through one staging chunk as master, moments and the parameter copy:
# 12 + 2 bytes an element (offload_optimizer.cc kNvmeBytesPerElement).
NVME_CHUNK_BYTES_PER_ELEMENT = 14
# Without an NVMe tier (strata-cpu) the optimizer carves its own pinned pool from the CPU tier:
# 4 chunks of min(16 MiB, tier / 16) (offload_optimizer.cc kOwnPoolChunks, kOwnPoolChunkBytes).
OWN_POOL_CHUNKS, OWN_POOL_CHUNK_BYTES = 4, 16 * MiB
# Allocation granularity of each tier: every tensor's bytes round up to it (the pinned tier and
# NVMe extents: O_DIRECT's 4096; the GPU arena: 256; docs/allocator.md, docs/nvme.md).
CPU_TIER_GRANULE, GPU_TIER_GRANULE, NVME_GRANULE = 4096, 256, 4096
# The arena keeps a bounce region of min(64 MiB, a 64th) of STRATA_GPU_BYTES at its top for
# itself (store/tier.cc kMaxBounce): the rest is what tensors get.
ARENA_BOUNCE_MAX, ARENA_BOUNCE_FRACTION = 64 * MiB, 64
# ZeroEngine's bound_live_limit(): gathered groups may take three quarters of what the engine's
# own GPU-tier tensors (the gradient buckets) leave of the arena.
LIVE_FRACTION = 0.75
# strata-nvme's CPU tier beyond what is homed there: room for the shards' copies the optimizer
# writes through it (on CUDA its host tier is the CPU tier) and the gathers read, evicted to their
# NVMe home as the tier fills: four of the largest group's shard, at least 64 MiB. Sized so, the
# shards are read from NVMe every step (ZeRO-Infinity's placement), not cached whole in RAM.
NVME_CPU_CACHE_GROUPS, NVME_CPU_CACHE_MIN = 4, 64 * MiB

# --- torch, CUDA, the process: estimates (docs/bench.md, "The prediction model") ---
# The CUDA context, the kernels loaded, cuBLAS/cuDNN workspaces: torch on an H100 holds
# 0.5-0.8 GiB before its first tensor; a round GiB.
CUDA_CONTEXT_BYTES = 1 * GiB
# A communicator's buffers (NCCL: NCCL_BUFFSIZE 4 MiB per channel and peer, its own kernels);
# FSDP2's process group and strata's Communicator on CUDA.
NCCL_BYTES = 512 * MiB
# torch's caching allocator rounds and fragments: its tensors' sum times this.
TORCH_ALLOCATOR_SLACK = 1.10
# A worker's own host memory outside any tier: Python, torch and the CUDA libraries mapped in
# (RSS of a CUDA torch process ~2 GiB, a CPU one ~0.4 GiB), with room.
HOST_PROCESS_BYTES = {"cuda": 3 * GiB, "cpu": 1 * GiB}


def _round_up(n: int, granule: int) -> int:
    return -(-n // granule) * granule


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# --- strata's layout: the ZeRO groups (offload/zero_layout.cc, one rank) ---

@dataclasses.dataclass(frozen=True)
class Group:
    padded: int  # elements, a multiple of ranks x alignment (one rank: the whole group)
    persistent: bool  # stays whole on every rank (each parameter below persist_below_bytes)


@functools.lru_cache(maxsize=256)
def zero_groups(model: Model, param_bytes: int, grad_bytes: int, settings: Settings) -> tuple:
    """ZeroLayout::plan at one rank: parameters in module order packed into groups of at most
    bucket_bytes of gradients (a larger parameter gets a group of its own), one open group per
    kind (partitioned, persistent), each padded to a multiple of the alignment."""
    quantum = settings.alignment
    max_group = max(1, settings.bucket_bytes // grad_bytes) // quantum * quantum
    below = settings.persist_below_bytes
    sizes, kinds = [], []
    open_ = [-1, -1]  # the open group of each kind (partitioned, persistent)
    for _name, count in model.shapes():
        kind = 1 if count * param_bytes < below else 0
        current = open_[kind]
        if current < 0 or sizes[current] + count > max_group:
            sizes.append(0)
            kinds.append(kind)
            current = open_[kind] = len(sizes) - 1
        sizes[current] += count
    return tuple(Group(_round_up(n, quantum), k == 1) for n, k in zip(sizes, kinds))


def staging_chunk_bytes(settings: Settings) -> int:
    """runtime.cc staging_chunk(): whole I/O blocks, an eighth of the pool, at most 64 MiB."""
    unit = settings.io_block
    target = min(settings.staging_bytes // 8, 64 * MiB)
    return max(unit, target // unit * unit)


def nvme_chunk_elements(settings: Settings) -> int:
    """OffloadOptimizer::create's state chunk with states on NVMe: a staging chunk's elements at
    14 bytes each, a multiple of 1024."""
    lease = staging_chunk_bytes(settings)
    return lease // NVME_CHUNK_BYTES_PER_ELEMENT // NVME_STATE_GRANULE * NVME_STATE_GRANULE


def nvme_state_bytes(elements: int, chunk: int) -> int:
    """The swap the optimizer's NVMe states take: chunks of `chunk` elements, each array of a
    chunk rounded up to 1024 elements, 24 bytes an element (two slots)."""
    full, tail = divmod(elements, chunk)
    return NVME_STATE_BYTES * (full * chunk + _round_up(tail, NVME_STATE_GRANULE))


def own_pool_bytes(tier: int) -> int:
    """The optimizer's own pinned pool in a CPU tier of `tier` bytes (no NVMe tier)."""
    chunk = min(OWN_POOL_CHUNK_BYTES, tier // 16 // 4096 * 4096)
    return OWN_POOL_CHUNKS * chunk


# CPU tiers are sized in multiples of this: 16 x 4096, so that below 256 MiB the optimizer's
# own pool is exactly a quarter and what it leaves grows with the tier.
CPU_TIER_STEP = 16 * 4096


def cpu_tier_for(homed: int) -> int:
    """The smallest CPU tier (a multiple of CPU_TIER_STEP) holding `homed` bytes beside the
    optimizer's own pool, which takes a quarter of a tier below 256 MiB and 64 MiB above."""
    if homed + OWN_POOL_CHUNKS * OWN_POOL_CHUNK_BYTES >= 16 * OWN_POOL_CHUNK_BYTES:
        return _round_up(homed + OWN_POOL_CHUNKS * OWN_POOL_CHUNK_BYTES, CPU_TIER_STEP)
    return _round_up(-(-homed * 4 // 3), CPU_TIER_STEP)


def _dtype_bytes(device: str):
    """strata's and FSDP2's parameter and gradient bytes: bf16 on a GPU, fp32 on the CPU."""
    return (2, 2) if device == "cuda" else (4, 4)


def arena_minimum(model, device: str, settings=None) -> int:
    """The smallest arena (STRATA_GPU_BYTES) a strata worker starts and trains in: the gradient
    buckets (each the largest group's gradients: stage 3 homes them in the arena), and room for
    the largest partitioned group gathered (bound_live_limit: within three quarters of what the
    buckets leave) together with its shard's copy that the gather reads (one rank: as large)
    and the largest persistent group's copy that the same block uses."""
    m, s = Model.of(model), Settings.of(settings, device)
    p, g = _dtype_bytes(device)
    groups = zero_groups(m, p, g, s)
    largest = max(x.padded for x in groups)
    gathered = max((x.padded for x in groups if not x.persistent), default=0) * p
    whole = max((x.padded for x in groups if x.persistent), default=0) * p
    buckets = s.gradient_buckets * _round_up(largest * g, GPU_TIER_GRANULE)
    room = max(math.ceil(gathered / LIVE_FRACTION), 2 * gathered + whole)
    return buckets + _round_up(room, GPU_TIER_GRANULE)


def arena_usable(gpu_bytes: int) -> int:
    """What an arena of STRATA_GPU_BYTES=gpu_bytes holds for tensors (less its bounce region)."""
    bounce = max(GPU_TIER_GRANULE, min(ARENA_BOUNCE_MAX, gpu_bytes // ARENA_BOUNCE_FRACTION)
                 // GPU_TIER_GRANULE * GPU_TIER_GRANULE)
    return (gpu_bytes - bounce) // GPU_TIER_GRANULE * GPU_TIER_GRANULE


def largest_gathered(model, device: str, settings=None) -> int:
    """Bytes of the largest partitioned group gathered: FetchPolicy.max_live_bytes may not be
    below it (the engine refuses to start)."""
    m, s = Model.of(model), Settings.of(settings, device)
    p, g = _dtype_bytes(device)
    return max((x.padded for x in zero_groups(m, p, g, s) if not x.persistent), default=0) * p


# --- activations: torch's saved tensors for one step (documented in docs/bench.md) ---

def activation_bytes(model: Model, batch: int, kind: str, fused: bool) -> int:
    """torch's peak for a step's activations: per block the tensors autograd saves (LayerNorm
    inputs, the linear layers' inputs, q/k/v, the attention output and its reshaped copy, the
    MLP's 4d-wide GELU input and output: 17 x B x T x d elements), the attention scores'
    softmax (B x H x T x T, unfused only), the head's logits with cross-entropy's log-softmax
    and their gradients (B x T x vocab), and one block's backward working set (2 x 4d wide).
    kind "bf16": bf16 compute (strata, FSDP2); "autocast": fp32 parameters under bf16 autocast
    (plain torch: the residual stream and LayerNorm in fp32, softmax and cross-entropy in fp32);
    "fp32": the CPU."""
    b, t, d, h, v = batch, model.seq_len, model.d_model, model.heads, model.vocab
    btd = b * t * d
    if kind == "bf16":
        per_block, scores, head, work = 34 * btd, 2 * b * h * t * t, 8 * b * t * v, 16 * btd
    elif kind == "autocast":
        per_block, scores, head, work = 38 * btd, 6 * b * h * t * t, 20 * b * t * v, 32 * btd
    else:
        per_block, scores, head, work = 68 * btd, 4 * b * h * t * t, 16 * b * t * v, 32 * btd
    if fused:
        scores = 4 * b * h * t  # SDPA keeps the log-sum-exp (fp32), not the scores
    return model.layers * (per_block + scores) + head + work + 4 * btd  # + embeddings, ln_f


# --- the need ---

# Limits that are settings, not places: strata's arena (STRATA_GPU_BYTES) must hold its
# buckets and gathers, and FetchPolicy.max_live_bytes the largest gathered group.
SETTING_LIMITS = ("arena", "max_live")


@dataclasses.dataclass(frozen=True)
class Need:
    """Bytes a worker needs in each place; pinned is part of host (host counts it too). For
    strata also the smallest arena it trains in (arena_min, against the arena it is given) and
    the largest gathered group (against max_live_bytes). arena: what the arena it is given
    holds (arena_usable)."""
    gpu: int
    host: int
    pinned: int
    nvme: int
    items: tuple = ()  # (place, what, bytes): the sum's terms
    arena_min: int = 0
    arena: int = 0
    gathered: int = 0
    max_live: int = 0

    def get(self, place: str) -> int:
        return getattr(self, place)

    def as_dict(self) -> dict:
        out = {p: self.get(p) for p in PLACES}
        out.update(arena_min=self.arena_min, arena=self.arena, gathered=self.gathered,
                   max_live=self.max_live,
                   items=[{"place": p, "what": w, "bytes": n} for p, w, n in self.items])
        return out

    def over(self, resources: Resources) -> list:
        """[(place, needed, available)] for every place (or setting limit: "arena",
        "max_live") the need exceeds, in PLACES order."""
        out = []
        for place in PLACES:
            have, want = resources.get(place), self.get(place)
            if want and (have is None or want > have):
                out.append((place, want, have))
        if self.arena_min > self.arena:
            out.append(("arena", self.arena_min, self.arena))
        if self.gathered > self.max_live:
            out.append(("max_live", self.gathered, self.max_live))
        return out


def need(system: str, model, device: str, settings=None) -> Need:
    """The bytes `system` needs in each place to train `model` one step of settings.batch
    sequences on `device` ("cuda" or "cpu"). ValueError: an unknown system, or one that does not
    run on the device (FSDP2 on the CPU)."""
    if system not in SYSTEMS:
        raise ValueError(f"no system '{system}': use one of {', '.join(SYSTEMS)}")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device '{device}': use cuda or cpu")
    m = Model.of(model)
    s = Settings.of(settings, device)
    cuda = device == "cuda"
    if system.startswith("fsdp2") and not cuda:
        raise ValueError(f"{system} trains on a CUDA device only (compare_worker.py)")
    items = []

    def add(place, what, n):
        items.append((place, what, int(n)))

    extra = {}
    if system.startswith("strata"):
        _strata_need(system, m, device, s, add)
        extra = dict(arena_min=arena_minimum(m, device, s), arena=arena_usable(s.gpu_bytes),
                     gathered=largest_gathered(m, device, s), max_live=s.max_live_bytes)
    elif system.startswith("fsdp2"):
        _fsdp2_need(m, s, add, offload=system == "fsdp2")
    else:
        _torch_need(m, device, s, add)
    add("host", "the worker process (Python, torch, libraries)", HOST_PROCESS_BYTES[device])
    totals = {p: 0 for p in PLACES}
    for place, _what, n in items:
        totals[place] += n
    return Need(gpu=totals["gpu"], host=totals["host"] + totals["pinned"],
                pinned=totals["pinned"], nvme=totals["nvme"], items=tuple(items), **extra)


def _strata_need(system, m: Model, device, s: Settings, add) -> None:
    cuda = device == "cuda"
    p, g = _dtype_bytes(device)
    groups = zero_groups(m, p, g, s)
    largest = max(x.padded for x in groups)
    dtype = "bf16" if cuda else "fp32"
    cpu = lambda n: _round_up(n, CPU_TIER_GRANULE)  # noqa: E731
    grads = sum(cpu(x.padded * g) for x in groups)
    if system == "strata-cpu":
        # Every group's shard (or whole persistent group), its gradient landing buffer and its
        # Adam states live in the CPU tier, beside the optimizer's own pool.
        shards = sum(cpu(x.padded * p) for x in groups)
        states = sum(3 * cpu(4 * x.padded) for x in groups)
        homed = shards + grads + states
        tier = cpu_tier_for(homed)
        add("pinned", f"CPU tier: the {dtype} shards ({p} B a parameter; groups padded to "
                      f"{s.alignment} elements, each tensor rounded to {CPU_TIER_GRANULE} B)",
            shards)
        add("pinned", f"CPU tier: the {dtype} gradient shards ({g} B a parameter)", grads)
        add("pinned", "CPU tier: fp32 master and two Adam moments (12 B a parameter)", states)
        add("pinned", "CPU tier: the optimizer's own pinned pool (4 chunks of min(16 MiB, "
                      "tier/16))", tier - homed)
    else:
        # The shards and the Adam states on NVMe; the CPU tier holds the gradient landing
        # buffers, the persistent (small) parameters whole, the staging pool that every NVMe
        # move and the optimizer's state chunks go through, and room for shard copies.
        shards = sum(_round_up(x.padded * p, NVME_GRANULE) for x in groups if not x.persistent)
        chunk = nvme_chunk_elements(s)
        states = nvme_state_bytes(sum(x.padded for x in groups), chunk)
        add("nvme", f"the {dtype} shards of the partitioned groups ({p} B a parameter)", shards)
        add("nvme", "Adam states: fp32 master and two moments in each of two slots (24 B a "
                    f"parameter; chunks of {chunk:,} elements, each array rounded to 1024)",
            states)
        # Registration relays a chunk into slots of its new size before the old ones go, and
        # NVMe is never compacted: one chunk's slots of room.
        add("nvme", "one state chunk's slots while registration relays it",
            NVME_STATE_BYTES * chunk)
        whole = sum(cpu(x.padded * p) for x in groups if x.persistent)
        add("pinned", f"CPU tier: the {dtype} gradient shards ({g} B a parameter)", grads)
        add("pinned", "CPU tier: the persistent parameters, whole", whole)
        add("pinned", "CPU tier: the staging pool (STRATA_STAGING_BYTES)",
            _round_up(s.staging_bytes, CPU_TIER_GRANULE))
        cache = NVME_CPU_CACHE_GROUPS * cpu(largest * p)
        add("pinned", f"CPU tier: room for {NVME_CPU_CACHE_GROUPS} of the largest group's shard "
                      "copies on their way to or from NVMe", max(cache, NVME_CPU_CACHE_MIN)
            if cuda else cache)
    # Transient host memory while the engine is created: per group the fp32 initial values and
    # the optimizer's fp32 master, per parameter param_init's fp32 tensor.
    add("host", "creation: fp32 initial values and master of the largest group, and "
                "param_init's tensor", 12 * largest)
    if cuda:
        add("gpu", "strata's GPU arena (STRATA_GPU_BYTES, reserved whole at start)", s.gpu_bytes)
        act = activation_bytes(m, s.batch, "bf16", s.fused_attention)
        add("gpu", f"activations of batch {s.batch} in bf16 (the formula in docs/bench.md)", act)
        biggest = max(c for _n, c in _one_block_and_root(m))
        add("gpu", "autograd's gradients of parameters before they go into a bucket (two of "
                   "the largest)", 2 * g * biggest)
        add("gpu", "torch's caching allocator: 10% over its tensors",
            (TORCH_ALLOCATOR_SLACK - 1) * (act + 2 * g * biggest))
        add("gpu", "the CUDA context", CUDA_CONTEXT_BYTES)
        add("gpu", "NCCL (strata's Communicator)", NCCL_BYTES)
    else:
        add("host", "strata's GPU tier: host memory on the host backend (STRATA_GPU_BYTES)",
            s.gpu_bytes)
        add("host", f"fp32 activations of batch {s.batch}",
            activation_bytes(m, s.batch, "fp32", False))


def _one_block_and_root(m: Model):
    """The parameters of the root and of one block (every block has the same shapes)."""
    return [x for x in m.with_layers(1).shapes()]


def _fsdp2_need(m: Model, s: Settings, add, offload: bool) -> None:
    n = m.parameters()
    act = activation_bytes(m, s.batch, "bf16", s.fused_attention)
    # The groups FSDP2 holds unsharded on the GPU: the root's (embeddings, ln_f, head) from its
    # forward to the end of backward (reshard_after_forward is False at the root), and two
    # blocks (the one in use and the one prefetched). Per parameter of such a group: the bf16
    # all-gather input and output (one rank: 2 + 2), the bf16 gradient and the reduce-scatter's
    # output (2 + 2); with offload also the fp32 shard's copy on the GPU before its cast (4; the
    # fp32 sharded gradient before its copy to the host comes after the copy is gone).
    per = 12 if offload else 8
    unsharded = per * (m.root_parameters() + 2 * m.block_parameters())
    add("gpu", f"unsharded groups in flight: the root and two blocks, {per} B a parameter",
        unsharded)
    if offload:
        # CPUOffloadPolicy(pin_memory=True): the fp32 shards pinned; the gradients land in
        # pinned memory (a non_blocking copy to the CPU); torch's caching host allocator rounds
        # every pinned block up to a power of two.
        pinned = sum(_next_pow2(4 * c) for _name, c in m.shapes())
        add("pinned", "fp32 parameter shards, pinned (each block rounded to a power of two)",
            pinned)
        add("pinned", "fp32 gradient shards, pinned (each block rounded to a power of two)",
            pinned)
        add("host", "both AdamW moments, fp32 on the CPU (fused CPU AdamW): 8 B a parameter",
            8 * n)
        add("host", "a parameter's pageable fp32 copy while FSDP2 pins it (the largest)",
            4 * m.vocab * m.d_model)
        device_states = 0
    else:
        device_states = 16 * n
        add("gpu", "fp32 parameter shards, gradients and both AdamW moments on the GPU (fused "
                   "AdamW): 16 B a parameter", device_states)
        add("host", "initial values built on the CPU, one parameter at a time (the largest)",
            4 * m.vocab * m.d_model)
    add("gpu", f"activations of batch {s.batch} in bf16 (the formula in docs/bench.md)", act)
    add("gpu", "torch's caching allocator: 10% over its tensors",
        (TORCH_ALLOCATOR_SLACK - 1) * (act + unsharded + device_states))
    add("gpu", "the CUDA context", CUDA_CONTEXT_BYTES)
    add("gpu", "NCCL (FSDP2's process group)", NCCL_BYTES)


def _torch_need(m: Model, device: str, s: Settings, add) -> None:
    n = m.parameters()
    if device == "cuda":
        add("gpu", "fp32 parameters, gradients and both AdamW moments (fused, on the GPU): "
                   "16 B a parameter", 16 * n)
        weights = m.layers * (m.block_parameters() - 9 * m.d_model - m.mlp) \
            + m.vocab * m.d_model  # the Linear weights and the head: autocast's casts
        add("gpu", "autocast's bf16 copies of the matmul weights, kept for backward: 2 B a "
                   "weight", 2 * weights)
        act = activation_bytes(m, s.batch, "autocast", s.fused_attention)
        add("gpu", f"activations of batch {s.batch} under autocast (the formula in "
                   "docs/bench.md)", act)
        add("gpu", "torch's caching allocator: 10% over its tensors",
            (TORCH_ALLOCATOR_SLACK - 1) * (16 * n + 2 * weights + act))
        add("gpu", "the CUDA context", CUDA_CONTEXT_BYTES)
        add("host", "initial values built on the CPU, one parameter at a time (the largest)",
            4 * m.vocab * m.d_model)
    else:
        add("host", "fp32 parameters, gradients and both AdamW moments: 16 B a parameter",
            16 * n)
        add("host", f"fp32 activations of batch {s.batch}",
            activation_bytes(m, s.batch, "fp32", False))


# --- sizing a strata worker, and refusing what cannot start ---

def strata_env(system: str, model, device: str, resources: Resources, settings=None) -> dict:
    """The STRATA_* variables (strings) a strata worker should run with, so that "does not fit"
    is the machine's limit and not a sizing slip:

    strata-cpu: STRATA_CPU_BYTES is all the machine may pin (resources.pinned, or what host
    leaves beside the worker's other host memory when that is less), STRATA_NVME_PATHS empty (no
    NVMe tier). A model larger than that fails in strata's tier (ResourceExhaustedError).
    strata-nvme: STRATA_NVME_PATHS=resources.nvme_path, STRATA_NVME_BYTES all its usable free
    space (resources.nvme, whole I/O blocks), STRATA_STAGING_BYTES and STRATA_IO_BLOCK from the
    settings, and a CPU tier of what the model needs there (need().pinned: gradients, persistent
    parameters, staging, room for shard copies; at most what the machine may pin), so that the
    shards are read from NVMe each step rather than cached whole in host memory.
    Both: STRATA_GPU_BYTES = settings.gpu_bytes (the arena is a fixed size by design; check()
    says when it is too small for the model).
    ValueError for a system that is not strata's, or strata-nvme without nvme_path."""
    if system not in ("strata-cpu", "strata-nvme"):
        raise ValueError(f"strata_env: '{system}' is not a strata system")
    m = Model.of(model)
    s = Settings.of(settings, device)
    n = need(system, m, device, s)
    machine_tier = max(0, min(resources.pinned, resources.host - (n.host - n.pinned)))
    env = {"STRATA_GPU_BYTES": str(s.gpu_bytes)}
    if system == "strata-cpu":
        env["STRATA_CPU_BYTES"] = str(machine_tier // CPU_TIER_STEP * CPU_TIER_STEP)
        env["STRATA_NVME_PATHS"] = ""  # empty: no NVMe tier (docs/configuration.md)
        return env
    if not resources.nvme_path:
        raise ValueError("strata_env: strata-nvme needs an NVMe directory (Resources.nvme_path: "
                         "compare.py's --nvme-path or STRATA_NVME_PATHS)")
    tier = min(machine_tier, n.pinned)
    env["STRATA_CPU_BYTES"] = str(tier // CPU_TIER_STEP * CPU_TIER_STEP)
    env["STRATA_NVME_PATHS"] = resources.nvme_path
    env["STRATA_NVME_BYTES"] = str((resources.nvme or 0) // s.io_block * s.io_block)
    env["STRATA_STAGING_BYTES"] = str(s.staging_bytes)
    env["STRATA_IO_BLOCK"] = str(s.io_block)
    return env


_WHAT = {"gpu": "GPU memory", "host": "host memory", "pinned": "pinned host memory",
         "nvme": "NVMe space",
         "arena": "strata's GPU arena (STRATA_GPU_BYTES less its bounce region)",
         "max_live": "gathered-parameter limit (FetchPolicy.max_live_bytes)"}
_FIX = {
    "gpu": "a GPU with more free memory, a smaller batch, or fewer layers",
    "host": "free host memory (other processes), or fewer layers",
    "pinned": "allow more pinned memory (resources pinned=), or fewer layers",
    "nvme": "a directory with more free space (--nvme-path), or fewer layers",
    "arena": "raise the arena (compare.py --strata-gpu-bytes), or fewer layers",
    "max_live": "raise max_live_bytes, or fewer layers",
}


def check(system: str, model, device: str, resources: Resources, settings=None) -> str | None:
    """Why `system` cannot start `model` on this machine, or None: a message naming the
    resource, the bytes needed and available, the largest layer count that fits, and the fix.
    Checked before a process is started (compare.py's comparison run)."""
    try:
        n = need(system, model, device, settings)
    except ValueError as e:
        return str(e)
    m = Model.of(model)
    if system == "strata-nvme" and not resources.nvme_path:
        return ("strata-nvme needs an NVMe directory: give compare.py --nvme-path or "
                "STRATA_NVME_PATHS")
    over = n.over(resources)
    if not over:
        return None
    place, want, have = over[0]
    fits = largest_layers(system, m, device, resources, settings)
    biggest = (f"at most {fits['layers']} layers fit" if fits["layers"] else
               f"not even 1 layer fits ({fits['bound']} bounds it)")
    source = dict(resources.sources).get(place, "")
    also = "; also " + ", ".join(f"{p}: {fmt(w)} > {fmt(h)}" for p, w, h in over[1:]) \
        if over[1:] else ""
    return (f"{system} at {m.describe()} needs {fmt(want)} of {_WHAT[place]} but "
            f"{'none' if have is None else fmt(have)} is available"
            + (f" ({source})" if source else "") + f"; {biggest}: {_FIX[place]}{also}")


def largest_layers(system: str, model, device: str, resources: Resources, settings=None) -> dict:
    """The largest layer count (at the model's width) whose need fits `resources`, and what
    bounds it: {"layers", "parameters", "bound" (a place of PLACES, "arena", "max_live", or
    "max_layers": settings.max_layers reached), "need" (Need at that count; None when nothing
    fits), "next_need" (Need one layer more; None at max_layers)}. layers 0: none fits."""
    m = Model.of(model)
    s = Settings.of(settings, device)

    def at(layers):
        return need(system, m.with_layers(layers), device, s)

    first = at(1)
    if first.over(resources):
        return {"layers": 0, "parameters": 0, "bound": first.over(resources)[0][0],
                "need": None, "next_need": first}
    lo, hi = 1, 2
    while hi <= s.max_layers and not at(hi).over(resources):
        lo, hi = hi, hi * 2
    if hi > s.max_layers:
        if not at(s.max_layers).over(resources):
            return {"layers": s.max_layers,
                    "parameters": m.with_layers(s.max_layers).parameters(),
                    "bound": "max_layers", "need": at(s.max_layers), "next_need": None}
        hi = s.max_layers
    while hi - lo > 1:  # lo fits, hi does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if not at(mid).over(resources) else (lo, mid)
    beyond = at(lo + 1)
    return {"layers": lo, "parameters": m.with_layers(lo).parameters(),
            "bound": beyond.over(resources)[0][0], "need": at(lo), "next_need": beyond}
