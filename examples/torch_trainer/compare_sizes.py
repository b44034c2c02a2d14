"""compare_sizes: the inputs of compare_budget.py: a GPT's sizes (Model), what a worker runs
with (Settings), what a machine offers (Resources: measured, or given as "gpu=64MiB,host=1GiB"),
and bytes parsed (as strata.parse_size takes them) and printed. No torch at module level."""

from __future__ import annotations

import dataclasses
import math
import os
import resource
import shutil
import subprocess

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# strata's ZeroOptions defaults that compare_worker.py leaves alone (FetchPolicy, ReducePolicy).
BUCKET_BYTES, GRADIENT_BUCKETS, ALIGNMENT = 32 * MiB, 2, 64
PERSIST_BELOW_BYTES = 128 * KiB
# Kept free by Resources.measure(): the parent, the page cache, other processes; on the NVMe
# drive, room for the drive's other users (logs, results).
HOST_RESERVE_BYTES, HOST_RESERVE_FRACTION = 1 * GiB, 0.05
NVME_RESERVE_BYTES, NVME_RESERVE_FRACTION = 1 * GiB, 0.02
PLACES = ("gpu", "host", "pinned", "nvme")


def parse_size(text) -> int:
    """A size as strata.parse_size takes it (4096, 512KiB, 1.5GB); an int as is."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a size")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"{text} is not a size: negative")
        return text
    try:
        from strata import parse_size as strata_parse_size
    except ImportError:  # the parser's grammar, for a parent without strata on its path
        return _parse_size_here(text)
    return int(strata_parse_size(str(text)))


def _parse_size_here(text) -> int:
    """strata.parse_size's grammar (docs/configuration.md, "Sizes") where strata is not
    importable: a number, a unit of B, KiB..PiB, KB..PB (any case), fractions rounded."""
    units = {"": 1, "b": 1, "kib": KiB, "mib": MiB, "gib": GiB, "tib": 1 << 40, "pib": 1 << 50,
             "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15}
    s = str(text).strip()
    i = len(s)
    while i and not (s[i - 1].isdigit() or s[i - 1] == "."):
        i -= 1
    number, unit = s[:i].strip(), s[i:].strip().lower()
    if unit not in units or not number:
        raise ValueError(f"'{text}' is not a size: use a byte count with an optional unit "
                         "(4096, 512KiB, 64MiB, 40GiB, 1.5GB)")
    value = math.floor(float(number) * units[unit] + 0.5)
    if value <= 0:
        raise ValueError(f"'{text}' is not a size: zero")
    return value


def fmt(n) -> str:
    """Bytes for a message: 1.50 GiB, 512.00 MiB, 4096 B."""
    if n is None:
        return "unknown"
    for unit, size in (("TiB", 1 << 40), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


# --- the model and the settings ---

@dataclasses.dataclass(frozen=True)
class Model:
    """gpt.py's GPT with an untied head (compare.py's): the sizes only."""
    vocab: int
    seq_len: int
    d_model: int
    heads: int
    layers: int
    d_mlp: int = 0  # 0: 4 x d_model

    @classmethod
    def of(cls, obj, layers: int | None = None) -> "Model":
        """From compare.py's args, a gpt.GPTConfig, a dict or a Model; `layers` overrides."""
        get = (lambda k, d=None: obj.get(k, d)) if isinstance(obj, dict) else \
            (lambda k, d=None: getattr(obj, k, d))
        return cls(vocab=int(get("vocab")), seq_len=int(get("seq_len")),
                   d_model=int(get("d_model")), heads=int(get("heads")),
                   layers=int(layers if layers is not None else get("layers")),
                   d_mlp=int(get("d_mlp", 0) or 0))

    @property
    def mlp(self) -> int:
        return self.d_mlp or 4 * self.d_model

    def with_layers(self, layers: int) -> "Model":
        return dataclasses.replace(self, layers=layers)

    def block_parameters(self) -> int:
        d, m = self.d_model, self.mlp
        return 4 * d * d + 2 * d * m + 9 * d + m

    def root_parameters(self) -> int:
        """Everything outside the blocks: embeddings, final LayerNorm, the untied head."""
        return (self.vocab + self.seq_len) * self.d_model + 2 * self.d_model \
            + self.vocab * self.d_model

    def parameters(self) -> int:
        """gpt.parameter_count (untied): compare.py's parameters(args, layers)."""
        return self.root_parameters() + self.layers * self.block_parameters()

    def layers_for(self, parameters: float) -> float:
        """The (fractional) layer count whose model has `parameters` parameters."""
        return (parameters - self.root_parameters()) / self.block_parameters()

    def shapes(self):
        """(name, element count) of every parameter in module order (GPT's registration order,
        the order zero_shard hands them to the engine)."""
        d, m, v, t = self.d_model, self.mlp, self.vocab, self.seq_len
        yield "tok.weight", v * d
        yield "pos.weight", t * d
        block = (("ln1.weight", d), ("ln1.bias", d), ("attn.qkv.weight", 3 * d * d),
                 ("attn.qkv.bias", 3 * d), ("attn.proj.weight", d * d), ("attn.proj.bias", d),
                 ("ln2.weight", d), ("ln2.bias", d), ("mlp.fc.weight", m * d),
                 ("mlp.fc.bias", m), ("mlp.proj.weight", d * m), ("mlp.proj.bias", d))
        for i in range(self.layers):
            for name, n in block:
                yield f"blocks.{i}.{name}", n
        yield "ln_f.weight", d
        yield "ln_f.bias", d
        yield "head.weight", v * d

    def describe(self) -> str:
        return f"{self.layers} layers ({self.parameters():,} parameters)"


_DEVICE_DEFAULTS = {
    # compare.py's DEFAULTS: strata's arena and stage-3 fetch sizes, NVMe staging by device.
    "cuda": dict(gpu_bytes=6 * GiB, max_live_bytes=2 * GiB, prefetch_bytes=256 * MiB,
                 staging_bytes=256 * MiB),
    "cpu": dict(gpu_bytes=64 * MiB, max_live_bytes=1 * MiB, prefetch_bytes=64 * KiB,
                staging_bytes=8 * MiB),
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a worker runs with, beyond the model's sizes. Sizes are bytes (Settings.of takes
    strings too). batch: sequences a step (the search's probes run compare.py's --search-batch);
    gpu_bytes: strata's arena (STRATA_GPU_BYTES); max_live_bytes, prefetch_bytes: stage 3's
    FetchPolicy; staging_bytes: STRATA_STAGING_BYTES (strata-nvme); io_block: STRATA_IO_BLOCK;
    fused_attention: SDPA (no t x t scores kept); max_layers: where the prediction stops."""
    batch: int = 1
    gpu_bytes: int = 6 * GiB
    max_live_bytes: int = 2 * GiB
    prefetch_bytes: int = 256 * MiB
    staging_bytes: int = 256 * MiB
    io_block: int = 1 * MiB
    fused_attention: bool = True
    bucket_bytes: int = BUCKET_BYTES
    gradient_buckets: int = GRADIENT_BUCKETS
    alignment: int = ALIGNMENT
    persist_below_bytes: int = PERSIST_BELOW_BYTES
    max_layers: int = 100_000

    @classmethod
    def of(cls, obj=None, device: str = "cuda", **overrides) -> "Settings":
        """From a Settings, a dict or compare.py's args (batch, strata_gpu_bytes or gpu_bytes,
        max_live_bytes, prefetch_bytes, ...), the device's defaults for what is missing."""
        if isinstance(obj, Settings) and not overrides:
            return obj
        values = {f.name: f.default for f in dataclasses.fields(cls)}
        values.update(_DEVICE_DEFAULTS[device])
        values["fused_attention"] = device == "cuda"
        if isinstance(obj, Settings):
            values.update(dataclasses.asdict(obj))
        elif obj is not None:
            get = obj.get if isinstance(obj, dict) else (lambda k: getattr(obj, k, None))
            aliases = {"strata_gpu_bytes": "gpu_bytes", "search_max_layers": "max_layers"}
            for key in list(cls.__dataclass_fields__) + list(aliases):
                value = get(key)
                if value is not None:
                    values[aliases.get(key, key)] = value
        values.update({k: v for k, v in overrides.items() if v is not None})
        for key in ("gpu_bytes", "max_live_bytes", "prefetch_bytes", "staging_bytes", "io_block",
                    "bucket_bytes", "persist_below_bytes"):
            values[key] = parse_size(values[key])
        return cls(**{k: v for k, v in values.items() if k in cls.__dataclass_fields__})


# --- what a machine offers ---

@dataclasses.dataclass(frozen=True)
class Resources:
    """What a machine offers one worker, in bytes (None: not there).

    gpu: free GPU memory (nvidia-smi's memory.free, else torch.cuda.mem_get_info); host: the
    host's MemAvailable less a reserve for the parent and the OS (HOST_RESERVE_*); pinned: how
    much of that may be page-locked. Assumed equal to host: cudaHostRegister and
    cudaHostAlloc (strata's CPU tier, torch's pinned memory) pin through the driver, which does
    not charge RLIMIT_MEMLOCK (the limit is recorded in `memlock`: it bounds only io_uring's
    buffer registration, which strata does without, with a warning, beyond it); give pinned=
    where a machine pins less. nvme: free bytes at nvme_path (shutil.disk_usage) less a reserve
    (NVME_RESERVE_*), so the drive's other users keep room. `sources` says where each figure
    came from ("measured ...", "given")."""
    gpu: int | None
    host: int
    pinned: int
    nvme: int | None = None
    nvme_path: str | None = None
    memlock: int | None = None
    sources: tuple = ()

    KEYS = ("gpu", "host", "pinned", "nvme", "nvme_path")

    @classmethod
    def measure(cls, device: str = "cpu", nvme_path: str | None = None) -> "Resources":
        sources = {}
        gpu = None
        if device == "cuda":
            gpu, how = gpu_free_bytes()
            sources["gpu"] = how
        available = mem_available()
        host = max(0, available - max(HOST_RESERVE_BYTES, int(HOST_RESERVE_FRACTION * available)))
        sources["host"] = (f"measured: MemAvailable {fmt(available)} less a reserve of "
                           f"max({fmt(HOST_RESERVE_BYTES)}, {HOST_RESERVE_FRACTION:.0%})")
        sources["pinned"] = "assumed: all of host (cudaHostRegister is not bound by RLIMIT_MEMLOCK)"
        nvme = None
        if nvme_path:
            free = shutil.disk_usage(nvme_path).free
            nvme = max(0, free - max(NVME_RESERVE_BYTES, int(NVME_RESERVE_FRACTION * free)))
            sources["nvme"] = (f"measured: {fmt(free)} free at {nvme_path} less a reserve of "
                               f"max({fmt(NVME_RESERVE_BYTES)}, {NVME_RESERVE_FRACTION:.0%})")
        soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
        return cls(gpu=gpu, host=host, pinned=host, nvme=nvme, nvme_path=nvme_path or None,
                   memlock=None if soft == resource.RLIM_INFINITY else soft,
                   sources=tuple(sources.items()))

    @classmethod
    def parse(cls, text: str, base: "Resources | None" = None, device: str = "cpu",
              nvme_path: str | None = None) -> "Resources":
        """Overrides, "gpu=64MiB,host=1GiB,pinned=512MiB,nvme=256MiB,nvme_path=/mnt/nvme" (sizes
        as strata.parse_size takes them), on `base` (default: measured on `device`). pinned
        follows a smaller host; pinned above host is an error."""
        given = {}
        for part in (p.strip() for p in (text or "").split(",")):
            if not part:
                continue
            key, eq, value = part.partition("=")
            key = key.strip()
            if not eq or key not in cls.KEYS:
                raise ValueError(f"resources: '{part}' is not key=value with a key of "
                                 f"{', '.join(cls.KEYS)} (e.g. gpu=64MiB,host=1GiB)")
            if key in given:
                raise ValueError(f"resources: '{key}' given twice")
            try:
                given[key] = value.strip() if key == "nvme_path" else parse_size(value.strip())
            except ValueError as e:
                raise ValueError(f"resources: {key}={value.strip()}: {e}") from None
        if base is None:
            base = cls.measure(device, given.get("nvme_path", nvme_path))
        return base.replace(**given)

    def replace(self, **given) -> "Resources":
        """These figures given (the others kept; pinned lowered to a smaller host)."""
        values = {k: getattr(self, k) for k in self.KEYS}
        values.update(given)
        if "pinned" in given and given["pinned"] > values["host"]:
            raise ValueError(f"resources: pinned={fmt(given['pinned'])} is more than host="
                             f"{fmt(values['host'])}: pinned memory is host memory")
        if "host" in given and "pinned" not in given:
            # An assumed pinned figure (all of host) follows host; a given one stays, below it.
            assumed = not dict(self.sources).get("pinned", "assumed").startswith("given")
            values["pinned"] = values["host"] if assumed else min(values["pinned"], values["host"])
        if "nvme_path" in given and "nvme" not in given and values["nvme_path"]:
            free = shutil.disk_usage(values["nvme_path"]).free
            values["nvme"] = max(0, free - max(NVME_RESERVE_BYTES, int(NVME_RESERVE_FRACTION * free)))
        sources = dict(self.sources)
        sources.update({k: "given" for k in given})
        return dataclasses.replace(self, **values, sources=tuple(sources.items()))

    def get(self, place: str):
        return getattr(self, place)

    def as_dict(self) -> dict:
        return {"gpu": self.gpu, "host": self.host, "pinned": self.pinned, "nvme": self.nvme,
                "nvme_path": self.nvme_path, "memlock": self.memlock,
                "sources": dict(self.sources)}

    def describe(self) -> str:
        parts = [f"{p} {fmt(self.get(p))}" for p in PLACES if self.get(p) is not None]
        if self.nvme_path:
            parts[-1] += f" at {self.nvme_path}"
        return ", ".join(parts)


def mem_available() -> int:
    """/proc/meminfo's MemAvailable in bytes (os.sysconf's physical pages where it is not)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gpu_free_bytes(index: int = 0):
    """(free bytes of GPU `index`, how measured): nvidia-smi first (no CUDA context in this
    process, whose memory would stay taken while the workers run), else
    torch.cuda.mem_get_info (which creates one: counted as used, consistently)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--id={index}", "--query-gpu=memory.free",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            return int(float(out.stdout.split()[0]) * MiB), "measured: nvidia-smi memory.free"
    except (OSError, ValueError, subprocess.TimeoutExpired):
        pass
    import torch  # only here: the parent imports torch anyway on a GPU
    free, _total = torch.cuda.mem_get_info(index)
    return int(free), "measured: torch.cuda.mem_get_info"
