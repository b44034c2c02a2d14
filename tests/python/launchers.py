#!/usr/bin/env python3
"""The launchers users start strata jobs with, reproduced for tests on one machine.

  launchers.py torchrun --nproc-per-node=2 [--max-restarts=1] [--kill=RANK:ATTEMPT:TEXT]
                        [--rdzv=static|c10d] -- CMD ...
      torchrun's behaviour as its agent has it (torch.distributed.elastic): the launcher itself
      serves a real torch TCPStore on MASTER_ADDR:MASTER_PORT for the job's life, and starts
      the workers with torchrun's variables, TORCHELASTIC_USE_AGENT_STORE=True among them
      (static rendezvous; c10d's too since torch 2.5; --no-agent-store: c10d's before 2.5). When a worker fails and restarts are
      left, every worker is stopped and all are started again with TORCHELASTIC_RESTART_COUNT
      one higher, against the same store (--max-restarts). --kill kills RANK with SIGKILL on
      attempt ATTEMPT once it prints a line matching REGEX (a crash mid-training);
      --late-rank0 starts rank 0 late on a restart. (Debian's torch 1.13 torchrun
      crashes on Python 3.11 before starting a worker, so tests cannot run the real one.)
  launchers.py srun -n 2 [--no-master] -- CMD ...
      srun's tasks on one node: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
      SLURM_STEP_ID, SLURM_TASKS_PER_NODE, ... and no torch variable; MASTER_ADDR and
      MASTER_PORT exported as the sbatch script of docs/strata-run.md does (--no-master: not).

Every worker's output lines are prefixed "[rank] " (as strata-run --tag-output). The launcher
exits with the first failing worker's status (or 0), after --timeout seconds (default 240) with
124, and leaves no process behind: every worker runs in its own process group, killed on exit.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

TORCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                   "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
                   "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                   "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_running: list["Workers"] = []  # stopped by the signal handler (a test's timeout kills us)


def _on_signal(signum, frame):
    for w in _running:
        w.stop()
    sys.exit(128 + signum)


class Workers:
    """Started worker processes, their output forwarded with a rank prefix."""

    def __init__(self):
        _running.append(self)
        self.procs: list[subprocess.Popen] = []
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.watch = None  # (rank, text, callback): called once when rank prints text

    def start(self, cmd, envs, late=None):
        """`late`: (rank, seconds): that rank starts after the others, by that much."""
        order = list(range(len(envs)))
        if late is not None:
            order.remove(late[0])
            order.append(late[0])
        self.procs = [None] * len(envs)
        self.threads = [None] * len(envs)
        for rank in order:
            env = envs[rank]
            if late is not None and rank == late[0]:
                time.sleep(late[1])
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            self.procs[rank] = proc
            t = threading.Thread(target=self._forward, args=(rank, proc), daemon=True)
            t.start()
            self.threads[rank] = t

    def _forward(self, rank, proc):
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            with self.lock:
                sys.stdout.write(f"[{rank}] {line}")
                sys.stdout.flush()
                watch = self.watch
            if watch is not None and watch[0] == rank and re.search(watch[1], line):
                self.watch = None
                watch[2]()

    def wait(self, deadline):
        """The exit statuses once every worker has exited or one has failed (None: timed out)."""
        while time.monotonic() < deadline:
            codes = [p.poll() for p in self.procs]
            if any(c not in (None, 0) for c in codes) or all(c == 0 for c in codes):
                return codes
            time.sleep(0.05)
        return None

    def stop(self):
        """SIGTERM to every worker's group, then SIGKILL after 5 s, as torchrun's agent does."""
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            for p in self.procs:
                if p is not None and p.poll() is None:
                    try:
                        os.killpg(p.pid, sig)
                    except ProcessLookupError:
                        pass
            end = time.monotonic() + grace
            while time.monotonic() < end and any(p is not None and p.poll() is None
                                                 for p in self.procs):
                time.sleep(0.05)
        for t in self.threads:
            if t is not None:
                t.join(timeout=5)
        self.procs.clear()
        self.threads.clear()


def run_torchrun(args, cmd) -> int:
    import torch.distributed as dist

    port = args.master_port or free_port()
    # The agent's store: a real torch TCPStore server, held for the job's life. torch < 2.5's
    # c10d rendezvous (--no-agent-store) instead hands the workers a free MASTER_PORT that
    # nobody serves, with TORCHELASTIC_USE_AGENT_STORE=False.
    store = None
    if not args.no_agent_store:
        store = dist.TCPStore("127.0.0.1", port, None, True,
                              datetime.timedelta(seconds=args.timeout), wait_for_workers=False)
    n = args.nproc_per_node
    deadline = time.monotonic() + args.timeout
    kill = None
    if args.kill:
        rank, attempt, text = args.kill.split(":", 2)
        kill = (int(rank), int(attempt), text)
    for attempt in range(args.max_restarts + 1):
        envs = []
        for rank in range(n):
            env = dict(os.environ)
            for name in TORCH_VARIABLES:
                env.pop(name, None)
            env.update({
                "RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
                "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(n), "ROLE_NAME": "default",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "TORCHELASTIC_RESTART_COUNT": str(attempt),
                "TORCHELASTIC_MAX_RESTARTS": str(args.max_restarts),
                "TORCHELASTIC_RUN_ID": args.run_id,
                "TORCHELASTIC_USE_AGENT_STORE": str(not args.no_agent_store),
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "1",
            })
            envs.append(env)
        workers = Workers()
        if kill is not None and kill[1] == attempt:
            def crash(w=workers, r=kill[0]):
                print(f"launchers.py: killing rank {r} (attempt {attempt})", flush=True)
                os.killpg(w.procs[r].pid, signal.SIGKILL)
            workers.watch = (kill[0], kill[2], crash)
        print(f"launchers.py torchrun: attempt {attempt}: {n} workers, "
              + (f"MASTER_PORT {port} left to the workers" if store is None
                 else f"agent store on 127.0.0.1:{port}"), flush=True)
        late = (0, args.late_rank0) if attempt > 0 and args.late_rank0 > 0 else None
        workers.start(cmd, envs, late)
        codes = workers.wait(deadline)
        if codes is None:
            workers.stop()
            print(f"launchers.py torchrun: timed out after {args.timeout} s", flush=True)
            return 124
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        workers.stop()
        if not failed:
            print("launchers.py torchrun: every worker succeeded", flush=True)
            return 0
        print(f"launchers.py torchrun: attempt {attempt}: worker(s) failed: "
              + ", ".join(f"rank {r} (status {c})" for r, c in failed), flush=True)
        if attempt == args.max_restarts:
            return failed[0][1] if failed[0][1] > 0 else 1
    del store
    return 1


def run_srun(args, cmd) -> int:
    n = args.ntasks
    port = free_port()
    envs = []
    for rank in range(n):
        env = dict(os.environ)
        for name in TORCH_VARIABLES:
            env.pop(name, None)
        env.update({
            "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": str(n), "SLURM_STEP_NUM_TASKS": str(n), "SLURM_LOCALID": str(rank),
            "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_TASKS_PER_NODE": str(n),
            "SLURM_STEP_TASKS_PER_NODE": str(n), "SLURM_JOB_NODELIST": "localhost",
        })
        if not args.no_master:
            env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        envs.append(env)
    workers = Workers()
    workers.start(cmd, envs)
    codes = workers.wait(time.monotonic() + args.timeout)
    workers.stop()
    if codes is None:
        print(f"launchers.py srun: timed out after {args.timeout} s", flush=True)
        return 124
    failed = [c for c in codes if c not in (None, 0)]
    return (failed[0] if failed[0] > 0 else 1) if failed else 0


def main(argv) -> int:
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    if "--" not in argv:
        print("usage: launchers.py torchrun|srun [options] -- CMD ...", file=sys.stderr)
        return 2
    split = argv.index("--")
    own, cmd = argv[:split], argv[split + 1:]
    p = argparse.ArgumentParser(prog="launchers.py")
    sub = p.add_subparsers(dest="launcher", required=True)
    t = sub.add_parser("torchrun")
    t.add_argument("--nproc-per-node", type=int, default=2)
    t.add_argument("--max-restarts", type=int, default=0)
    t.add_argument("--kill", default=None, metavar="RANK:ATTEMPT:REGEX")
    t.add_argument("--late-rank0", type=float, default=0, metavar="SECONDS",
                   help="on a restart, start rank 0 this long after the others (they look for "
                        "the rendezvous before rank 0 announces it)")
    t.add_argument("--master-port", type=int, default=0)
    t.add_argument("--no-agent-store", action="store_true",
                   help="torch < 2.5's c10d rendezvous: no store on MASTER_PORT, "
                        "TORCHELASTIC_USE_AGENT_STORE=False")
    t.add_argument("--run-id", default="strata-test")
    t.add_argument("--timeout", type=float, default=240)
    s = sub.add_parser("srun")
    s.add_argument("-n", "--ntasks", type=int, default=2)
    s.add_argument("--no-master", action="store_true")
    s.add_argument("--timeout", type=float, default=240)
    args = p.parse_args(own)
    if not cmd:
        p.error("no command after --")
    return run_torchrun(args, cmd) if args.launcher == "torchrun" else run_srun(args, cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
