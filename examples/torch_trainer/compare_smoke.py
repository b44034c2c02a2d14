#!/usr/bin/env python3
"""compare_smoke: compare.py's first stage, seconds long, so that a GPU run that cannot work
stops before it spends its minutes, with a short diagnosis. On a GPU (each check bounded):

  strata+gloo    a tiny GPT through strata.torch.zero_shard (ZeRO-3, bf16, shards and states
                 in the CPU tier) on the GPU with the Gloo communicator: two steps against
                 torch's AdamW on the same GPU (fp32), losses within 2e-2
  strata+nccl    the same on the NCCL communicator (a job of one rank)
  engine         the engine's stream-ordered path on CUDA: tests/python/test_torch_zero_streams.py's
                 test_zero_shard_on_cuda (gathers, reduce-scatters and releases ordered on torch's
                 stream), where the source tree is at hand
  nccl-cases     the NCCL communicator's [cuda] cases (<build>/tests/comm_test "[cuda][comm]"),
                 where the build's test binaries are at hand

On the CPU (CI) the host half runs: strata+gloo on the host backend in fp32 against torch's AdamW
within 1e-5; the others are skipped, saying why (skipped is not passed).

    compare_smoke.py --device=cuda|cpu --json=FILE [--limit-s=20]

Writes {"ok", "seconds", "diagnosis", "checks": [{"name", "status": ok|failed|skipped,
"seconds", "detail"}]}; exit 0 when no check failed, 1 otherwise, 77 without torch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))  # the checkout: examples/torch_trainer/../..
sys.path.insert(0, HERE)

HYPER = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def build_dir():
    """The build whose Python module is imported (build/python/strata/...), or None (a pip
    install has no test binaries)."""
    import strata
    d = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(strata.__file__))))
    return d if os.path.isdir(os.path.join(d, "tests")) else None


def strata_vs_torch(device: str, comm_backend: str) -> str:
    """Two steps of a tiny GPT through zero_shard against torch's AdamW; the detail line."""
    import torch
    import gpt
    import strata
    import strata.torch as st

    cuda = device == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    c = gpt.GPTConfig(vocab=128, seq_len=32, d_model=64, heads=4, layers=2, tied=True)
    rt = strata.Runtime(backend="cuda" if cuda else "host", gpu_bytes="256MiB",
                        cpu_bytes="256MiB", staging_bytes="16MiB", nvme_paths=None)
    comm = strata.Communicator.from_environment(
        rt, rank=None, world_size=None, local_rank=None, master_addr="127.0.0.1",
        master_port=free_port(), comm_backend=comm_backend, comm_timeout="30s")
    if comm.backend != comm_backend:
        raise RuntimeError(f"asked for {comm_backend}, got {comm.backend}")
    on = torch.device("cuda", int(rt.config["device"])) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    model = st.zero_shard(
        gpt.GPT(c, device="meta"), comm, stage=3, units=(gpt.Block,),
        param_init=lambda name, shape: gpt.init_parameter(name, shape, c),
        mp_policy=st.MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype),
        offload_policy=st.PlacementPolicy(param_home="cpu", state_home="cpu"),
        fetch_policy=st.FetchPolicy(max_live_bytes="64MiB"),
        optimizer=st.ZeroAdamW(max_grad_norm=1.0, **HYPER))
    reference = gpt.materialize_in_pieces(gpt.GPT(c, device="meta"), on)
    opt = torch.optim.AdamW(reference.parameters(), **HYPER)
    tolerance = 2e-2 if cuda else 1e-5
    worst = 0.0
    try:
        for step in (1, 2):
            x, y = (t.to(on) for t in gpt.synthetic_batch(c, step, 4))
            loss = gpt.lm_loss(model, x, y)
            loss.backward()
            result = model.step()
            if result["skipped"]:
                raise RuntimeError(f"step {step} was skipped (a non-finite gradient)")
            want = gpt.lm_loss(reference, x, y)
            want.backward()
            torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            got, ref = float(loss.item()), float(want.item())
            rel = abs(got - ref) / max(abs(ref), 1e-12)
            worst = max(worst, rel)
            if not rel <= tolerance:
                raise RuntimeError(f"step {step}: loss {got:.6f} against torch's {ref:.6f} "
                                   f"(relative {rel:.3g} > {tolerance:g})")
        if cuda:
            torch.cuda.synchronize()
    finally:
        model.close()
    return (f"2 steps on {on} over {comm.backend}, {str(dtype).replace('torch.', '')}: within "
            f"{worst:.2g} of torch (tolerance {tolerance:g})")


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_process(cmd, limit: float, env=None) -> str:
    """Runs cmd within `limit` seconds; its last output line as the detail, or raises with its
    tail."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=limit, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0:
        tail = " | ".join(lines[-4:])
        raise RuntimeError(f"exit {proc.returncode}: {tail[-600:]}")
    return lines[-1].strip() if lines else "passed"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), required=True)
    p.add_argument("--json", required=True)
    p.add_argument("--limit-s", type=float, default=20.0,
                   help="the whole stage's limit (default 20 s)")
    p.add_argument("--fail", default=None, help=argparse.SUPPRESS)  # tests: a check that fails
    args = p.parse_args(argv)
    start = time.monotonic()
    try:
        import torch  # noqa: F401
    except ImportError:
        print("SKIP: torch is not installed", flush=True)
        return 77
    cuda = args.device == "cuda"
    checks = []

    def left() -> float:
        return args.limit_s - (time.monotonic() - start)

    def check(name, fn, skip_reason=None):
        t0 = time.monotonic()
        if skip_reason is None and left() < 1:
            skip_reason = f"no time left of the stage's {args.limit_s:g} s"
        if skip_reason is not None:
            checks.append({"name": name, "status": "skipped", "seconds": 0.0,
                           "detail": skip_reason})
        else:
            try:
                if args.fail == name:
                    raise RuntimeError("failed on purpose (--fail)")
                detail, status = fn(), "ok"
            except Exception as e:  # noqa: BLE001 - every failure is the diagnosis
                detail, status = f"{type(e).__name__}: {e}"[:800], "failed"
                traceback.print_exc()
            checks.append({"name": name, "status": status,
                           "seconds": round(time.monotonic() - t0, 2), "detail": detail})
        c = checks[-1]
        print(f"smoke: {c['status']:7} {name}: {c['detail']} ({c['seconds']} s)", flush=True)

    check("strata+gloo", lambda: strata_vs_torch(args.device, "gloo"))
    check("strata+nccl", lambda: strata_vs_torch(args.device, "nccl"),
          None if cuda else "needs a GPU (NCCL moves CUDA buffers)")
    streams = os.path.join(SOURCE, "tests", "python", "test_torch_zero_streams.py")
    check("engine", lambda: run_process(
              [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
               f"{streams}::test_zero_shard_on_cuda"], max(left(), 1)),
          None if cuda and os.path.exists(streams) else
          ("needs a GPU" if not cuda else f"{streams} is not here (a pip install)"))
    build = build_dir()
    comm_test = os.path.join(build, "tests", "comm_test") if build else None
    check("nccl-cases", lambda: run_process([comm_test, "[cuda][comm]"], max(left(), 1)),
          None if cuda and comm_test and os.path.exists(comm_test) else
          ("needs a GPU" if not cuda else "the build's test binaries are not here"))

    failed = [c for c in checks if c["status"] == "failed"]
    diagnosis = ""
    if failed:
        first = failed[0]
        hint = {"strata+gloo": "strata cannot train on this device at all: look at the "
                               "runtime, zero_shard or the GPU tier (see the error)",
                "strata+nccl": "look at the NCCL communicator (strata-info's NCCL lines say "
                               "where NCCL was searched and what was found)",
                "engine": "look at the engine's stream ordering on CUDA (gathers, "
                          "reduce-scatters, releases on torch's stream)",
                "nccl-cases": "look at strata's NCCL collectives"}[first["name"]]
        diagnosis = f"{first['name']} failed: {first['detail'][:300]}; {hint}"
    out = {"ok": not failed, "device": args.device, "seconds": round(time.monotonic() - start, 2),
           "limit_s": args.limit_s, "diagnosis": diagnosis, "checks": checks}
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"smoke: {'ok' if not failed else 'FAIL: ' + diagnosis} ({out['seconds']} s)",
          flush=True)
    sys.stdout.flush()
    os._exit(0 if not failed else 1)  # no teardown hang (NCCL, CUDA) after the verdict


if __name__ == "__main__":
    sys.exit(main())
