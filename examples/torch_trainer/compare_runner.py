"""compare.py's worker processes (no torch here): one compare_worker.py process per system and
size, started only when its budget fits the machine (compare_budget.py), bounded in time, and
read from the JSON it writes -- also when the process then hangs at exit (NCCL, CUDA or the
interpreter's teardown), which used to be recorded as a timeout with its figures thrown away.

    runner = Runner(args, work_dir, resources)
    result = runner.run("strata-cpu", layers, steps, limit_s, batch)   # a dict, "status" first

"status": ok (trained), oom (did not fit: torch's or strata's out-of-memory, or a killed
process), refused (not started: its budget does not fit the machine; "error" says which
resource, how much and the fix), failed, timeout (no JSON within the limit), skipped (the system
is unavailable here, or no time was left). Every result carries "seconds" (the process's wall
time) and "process": {"started_s", "json_s", "exit_s", "hung_after_json"}: when the process was
started, when its JSON appeared and when it exited, relative to the call.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MIN_TRY_S = 5.0  # a process given less time than this is not started
# After its JSON appears, the time a worker gets to exit by itself before it is killed (its
# figures are already safe): compare_worker.py calls os._exit right after writing, so a worker
# still alive after this is stuck in teardown.
EXIT_GRACE_S = 10.0
# A worker is a job of one rank even when compare.py runs under torchrun or srun: the variables
# strata and torch read to join a job (comm/launch.cc's and config/slurm.cc's lists) are dropped.
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                    "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
                    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
                    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                    "TORCHELASTIC_RUN_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS",
                    "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NODEID",
                    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE")


def read_json(path: str):
    """The worker's JSON once it is whole (a complete, parseable object), else None."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the worker's process group, SIGKILL a moment later: nothing is left behind."""
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass


def watch(cmd, env, out_json: str, limit: float, log_path: str,
          grace: float = EXIT_GRACE_S) -> dict:
    """Runs `cmd` (its output to log_path) until it exits, or until `limit` seconds, or until
    `grace` seconds after its JSON appeared; returns {"rc", "json", "output", "process"}."""
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    result = None
    json_at = None
    rc = None
    hung = False
    try:
        while True:
            rc = proc.poll()
            now = time.monotonic() - t0
            if result is None:
                result = read_json(out_json)
                if result is not None:
                    json_at = now
            if rc is not None:
                if result is None:
                    result = read_json(out_json)
                    json_at = now if result is not None else None
                break
            if json_at is not None and now - json_at > grace:
                hung = True  # its figures are in; it is stuck on the way out
                break
            if now > limit:
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            stop(proc)
    exit_s = time.monotonic() - t0
    try:
        with open(log_path, errors="replace") as f:
            output = f.read()
    except OSError:
        output = ""
    return {"rc": rc, "json": result, "output": output,
            "process": {"json_s": None if json_at is None else round(json_at, 2),
                        "exit_s": round(exit_s, 2), "hung_after_json": hung,
                        "killed": rc is None}}


def progress(partial_path: str, steps: int) -> str:
    """Where a worker cut by its limit had got to, from the figures it publishes as it goes
    (compare_worker.py's JSON + ".partial"): the steps done and their times, or that it never
    finished building."""
    partial = read_json(partial_path)
    if partial is None:
        return "(no result written; it had not finished building its model)"
    done = partial.get("steps") or []
    st = partial.get("startup") or {}
    built = (f"built in {st['build_s']:.1f} s, " if st.get("build_s") is not None else "")
    if not done:
        return f"({built}no step finished)"
    times = ", ".join(f"{d['seconds']:.1f}" for d in done if d.get("seconds") is not None)
    return f"({built}{len(done)} of {steps} steps done, in {times} s)"


class Runner:
    """Runs compare_worker.py processes within the whole run's deadline (args.deadline_s from
    `start`). `sizing(system, layers)` -> (env updates, None) or (None, why): the STRATA_*
    sizes of a strata worker and the pre-start budget check (compare_budget.py's); `data`: the
    batches' file the parent wrote once (compare_worker.py --data), or None."""

    def __init__(self, args, work: str, sizing, data=None, start=None):
        self.args, self.work, self.sizing, self.data = args, work, sizing, data
        self.start = time.monotonic() if start is None else start
        self.n = 0

    def left(self) -> float:
        return self.args.deadline_s - (time.monotonic() - self.start)

    def env(self, system: str, layers: int):
        """The worker's environment, or (None, why) when its budget does not fit the machine
        (no process is started for it)."""
        env = dict(os.environ)
        for k in LAUNCH_VARIABLES:
            env.pop(k, None)  # a job of one rank
        env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH")) if p)
        updates, why = self.sizing(system, layers)
        if updates is None:
            return None, why
        for key, value in updates.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = str(value)
        return env, None

    def command(self, system: str, layers: int, steps: int, batch: int, out: str, extra=()):
        a = self.args
        cmd = [sys.executable, os.path.join(HERE, "compare_worker.py"), f"--system={system}",
               f"--device={a.device}", f"--vocab={a.vocab}", f"--seq-len={a.seq_len}",
               f"--d-model={a.d_model}", f"--heads={a.heads}", f"--layers={layers}",
               f"--batch={batch}", f"--steps={steps}", f"--json={out}",
               f"--max-live-bytes={a.max_live_bytes}", f"--prefetch-bytes={a.prefetch_bytes}"]
        if getattr(a, "perturb", None) == system:
            cmd.append("--perturb")
        if a.device == "cuda":  # SDPA where torch has it: no t x t scores kept for backward
            cmd.append("--fused-attention")
        return cmd + list(extra)

    def run(self, system: str, layers: int, steps: int, limit: float, batch: int,
            extra=(), data=True) -> dict:
        """One worker process; its JSON with "status" (the module's docstring) and "seconds".
        `data`: hand it the parent's batches (False: the probes of the search, which need no
        particular data)."""
        limit = min(limit, self.left() - 2)
        if limit < MIN_TRY_S:
            return {"status": "skipped",
                    "skipped": f"not started: {max(self.left(), 0):.0f} s left before the "
                               f"{self.args.deadline_s:.0f} s deadline"}
        env, why = self.env(system, layers)
        if env is None:
            return {"status": "refused", "fits": False, "error": why, "not_started": True}
        self.n += 1
        out = os.path.join(self.work, f"{self.n}-{system}.json")
        log = os.path.join(self.work, f"{self.n}-{system}.log")
        cmd = self.command(system, layers, steps, batch, out, extra)
        if data and self.data:
            cmd.append(f"--data={self.data}")
        w = watch(cmd, env, out, limit, log, grace=EXIT_GRACE_S)
        result = w["json"] or {}
        output = w["output"]
        if not result:
            if w["process"]["killed"]:
                result = {"status": "timeout", "error": f"did not finish within {limit:.0f} s "
                                                        + progress(out + ".partial", steps)}
            elif w["rc"] < 0:
                result = {"status": "oom", "fits": False,
                          "error": f"killed by signal {-w['rc']} without a result (host "
                                   "memory?)"}
            else:
                result = {"status": "failed", "fits": True,
                          "error": f"exited {w['rc']} without a result: {output[-400:]}"}
        result["seconds"] = w["process"]["exit_s"]
        result["process"] = w["process"]
        if w["process"]["hung_after_json"]:
            result.setdefault("notes", []).append(
                f"the worker wrote its result at {w['process']['json_s']} s and was still "
                f"alive {EXIT_GRACE_S:.0f} s later (stuck in teardown): killed, result kept")
        if result.get("status") in ("failed", "timeout", "oom"):
            result["output_tail"] = output[-1500:]
        return result
