"""compare_measure: what compare_worker.py measures besides the step's losses and how it writes
it: the step's parts (Timer), GPU memory (GpuMemory: torch's allocator, mem_get_info, strata's
arena), pinned host bytes as torch reports them, host RSS, the process's start, and the JSON
(strict: a non-finite number is null; written atomically). compare_worker.py's docstring lists
the fields."""

import json
import math
import os
import time


def finite_or_none(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def python_start_s(t0: float):
    """Seconds from this process's exec to the perf_counter() time t0 (the interpreter's start
    and the imports before it), from /proc/self/stat's start time; None where not readable."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME)
                   - (time.perf_counter() - t0) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def host_memory() -> dict:
    """VmHWM (peak RSS) and VmRSS of this process, in bytes (/proc/self/status)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmRSS"):
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return {"rss_peak_bytes": out.get("VmHWM"), "rss_bytes": out.get("VmRSS")}


class Timer:
    """Step-part boundaries: CUDA events on torch's current stream on a GPU (the parts are the
    GPU stream's time between them, host waits included when the stream idled meanwhile), the
    host clock on the CPU; the step ends when its work is done (synchronize)."""

    def __init__(self, torch, cuda: bool):
        self.torch, self.cuda = torch, cuda

    def mark(self):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def done(self):
        if self.cuda:
            self.torch.cuda.synchronize()
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        if self.cuda:
            return a.elapsed_time(b) / 1e3
        return b - a


def torch_pinned(torch) -> dict:
    """torch's pinned host memory where this torch reports it: torch.cuda.host_memory_stats'
    peak of the bytes its pinned allocator got from CUDA ("reserved_bytes", newer torch
    "allocated_bytes": active and cached blocks), else None."""
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is None:
        return {"pinned_bytes": None, "pinned_note": "this torch does not report pinned bytes"}
    try:
        s = stats()
    except Exception as e:  # noqa: BLE001 - a report, not a failure
        return {"pinned_bytes": None, "pinned_note": f"host_memory_stats: {e}"}
    for key in ("reserved_bytes.peak", "allocated_bytes.peak"):
        if key in s:
            return {"pinned_bytes": s[key], "pinned_note": f"torch.cuda.host_memory_stats {key}"}
    return {"pinned_bytes": None,
            "pinned_note": f"host_memory_stats has no byte peak (keys {sorted(s)[:8]})"}


class GpuMemory:
    """torch.cuda.mem_get_info at the start (after CUDA's context, before the system), at every
    step's end and at the end; the figures of the module docstring's "memory"."""

    def __init__(self, torch, cuda: bool):
        self.torch, self.cuda = torch, cuda
        self.free_start = self.total = self.free_min = None
        if cuda:
            torch.cuda.init()
            self.free_start, self.total = torch.cuda.mem_get_info()
            self.free_min = self.free_start

    def boundary(self):
        if not self.cuda:
            return None
        free = self.torch.cuda.mem_get_info()[0]
        self.free_min = min(self.free_min, free)
        return free

    def report(self, arena_capacity, arena_peak) -> dict:
        if not self.cuda:
            return {k: None for k in (
                "torch_max_allocated_bytes", "torch_max_reserved_bytes",
                "torch_reserved_end_bytes", "gpu_free_start_bytes", "gpu_free_end_bytes",
                "gpu_free_min_bytes", "gpu_device_total_bytes", "gpu_context_bytes",
                "gpu_other_bytes", "gpu_total_bytes", "gpu_peak_bytes")}
        torch = self.torch
        free_end = self.boundary()
        reserved_end = torch.cuda.memory_reserved()
        max_reserved = torch.cuda.max_memory_reserved()
        max_allocated = torch.cuda.max_memory_allocated()
        arena = arena_capacity or 0
        other = (self.free_start - free_end) - reserved_end - arena
        return {
            "torch_max_allocated_bytes": max_allocated, "torch_max_reserved_bytes": max_reserved,
            "torch_reserved_end_bytes": reserved_end, "gpu_free_start_bytes": self.free_start,
            "gpu_free_end_bytes": free_end, "gpu_free_min_bytes": self.free_min,
            "gpu_device_total_bytes": self.total,
            "gpu_context_bytes": self.total - self.free_start, "gpu_other_bytes": other,
            "gpu_total_bytes": max_reserved + arena + max(other, 0),
            "gpu_peak_bytes": max_allocated + (arena_peak or 0),
            "gpu_memory_note": (
                "mem_get_info's free after CUDA's start (before the system was built) minus at "
                "the end, less torch's reserved and strata's arena at the end, is "
                "gpu_other_bytes: NCCL's buffers and communicators, lazily loaded kernels, "
                "library handles; gpu_total_bytes = torch's peak reserved + the arena's "
                "capacity (reserved at start, used or not) + gpu_other_bytes when positive")}


def json_safe(value, path="", bad=None):
    """`value` with every non-finite float replaced by None (their paths appended to `bad`)."""
    if isinstance(value, float) and not math.isfinite(value):
        if bad is not None:
            bad.append(path or "/")
        return None
    if isinstance(value, dict):
        return {k: json_safe(v, f"{path}/{k}", bad) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, f"{path}/{i}", bad) for i, v in enumerate(value)]
    return value


def write_json(path: str, out: dict, final: bool) -> None:
    """Writes `out` to `path` atomically (a temporary file renamed over it); `final`: fsynced.
    Strict JSON: non-finite numbers are null (listed in "non_finite_fields")."""
    bad = []
    doc = json_safe(out, "", bad)
    if bad:
        doc["non_finite_fields"] = bad
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, allow_nan=False)
        f.flush()
        if final:
            os.fsync(f.fileno())
    os.replace(tmp, path)
