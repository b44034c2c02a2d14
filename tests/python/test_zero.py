"""strata.Communicator and strata.ZeroEngine in one process (a job of one rank): the engine
steps as strata.OffloadOptimizer does, bitwise, at stages 1, 2 and 3; checkpoints, views,
stage 3's gathered parameters and fetching, accounting and errors.
Several ranks: zero_ranks.py (CTest python.zero_ranks_2, under strata-run)."""

import numpy as np
import pytest
import torch

import strata
from conftest import free_port, solo_communicator


def test_communicator_alone(runtime):
    comm = solo_communicator(runtime)
    assert (comm.rank, comm.size, comm.backend) == (0, 1, "gloo")
    assert comm.runtime is runtime
    assert "gloo" in repr(comm)
    stats = comm.stats()
    assert stats["total_bytes"] == 0
    assert set(stats) >= {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier"}
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = comm.all_reduce(x, op="sum")
    assert got.shape == (2, 3) and got.dtype == np.float32
    np.testing.assert_array_equal(got, x)
    assert got is not x
    np.testing.assert_array_equal(comm.all_reduce(np.array([3, -1]), op="max"), [3, -1])
    got = comm.broadcast(x)
    np.testing.assert_array_equal(got, x)
    assert got is not x and got.shape == (2, 3)
    comm.barrier()
    stats = comm.stats()
    assert stats["all_reduce"]["calls"] == 2 and stats["barrier"]["calls"] == 1
    assert stats["broadcast"]["calls"] == 1
    assert stats["all_reduce"]["bytes"] == x.nbytes + 16


def test_communicator_from_the_environment_without_launch_variables(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    comm = strata.Communicator.from_environment()  # no runtime: host buffers only
    assert (comm.rank, comm.size) == (0, 1)
    assert comm.runtime is None


def test_communicator_errors(runtime):
    with pytest.raises(ValueError, match=r"RANK"):
        strata.Communicator.from_environment(runtime, rank=2, world_size=2,
                                             master_port=free_port())
    with pytest.raises(ValueError, match=r"STRATA_COMM_TIMEOUT='soon'"):
        strata.Communicator.from_environment(runtime, rank=None, world_size=None,
                                             master_port=free_port(), comm_timeout="soon")
    comm = solo_communicator(runtime)
    with pytest.raises(ValueError, match=r"'prod' is not a reduction"):
        comm.all_reduce(np.zeros(2, np.float32), op="prod")
    with pytest.raises(ValueError, match=r"complex64 is not one the communicator reduces"):
        comm.all_reduce(np.zeros(2, np.complex64))
    with pytest.raises(ValueError, match=r"broadcast: root 1 is not a rank of this job \(0..0\)"):
        comm.broadcast(np.zeros(2, np.float32), root=1)


def model_params():
    rng = np.random.default_rng(5)
    return [("layer.weight", (3, 5), rng.standard_normal((3, 5)).astype(np.float32)),
            ("layer.bias", 7, torch.linspace(-1, 1, 7)),  # torch tensors are accepted too
            ("scale", (), None)]                          # zeros


HYPER = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)


def tiny_engine(runtime, comm, **options):
    # Stage 3: the scalar (below 8 bytes) stays whole, the others are partitioned.
    kwargs = dict(stage=2, param_dtype="float32", grad_dtype="float32", bucket_bytes=64,
                  alignment=4, param_home="cpu", persist_below_bytes=8, **HYPER)
    kwargs.update(options)
    return strata.ZeroEngine(runtime, comm, model_params(), **kwargs)


def reference_optimizer(runtime, param_dtype, state_home="cpu"):
    """OffloadOptimizer over one tensor per parameter, initialised as the engine."""
    opt = strata.OffloadOptimizer(runtime, state_home=state_home, **HYPER)
    entries = []
    for name, shape, initial in model_params():
        n = int(np.prod(shape))
        p = runtime.create("ref." + name, (n,), param_dtype, home="cpu")
        g = runtime.create("ref." + name + ".grad", (n,), "float32", home="cpu")
        master = np.zeros(n, np.float32) if initial is None else np.asarray(initial, np.float32)
        entries.append((opt.add_param(name, p, g, initial_master=master.reshape(-1)), p, g))
    return opt, entries


def gradient(p, step, micro, count):
    # Multiples of 1/64 below 8: exact in float32, float16 and bfloat16 alike.
    i = np.arange(count)
    return (((13 * p + 5 * step + 3 * micro + i) % 31 - 15) / 64.0).astype(np.float32)


@pytest.mark.parametrize("stage,param_dtype,grad_dtype,accumulation,state_home", [
    (1, "float32", "float32", 1, "cpu"),
    (2, "float32", "float32", 2, "cpu"),
    (1, "float16", "float16", 2, "nvme"),
    (2, "bfloat16", "bfloat16", 1, "cpu"),
    (3, "float32", "float32", 2, "cpu"),
    (3, "float16", "float16", 1, "nvme"),
])
def test_zero_engine_steps_as_the_offload_optimizer(runtime, comm, stage, param_dtype,
                                                    grad_dtype, accumulation, state_home):
    engine = tiny_engine(runtime, comm, stage=stage, param_dtype=param_dtype,
                         grad_dtype=grad_dtype, accumulation_steps=accumulation,
                         state_home=state_home)
    assert engine.stage == stage and len(engine) == 3
    assert engine.params == ["layer.weight", "layer.bias", "scale"]
    opt, entries = reference_optimizer(runtime, param_dtype, state_home)
    for step in range(1, 4):
        for micro in range(accumulation):
            for p, (pid, _, g) in enumerate(entries):
                grad = gradient(p, step, micro, g.numel)
                engine.add_grad(p if micro else engine.params[p], grad)
                with g.acquire("cpu", "w") as view:
                    torch.from_dlpack(view).copy_(torch.from_numpy(grad))
                opt.grad_ready(pid)  # landings sum, as the engine's micro-steps do
        got = engine.step()
        want = opt.step()
        assert got["step"] == want["step"] == step and not got["skipped"]
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-6)
        assert set(got) == set(want)
        for p, (pid, tensor, _) in enumerate(entries):
            name = engine.params[p]
            for mine, theirs in zip(engine.read_state(name), opt.read_state(pid)):
                assert mine.shape == engine.param_info(name)["shape"]
                np.testing.assert_array_equal(mine.reshape(-1), theirs)
            with tensor.acquire("cpu") as view:
                expected = torch.from_dlpack(view).float().numpy()
            np.testing.assert_array_equal(engine.read_param(name).reshape(-1), expected)
    assert engine.step_count == 3
    assert engine.stats()["steps"] == 3


def test_zero_engine_checkpoint_round_trip(runtime, comm, tmp_path):
    engine = tiny_engine(runtime, comm)

    def train(step):
        for p, name in enumerate(engine.params):
            engine.add_grad(name, gradient(p, step, 0, engine.param_info(name)["count"]))
        return engine.step()

    train(1)
    engine.save(tmp_path / "ckpt")  # os.PathLike
    train(2)
    after = [engine.read_param(name) for name in engine.params]
    engine.load(str(tmp_path / "ckpt"))
    assert engine.step_count == 1
    engine.add_grad("layer.weight", np.full((3, 5), 100.0, np.float32))  # dropped by zero_grad
    engine.zero_grad()
    assert train(2)["step"] == 2
    for name, value in zip(engine.params, after):
        np.testing.assert_array_equal(engine.read_param(name), value)


def test_zero_engine_parameter_views(runtime, comm):
    engine = tiny_engine(runtime, comm, param_dtype="bfloat16", param_home="gpu")
    with engine.acquire_param("layer.weight", "gpu") as view:
        assert view.shape == (3, 5) and view.dtype == "bfloat16"
        t = torch.from_dlpack(view)
        assert t.dtype == torch.bfloat16 and t.shape == (3, 5)
        np.testing.assert_array_equal(t.float().numpy(), engine.read_param("layer.weight"))
        with pytest.raises(strata.FailedPreconditionError, match=r"is a ZeroEngine parameter"):
            view.tensor.acquire("cpu")
        with pytest.raises(strata.FailedPreconditionError, match=r"is a ZeroEngine parameter"):
            view.tensor.destroy()
        del t
    assert view.released
    # Writes through a view reach the model's copy (the master keeps its own).
    with engine.acquire_param(1, "cpu", "w") as view:
        torch.from_dlpack(view).fill_(0.5)
    np.testing.assert_array_equal(engine.read_param("layer.bias"), np.full(7, 0.5, np.float32))
    initial = np.asarray(model_params()[1][2], np.float32)
    np.testing.assert_array_equal(engine.read_state("layer.bias")[0], initial)


def test_zero_engine_accounting(runtime, comm):
    engine = tiny_engine(runtime, comm)
    layout = engine.layout()
    assert layout["ranks"] == 1 and layout["alignment"] == 4
    assert layout["elements"] == 15 + 7 + 1
    assert layout["groups"] >= 2  # 16 gradients a group
    assert layout["padded_elements"] % 4 == 0 and layout["shard_elements"] == layout[
        "padded_elements"]
    memory = engine.memory()
    assert set(memory) == {"params", "grads", "optimizer_states", "buckets", "model_states",
                           "gathered", "retiring"}
    assert memory["gathered"] == 0 and memory["retiring"] == 0  # stage 3 only
    assert set(memory["params"]) == {"gpu", "cpu", "nvme"}
    assert memory["params"]["cpu"] >= 4 * layout["padded_elements"]
    assert memory["params"]["gpu"] == 0
    assert memory["optimizer_states"]["cpu"] >= 12 * layout["shard_elements"]
    assert memory["model_states"] == sum(
        sum(memory[kind].values()) for kind in ("params", "grads", "optimizer_states"))
    for p, name in enumerate(engine.params):
        engine.add_grad(name, gradient(p, 1, 0, engine.param_info(name)["count"]))
    engine.step()
    stats = engine.stats()
    assert stats["steps"] == 1 and stats["micro_steps"] == 0
    assert stats["reduce_scatters"] > 0 and stats["all_gathers"] > 0
    for key in ("last_step_comm_bytes", "last_step_ns", "last_step_wait_ns",
                "last_optimizer_ns", "last_gather_ns"):
        assert key in stats
    assert engine.loss_scale == 1.0
    assert engine.runtime is runtime and engine.communicator is comm


def test_zero_engine_errors(runtime, comm):
    engine = tiny_engine(runtime, comm)
    with pytest.raises(KeyError, match=r"nope"):
        engine.find("nope")
    with pytest.raises(KeyError):
        engine.read_param("nope")
    with pytest.raises(ValueError, match=r"parameter id 9 is not a parameter of this engine"):
        engine.add_grad(9, np.zeros(1, np.float32))
    with pytest.raises(ValueError, match=r"not a float"):
        engine.read_param(1.5)
    with pytest.raises(ValueError, match=r"add_grad: parameter 'layer.bias': gradient: got a "
                                         r"float32 numpy.ndarray of 6 elements; need float32 "
                                         r"with 7 elements \(the parameter's element count\)"):
        engine.add_grad("layer.bias", np.zeros(6, np.float32))
    with pytest.raises(ValueError, match=r"'tape' is not a tier"):
        engine.acquire_param(0, "tape")
    bad_params = [
        (["w"], r"params\[0\] is a str"),
        ([("w",)], r"params\[0\] has 1 items"),
        ([("w", 4, np.zeros(3, np.float32))],
         r"params\[0\] \('w'\) initial: got a float32 numpy.ndarray of 3 elements; need float32 "
         r"with 4 elements \(the shape's element count\)"),
    ]
    for params, message in bad_params:
        with pytest.raises(ValueError, match=message):
            strata.ZeroEngine(runtime, comm, params)
    bad_options = [
        (dict(param_dtype="int8"), r"ZeroOptions.param_dtype='int8': use float32, float16 or"),
        (dict(grad_dtype="float64"), r"ZeroOptions.grad_dtype='float64'"),
        (dict(bucket_bytes="12XB"), r"bucket_bytes='12XB' is not a size"),
        (dict(bucket_bytes=0), r"bucket_bytes=0: a positive byte count"),
        (dict(state_home="tape"), r"OffloadOptimizerOptions.state_home='tape': use 'cpu' or"),
        (dict(state_home="gpu"), r"state_home='gpu': use 'cpu' or 'nvme' \(the optimizer states"),
        (dict(param_home="tape"), r"ZeroOptions.param_home='tape': use 'gpu', 'cpu' or 'nvme'"),
        (dict(param_home="nvme"), r"param_home is the NVMe tier; at stages 1 and 2"),
        (dict(groups=[{"lr": 0.1, "bogus": 1}]), r"'bogus' is not a group setting"),
        (dict(stage=4), r"ZeroOptions.stage=4: use 1 to 3"),
        (dict(prefetch_bytes=-1), r"prefetch_bytes=-1: a byte count >= 0"),
        (dict(max_live_bytes=0), r"max_live_bytes=0: a positive byte count"),
        (dict(reuse_window_bytes="lots"), r"reuse_window_bytes='lots' is not a size"),
        (dict(alignment=0), r"alignment"),
    ]
    for options, message in bad_options:
        with pytest.raises(ValueError, match=message):
            tiny_engine(runtime, comm, **options)
    other = strata.Runtime(backend="host", gpu_bytes="8MiB", cpu_bytes="8MiB", nvme_paths=None)
    with pytest.raises(ValueError, match=r"the Communicator was created with another Runtime"):
        tiny_engine(other, comm)
    # Groups select their hyper-parameters (another runtime: one engine per runtime, whose
    # tensors are named zero.*).
    grouped = strata.ZeroEngine(other, solo_communicator(other),
                                [("a", 4, np.ones(4, np.float32)),
                                 ("b", 4, np.ones(4, np.float32), 1)],
                                param_dtype="float32", grad_dtype="float32", param_home="cpu",
                                groups=[{}, {"lr": 0.5}], lr=0.1)
    assert grouped.param_info("b")["group"] == 1
    grouped.add_grad("a", np.ones(4, np.float32))
    grouped.add_grad("b", np.ones(4, np.float32))
    grouped.step()
    # First Adam step: lr × sign(gradient).
    np.testing.assert_allclose(grouped.read_param("a"), 0.9, rtol=1e-5)
    np.testing.assert_allclose(grouped.read_param("b"), 0.5, rtol=1e-5)
    # After all that the first engine still trains.
    for p, name in enumerate(engine.params):
        engine.add_grad(name, gradient(p, 1, 0, engine.param_info(name)["count"]))
    assert engine.step()["step"] == 1


@pytest.mark.parametrize("param_home", ["gpu", "cpu", "nvme"])
def test_zero_stage3_gathers_parameters(runtime, comm, param_home):
    engine = tiny_engine(runtime, comm, stage=3, param_home=param_home, prefetch_bytes=64,
                         max_live_bytes=3 * 64, reuse_window_bytes=64)
    assert engine.stage == 3
    assert [engine.param_info(n)["partitioned"] for n in engine.params] == [True, True, False]
    assert engine.memory()["params"][param_home] > 0
    initial = [np.asarray(v, np.float32).reshape(-1) if v is not None else np.zeros(1, np.float32)
               for _, _, v in model_params()]
    # Gathered whole, read-only: a torch view of the parameter's shape and dtype.
    with engine.acquire_param("layer.weight", "gpu") as view:
        assert view.shape == (3, 5) and view.dtype == "float32" and view.mode == "r"
        t = torch.from_dlpack(view)
        np.testing.assert_array_equal(t.reshape(-1).numpy(), initial[0])
        assert engine.memory()["gathered"] > 0
        with pytest.raises(strata.FailedPreconditionError, match=r"is a ZeroEngine parameter"):
            view.tensor.acquire("cpu")
        del t
    assert view.released
    with pytest.raises(ValueError, match=r"parameter 'layer.bias' is partitioned \(stage 3\): "
                                         r"its gathered copy is read-only"):
        engine.acquire_param("layer.bias", "gpu", "w")
    np.testing.assert_array_equal(engine.read_param("layer.bias"), initial[1])

    def train(step):
        # A trainer's step: forward uses every parameter; backward each again in reverse, its
        # gradient added through a writable view of the engine's buffer.
        for name in engine.params:
            with engine.acquire_param(name, "gpu"):
                pass
        for p in reversed(range(len(engine))):
            with engine.acquire_param(p, "gpu"):
                with engine.acquire_grad(p, "gpu") as buffer:
                    assert buffer.mode == "w" and buffer.dtype == "float32"
                    g = torch.from_dlpack(buffer)
                    g.add_(torch.from_numpy(gradient(p, step, 0, g.numel())).reshape(g.shape))
                    del g
        return engine.step()

    held = engine.acquire_param("layer.bias", "cpu")
    with pytest.raises(strata.FailedPreconditionError, match=r"layer.bias are still acquired"):
        engine.step()
    held.release()
    assert train(1)["step"] == 1
    first = engine.stats()
    assert train(2)["step"] == 2  # along the order step 1 recorded: prefetched
    stats = engine.stats()
    assert stats["fetches"] > first["fetches"]
    assert stats["gathers_prefetched"] > first["gathers_prefetched"]
    assert 0 < stats["gathered_peak_bytes"] <= 3 * 64
    assert stats["order_changes"] == first["order_changes"]
    for key in ("gathers_on_demand", "prefetch_late", "reuses", "gathers_dropped_unused",
                "gathered_bytes", "retiring_bytes", "fetch_wait_ns"):
        assert key in stats
    # An order given up front (backward only); the next step departs from it and realigns.
    engine.set_fetch_order(["scale", 1, "layer.weight"])
    assert train(3)["step"] == 3
    assert engine.stats()["order_changes"] > first["order_changes"]

    # Stage 3 steps as stage 2 does: bitwise the same masters (another runtime: one engine
    # per runtime).
    other = strata.Runtime(backend="host", gpu_bytes="8MiB", cpu_bytes="8MiB", nvme_paths=None)
    two = tiny_engine(other, solo_communicator(other), stage=2)
    for step in range(1, 4):
        for p in reversed(range(len(two))):
            two.add_grad(p, gradient(p, step, 0, two.param_info(p)["count"]))
        two.step()
    for name in engine.params:
        for mine, theirs in zip(engine.read_state(name), two.read_state(name)):
            np.testing.assert_array_equal(mine, theirs)
        np.testing.assert_array_equal(engine.read_param(name), two.read_param(name))


def test_zero_stage3_errors(runtime, comm):
    engine = tiny_engine(runtime, comm, stage=2)
    with pytest.raises(strata.FailedPreconditionError, match=r"only stage 3 fetches"):
        engine.set_fetch_order(["layer.weight"])
    with pytest.raises(KeyError, match=r"nope"):
        engine.set_fetch_order(["nope"])
    # acquire_grad's release is grad_ready: a second release is refused.
    grad = engine.acquire_grad("layer.bias")
    torch.from_dlpack(grad).add_(1.0)
    grad.release()
    with pytest.raises(strata.FailedPreconditionError, match=r"already released"):
        grad.release()


def test_zero_hpz_option_and_counters(runtime, comm):
    # hpZ (ZeroOptions.hpz_node_ranks) is multi-rank (zero_ranks_test, multinode.zero_hpz); alone
    # the option is read back, a node size that does not divide the ranks raises, one node of
    # one rank leaves it off, and the stats count every gather over every rank.
    assert strata.ZeroOptions().hpz_node_ranks == 0
    assert strata.ZeroOptions(hpz_node_ranks=8).hpz_node_ranks == 8
    assert "hpz_node_ranks=8" in repr(strata.ZeroOptions(hpz_node_ranks=8))
    with pytest.raises(ValueError, match=r"hpz_node_ranks"):
        strata.ZeroOptions(hpz_node_ranks=-1)
    with pytest.raises(strata.InvalidArgumentError, match=r"hpz_node_ranks = 2 does not divide"):
        tiny_engine(runtime, comm, stage=3, hpz_node_ranks=2)
    engine = tiny_engine(runtime, comm, stage=3, hpz_node_ranks=1)
    engine.acquire_param("layer.weight").release()
    stats = engine.stats()
    assert stats["global_gather_bytes"] > 0 and stats["node_gather_bytes"] == 0


def test_acquire_for_a_consumer_stream_is_ordered_by_the_engine(runtime, comm):
    # acquire_param/acquire_grad(stream=s): the engine orders s after its gather (or the
    # bucket's previous reduce-scatter) itself, no event, no host wait. Every other stream is
    # held: a read on s that were not ordered would run at once and see no gathered values.
    from strata._strata import testing
    engine = tiny_engine(runtime, comm, stage=3, param_home="gpu", reuse_window_bytes=0,
                         prefetch_bytes=0)
    want = np.asarray(model_params()[0][2], np.float32).reshape(-1)
    s = runtime.create_stream()
    out = np.zeros(want.size, np.float32)
    with testing.hold(runtime, exempt=[s]) as gate:
        a = engine.acquire_param("layer.weight", "gpu", stream=s)  # returns: the gather is held
        gate.wait_until_held(1)
        assert a.__dlpack__(stream=s) is not None  # no event to wait on: s is ordered already
        testing.copy_async(s, out.ctypes.data, a.address, out.nbytes, "d2h")
        g = engine.acquire_grad("layer.weight", "gpu", stream=s)
        assert not out.any()  # s waits for the held gather
    s.synchronize()
    np.testing.assert_array_equal(out, want)
    g.release()  # grad_ready after s's work (the stream given at acquire)
    a.release()
    for name in ("layer.bias", "scale"):
        engine.add_grad(name, np.zeros(engine.param_info(name)["count"], np.float32))
    engine.step()
    with pytest.raises(strata.InvalidArgumentError, match=r"acquire_param: stream=-1 cannot"):
        engine.acquire_param("layer.weight", "gpu", stream=-1)
