#!/usr/bin/env python3
"""Multi-node jobs on machines made on this one (cluster.py): one strata-run per node, each in
its own network namespace with its own address and NVMe directory.

  multinode_test.py zero NODES --strata-run=P --trainer=P
      ZeRO stages 1, 2 and 3 over NODES nodes x 2 ranks (examples/cpp_trainer --zero-stage): each
      run checks every rank's loss and weights against one in-memory run on the whole batch and
      prints PASS.
  multinode_test.py fault KIND --strata-run=P --zero-rank=P
      2 nodes x 2 ranks train (zero_rank save-then-train), save a checkpoint, and keep training;
      then node 1 suffers KIND (link-down, kill, drop, slow; restart: killed, and its strata-run
      started again with the same --node-rank, which must be refused at once with what to do).
      Node 0's launcher must exit non-zero within STRATA_COMM_TIMEOUT (plus a margin) with the
      Communicator's error naming the operation and the rank(s) at fault, no process may be left
      in any namespace, and the checkpoint must load, bitwise equal, on the surviving node's 2
      ranks.
  multinode_test.py hpz --strata-run=P --trainer=P
      ZeRO stage 3 over 2 nodes x 2 ranks without and with hpZ (cpp_trainer --hpz: nodes of
      LOCAL_WORLD_SIZE ranks): the same losses and weights bit for bit; with hpZ the gathers
      that stay inside a node are the ones no longer made over every rank (the engine's
      counters), and fewer bytes cross node 1's link (its veth's counters, reported).
  multinode_test.py bandwidth [MBIT] --strata-run=P --bench=P
      offload-bench --workload=collective over 2 nodes x 1 rank with a tbf rate of MBIT (default
      400) Mbit/s on node 1's link: the bus bandwidth of each 16 MiB collective against that rate
      (reported; only a figure above the rate fails).

Exit 0 on success, 77 (skip, with the reason) where namespaces cannot be made, 1 on failure.
"""

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

LOCAL = 2  # ranks per node
PORT = 29500  # the nodes' rendezvous: node 0's namespace is the test's own, so it is free
TIMEOUT_S = 4  # STRATA_COMM_TIMEOUT for the fault cases

TRAINER_ENV = {
    "STRATA_BACKEND": "host",
    "STRATA_GPU_BYTES": "2MiB",
    "STRATA_CPU_BYTES": "64MiB",
    "STRATA_NVME_BYTES": "64MiB",
    "STRATA_STAGING_BYTES": "8MiB",
    "STRATA_COMM_BACKEND": "gloo",
    "STRATA_COMM_TIMEOUT": "60s",
}


def fail(message, outputs=()):
    print(f"FAIL: {message}")
    for name, text in outputs:
        print(f"--- {name}:\n{text}")
    sys.exit(1)


def node_argv(c, k, run, program, local=LOCAL, extra=()):
    """Node k's strata-run command line."""
    return [run, f"--nnodes={c.n}", f"--node-rank={k}", f"--master-addr={c.addr(0)}",
            f"--port={PORT}", f"-n{local}", *extra, *program]


def launch(c, run, program, env, local=LOCAL, extra=()):
    """One strata-run per node; returns the processes."""
    return [c.start(k, node_argv(c, k, run, program, local, extra), env=env) for k in range(c.n)]


def finish(procs, limit, since=None):
    """Waits for every launcher (at most `limit` seconds in all, then kills what is left);
    returns [(rc, output, seconds from `since` to its end)] (rc None: killed at the limit)."""
    since = time.monotonic() if since is None else since
    deadline = time.monotonic() + limit
    ended = {}
    while len(ended) < len(procs) and time.monotonic() < deadline:
        for i, p in enumerate(procs):
            if i not in ended and p.poll() is not None:
                ended[i] = time.monotonic() - since
        time.sleep(0.02)
    results = []
    for i, p in enumerate(procs):
        if i not in ended:
            p.kill()
        out, _ = p.communicate()
        results.append((p.returncode if i in ended else None, out, ended.get(i)))
    return results


def base_env(extra):
    env = dict(os.environ)
    env.update(TRAINER_ENV)
    env.update(extra)
    return env


def case_zero(c, args):
    env = base_env({})
    for stage in (1, 2, 3):
        began = time.monotonic()
        program = [args.trainer, f"--zero-stage={stage}", "--states=cpu", "--steps=6",
                   "--max-loss=10"]
        results = finish(launch(c, args.strata_run, program, env), 120)
        outs = [(f"node {k}", out) for k, (_, out, _) in enumerate(results)]
        for k, (rc, out, _) in enumerate(results):
            if rc != 0:
                fail(f"stage {stage}: node {k}'s strata-run exited {rc}", outs)
            if "FAIL" in out:
                fail(f"stage {stage}: node {k} reported FAIL", outs)
        world = c.n * LOCAL
        if not re.search(rf"ZeRO stage {stage} on {world} rank\(s\)", results[0][1]) or \
                "\nPASS\n" not in "\n" + results[0][1]:
            fail(f"stage {stage}: rank 0 did not report a passing {world}-rank run", outs)
        if c.leftovers():
            fail(f"stage {stage}: processes left: {c.leftovers()}", outs)
        print(f"stage {stage}: {c.n} nodes x {LOCAL} ranks equal to one process "
              f"({time.monotonic() - began:.1f} s)")


def start_checkpointed(c, args, env):
    """The fault cases' job: 2 nodes x 2 ranks train (zero_rank save-then-train), save a
    checkpoint and keep training; returns (processes, checkpoint) once it is saved."""
    ckpt = os.path.join(c.nvme[0], "ckpt")
    procs = launch(c, args.strata_run, [args.zero_rank, "save-then-train", ckpt, "100000"], env,
                   extra=["--tag-output"])
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(ckpt, "expected.bin")):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            fail("the job did not save its checkpoint", [(f"node {k}", p.communicate()[0])
                                                         for k, p in enumerate(procs)])
        time.sleep(0.05)
    return procs, ckpt


def check_fault_end(c, kind, results):
    """Node 0's launcher failed with the Communicator's error naming the operation and node 1's
    ranks at fault with their host, and nothing is left: returns that error."""
    outs = [(f"node {k}", out) for k, (_, out, _) in enumerate(results)]
    for k, (rc, _, _) in enumerate(results):
        if rc is None:
            fail(f"{kind}: node {k}'s strata-run did not end within {TIMEOUT_S * 4 + 15} s", outs)
    rc0, out0, _ = results[0]
    if rc0 == 0:
        fail(f"{kind}: node 0's strata-run exited 0", outs)
    if kind not in ("kill", "restart") and results[1][0] == 0:
        fail(f"{kind}: node 1's strata-run exited 0", outs)
    # The Communicator's error: the operation and the rank(s) or node at fault.
    # The rank whose failure stopped node 0 (strata-run names it): its error is the job's.
    first = re.search(r"strata-run: node 0 of 2: rank (\d+) \(pid \d+\) exited with status 1",
                      out0)
    m = first and re.search(rf"\[rank {first.group(1)}\] zero_rank: (.*)", out0)
    if not m:
        fail(f"{kind}: node 0's first failing rank did not say why it failed", outs)
    message = m.group(1)
    # Node 1's ranks (2 and 3) are the ones at fault, named with their host. (On a slow link
    # one of them may time out and exit before the post-mortem: then it alone is named, as the
    # rank that died, and the other as silent.)
    at_fault = re.search(r"Rank\(s\) at fault: ([\d, ]+)\.", message)
    named = set(int(r) for r in at_fault.group(1).split(", ")) if at_fault else set()
    if not re.search(r"(all_gather|reduce_scatter|all_reduce|broadcast|barrier) #\d+", message) \
            or not named or not named <= {2, 3} or f"(on {c.addr(1)})" not in message:
        fail(f"{kind}: the error does not name the operation, node 1's ranks at fault and their "
             f"host: {message}", outs)
    left = c.leftovers()
    # The killed node has nothing left; the others must have stopped too.
    if left:
        fail(f"{kind}: processes left after the job: {left}", outs)
    return message


def check_loads_on_survivors(c, args, kind, ckpt):
    """The last checkpoint loads on the survivors' world size (node 0's 2 ranks), bitwise."""
    env = base_env({})
    p = c.start(0, [args.strata_run, "-n", str(LOCAL), "--master-addr", c.addr(0),
                    "--tag-output", args.zero_rank, "load-check", ckpt], env=env)
    (rc, out, _), = finish([p], 60)
    if rc != 0:
        fail(f"{kind}: the checkpoint did not load on {LOCAL} ranks", [("load", out)])
    print(f"{kind}: the checkpoint of 4 ranks loaded on the surviving {LOCAL}, bitwise equal")


def case_fault(c, args):
    kind = args.what
    if kind == "restart":
        return case_restart(c, args)
    env = base_env({"STRATA_COMM_TIMEOUT": f"{TIMEOUT_S}s"})
    procs, ckpt = start_checkpointed(c, args, env)
    # The checkpoint is written, training goes on: then the fault.
    time.sleep(0.3)
    injected = time.monotonic()
    {"link-down": lambda: c.link_down(1), "kill": lambda: c.kill(1), "drop": lambda: c.drop(1),
     "slow": lambda: c.rate(1, "4kbit", burst="2kb")}[kind]()
    results = finish(procs, TIMEOUT_S * 4 + 15, since=injected)
    message = check_fault_end(c, kind, results)
    print(f"{kind}: node 0's strata-run exited {results[0][0]} {results[0][2]:.1f} s after the "
          f"fault, node 1's {results[1][0]} after {results[1][2]:.1f} s "
          f"(STRATA_COMM_TIMEOUT={TIMEOUT_S}s): {message}")
    check_loads_on_survivors(c, args, kind, ckpt)


def case_restart(c, args):
    """Node 1 dies (killed) and its strata-run is started again with the same --node-rank while
    node 0's job still runs: the new launcher is refused at once (a node cannot rejoin a running
    job), node 0's job ends as on a kill, and the checkpoint loads on the survivors.

    Node 0's ranks are stopped (SIGSTOP) from just before the kill until the new launcher has
    exited: the kill's connection resets would otherwise end node 0's job within 0.1 s, before a
    new launcher could reach its rendezvous. (On a cluster, a restarted machine comes back while
    the others still run or wait out STRATA_COMM_TIMEOUT.) Node 0's launcher, which serves the
    nodes' rendezvous, runs on."""
    kind = "restart"
    env = base_env({"STRATA_COMM_TIMEOUT": f"{TIMEOUT_S}s"})
    procs, ckpt = start_checkpointed(c, args, env)
    time.sleep(0.3)
    launcher0 = procs[0].pid
    if launcher0 not in c.pids(0):
        fail(f"{kind}: node 0's strata-run (pid {launcher0}) is not in its namespace")
    ranks0 = [pid for pid in c.pids(0) if pid != launcher0]
    for pid in ranks0:
        os.kill(pid, signal.SIGSTOP)
    try:
        injected = time.monotonic()
        c.kill(1)
        # The same command as node 1's first launcher; a long STRATA_COMM_TIMEOUT, so that a
        # launcher that waited instead of being refused would show as not ended within 30 s.
        again = c.start(1, node_argv(c, 1, args.strata_run,
                                     [args.zero_rank, "save-then-train", ckpt, "100000"],
                                     extra=["--tag-output"]),
                        env=dict(env, STRATA_COMM_TIMEOUT="60s"))
        (rc, out, took), = finish([again], 30)
    finally:
        for pid in ranks0:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    refused = re.search(
        rf"^strata-run: node 1 of 2: the job whose nodes met at {re.escape(c.addr(0))}:{PORT} is "
        rf"already running with node 1 \(which joined from {re.escape(c.addr(1))}\): a node "
        rf"cannot rejoin a running job \(strata has no elastic restart\)\. .*restart every "
        rf"node's strata-run, loading the last checkpoint \(resharding allows fewer nodes\)$",
        out, re.M)
    if rc is None or rc == 0 or not refused or "[rank " in out:
        procs_out = [(f"node {k}", p.communicate()[0]) if p.poll() is not None else
                     (f"node {k}", "(running)") for k, p in enumerate(procs)]
        fail(f"{kind}: node 1's new strata-run exited {rc} (None: not within 30 s); it must "
             f"exit non-zero at once, start no rank, and say that the node cannot rejoin",
             [("node 1 again", out), *procs_out])
    results = finish(procs, TIMEOUT_S * 4 + 15, since=injected)
    message = check_fault_end(c, kind, results)
    print(f"{kind}: node 1's new strata-run exited {rc} after {took:.2f} s: "
          f"{refused.group(0)[len('strata-run: '):]}")
    print(f"{kind}: node 0's strata-run exited {results[0][0]} {results[0][2]:.1f} s after the "
          f"kill (STRATA_COMM_TIMEOUT={TIMEOUT_S}s): {message}")
    check_loads_on_survivors(c, args, kind, ckpt)


def link_bytes(c, k):
    """Bytes through node k's veth so far, both ways (its traffic with the other nodes)."""
    total = 0
    for way in ("rx_bytes", "tx_bytes"):
        with open(f"/sys/class/net/{c.host_end(k)}/statistics/{way}") as f:
            total += int(f.read())
    return total


def case_hpz(c, args):
    env = base_env({})
    runs = {}
    with tempfile.TemporaryDirectory(prefix="strata-hpz-") as tmp:
        for hpz in (False, True):
            report = os.path.join(tmp, f"hpz{int(hpz)}.json")
            program = [args.trainer, "--zero-stage=3", "--states=cpu", "--steps=4",
                       "--max-loss=10", f"--json={report}", *(["--hpz"] if hpz else [])]
            before = link_bytes(c, 1)
            results = finish(launch(c, args.strata_run, program, env), 120)
            crossed = link_bytes(c, 1) - before
            outs = [(f"node {k}", out) for k, (_, out, _) in enumerate(results)]
            for k, (rc, out, _) in enumerate(results):
                if rc != 0 or "FAIL" in out:
                    fail(f"hpZ {hpz}: node {k}'s strata-run exited {rc}", outs)
            with open(report) as f:
                runs[hpz] = (json.load(f), crossed, outs)
    (plain, plain_link, _), (hier, hier_link, outs) = runs[False], runs[True]
    if hier["hpz_node_ranks"] != LOCAL or plain["hpz_node_ranks"] != 0:
        fail(f"hpz_node_ranks {plain['hpz_node_ranks']} / {hier['hpz_node_ranks']}, "
             f"expected 0 / {LOCAL}", outs)
    if plain["losses"] != hier["losses"] or plain["weights_checksum"] != hier["weights_checksum"]:
        fail(f"hpZ changed the results: losses {plain['losses']} / {hier['losses']}, weights "
             f"{plain['weights_checksum']} / {hier['weights_checksum']}", outs)
    g0, g1, n1 = (plain["fetch"]["global_gather_bytes"], hier["fetch"]["global_gather_bytes"],
                  hier["fetch"]["node_gather_bytes"])
    if plain["fetch"]["node_gather_bytes"] != 0 or n1 == 0 or g1 + n1 != g0:
        fail(f"gathered bytes: without hpZ {g0} global, with it {g1} global + {n1} in the node "
             f"(the two must add up to {g0})", outs)
    world = c.n * LOCAL
    print(f"hpZ over {c.n} nodes x {LOCAL} ranks: the same losses and weights; rank 0 gathered "
          f"{g0} B over every rank without hpZ, {g1} B + {n1} B within its node with it, so "
          f"{g0 * (world - LOCAL) // world} B vs {g1 * (world - LOCAL) // world} B from the other "
          f"node; node 1's link carried {plain_link} B vs {hier_link} B "
          f"({hier_link / plain_link:.2f})")
    if hier_link >= plain_link:
        fail("hpZ did not lower the bytes across node 1's link", outs)


def case_bandwidth(c, args):
    """The figure is reported, not asserted (tests never assert a speed: the machine may be
    busy); what is asserted is physics: no bus bandwidth above the link's rate (a tbf burst of
    128 KiB allows a few percent over it at 16 MiB)."""
    rate_mbit = int(args.what or 400)
    # A short queue (5 ms): two opposite bulk flows through a long FIFO queue delay each other's
    # ACKs, which halves all_gather's figure more often (measured: raw Gloo shows it too).
    c.rate(1, f"{rate_mbit}mbit", burst="128kb", latency="5ms")
    env = base_env({})
    program = [args.bench, "--workload=collective", "--tensor-bytes=16MiB", "--bytes=16MiB",
               "--repeat=1", "--json=-"]
    results = finish(launch(c, args.strata_run, program, env, local=1), 120)
    outs = [(f"node {k}", out) for k, (_, out, _) in enumerate(results)]
    if any(rc != 0 for rc, _, _ in results):
        fail("the collective workload failed", outs)
    text = results[0][1]
    doc = json.loads(text[text.index("{"):text.rindex("}") + 1])
    limit = rate_mbit * 1e6 / 8 / 1e9
    rows = doc["collective"]["rows"]
    if sorted(r["op"] for r in rows) != ["all_gather", "all_reduce", "broadcast", "reduce_scatter"]:
        fail("the workload did not time the four operations", outs)
    for row in rows:
        share = row["busbw_gbps"] / limit
        base = row["baseline_busbw_gbps"] / limit
        print(f"{row['op']} {row['bytes'] >> 20} MiB over 2 nodes: bus bandwidth "
              f"{row['busbw_gbps'] * 1e3:.1f} MB/s = {share:.2f} of the {rate_mbit} Mbit/s link "
              f"(Gloo alone: {base:.2f})")
        if share > 1.1 or base > 1.1:
            fail(f"{row['op']}: a bus bandwidth above the link's rate: the tbf limit did not hold",
                 outs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=["zero", "fault", "hpz", "bandwidth"])
    parser.add_argument("what", nargs="?")
    parser.add_argument("--strata-run", required=True)
    parser.add_argument("--trainer")
    parser.add_argument("--zero-rank")
    parser.add_argument("--bench")
    args = parser.parse_args()
    why = cluster.why_unsupported()
    if why:
        print(f"skipped: {why}")
        return cluster.SKIP
    nodes = int(args.what) if args.case == "zero" else 2
    began = time.monotonic()
    with cluster.Cluster(nodes) as c:
        {"zero": case_zero, "fault": case_fault, "hpz": case_hpz,
         "bandwidth": case_bandwidth}[args.case](c, args)
        left = c.leftovers()
    if left:
        fail(f"processes left: {left}")
    print(f"multinode {args.case} {args.what or ''}: ok ({time.monotonic() - began:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
