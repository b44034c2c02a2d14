"""strata.ZeroOptions (the C++ ZeroOptions bound field by field, bindings/python/zero_options.cc)
and strata.torch.zero_shard's policy objects (strata/zero_policy.py): defaults, nesting, the
error that names a bad field, what the engine is created with."""

import dataclasses
import warnings

import pytest
import torch
from torch import nn

import strata
import strata.torch as st
from conftest import solo_communicator
from strata import zero_policy


def test_zero_options_fields_and_nesting():
    o = strata.ZeroOptions()
    # The C++ defaults (zero_engine.h, offload_optimizer.h, cpu_adam.h).
    assert (o.stage, o.param_dtype, o.grad_dtype, o.param_home) == (2, "float16", "float16", "gpu")
    assert (o.bucket_bytes, o.gradient_buckets, o.alignment) == (32 << 20, 2, 64)
    assert (o.persist_below_bytes, o.prefetch_bytes, o.max_live_bytes,
            o.reuse_window_bytes, o.accumulation_steps) == (128 << 10, 64 << 20, None,
                                                            64 << 20, 1)
    assert o.groups == [] and o.optimizer.state_home == "cpu"
    assert o.optimizer.max_grad_norm == 0.0 and o.optimizer.loss_scaling.scale == 1.0
    assert o.optimizer.defaults.betas == pytest.approx((0.9, 0.999))
    # Nested structs are the options' own (readwrite through them), sizes parse.
    o.optimizer.defaults.lr = 0.25
    o.optimizer.loss_scaling.dynamic = True
    o.bucket_bytes = "4KiB"
    o.param_dtype = torch.bfloat16
    assert o.optimizer.defaults.lr == 0.25 and o.optimizer.loss_scaling.dynamic
    assert o.bucket_bytes == 4096 and o.param_dtype == "bfloat16"
    k = strata.ZeroOptions(stage=3, param_home="nvme", max_live_bytes="1MiB")
    assert (k.stage, k.param_home, k.max_live_bytes) == (3, "nvme", 1 << 20)
    k.max_live_bytes = None  # automatic again
    assert k.max_live_bytes is None and "max_live_bytes=None" in repr(k)
    o.groups = [{}, {"lr": 0.0}, strata.AdamGroup(lr=0.5, betas=(0.8, 0.9))]
    assert [g.lr for g in o.groups] == [0.25, 0.0, 0.5] and o.groups[2].beta1 == pytest.approx(0.8)
    assert "ZeroOptions(stage=2" in repr(o) and "AdamGroup(lr=0.25" in repr(o)


@pytest.mark.parametrize("field,value,error,message", [
    ("stage", 0, ValueError, r"ZeroOptions.stage=0: use 1 to 3"),
    ("stage", "3", TypeError, r"ZeroOptions.stage='3' \(str\): use an int"),
    ("stage", 2 ** 70, ValueError, r"ZeroOptions.stage=1180591620717411303424"),
    ("alignment", True, TypeError, r"ZeroOptions.alignment=True \(bool\): use an int"),
    ("gradient_buckets", 0, ValueError, r"ZeroOptions.gradient_buckets=0: use 1 to"),
    ("bucket_bytes", 1.5, TypeError, r"ZeroOptions.bucket_bytes=1.5 \(float\): use a byte count"),
    ("bucket_bytes", "12XB", ValueError, r"ZeroOptions.bucket_bytes='12XB' is not a size"),
    ("max_live_bytes", 0, ValueError, r"ZeroOptions.max_live_bytes=0: a positive byte count"),
    ("max_live_bytes", 1.0, TypeError,
     r"ZeroOptions.max_live_bytes=1.0 \(float\): use None \(automatic\), a byte count"),
    ("param_home", "disk", ValueError, r"ZeroOptions.param_home='disk': use 'gpu', 'cpu' or"),
    ("param_dtype", "int8", ValueError, r"ZeroOptions.param_dtype='int8': use float32"),
    ("groups", "all", TypeError, r"ZeroOptions.groups='all' \(str\): use a list"),
    ("colour", 1, TypeError, r"'colour' is not a field of strata.ZeroOptions"),
])
def test_zero_options_errors_name_the_field(field, value, error, message):
    with pytest.raises(error, match=message):
        strata.ZeroOptions(**{field: value})
    if field != "colour":  # setattr of an unknown name: Python's AttributeError
        with pytest.raises(error, match=message):
            setattr(strata.ZeroOptions(), field, value)


def test_nested_errors_name_the_field():
    o = strata.ZeroOptions()
    with pytest.raises(ValueError, match=r"AdamGroup.betas\[1\]=1.5: use a finite number"):
        o.optimizer.defaults.betas = (0.9, 1.5)
    with pytest.raises(ValueError, match=r"AdamGroup.lr=-1: use a finite number from 0.0"):
        o.optimizer.defaults.lr = -1
    with pytest.raises(ValueError, match=r"OffloadOptimizerOptions.state_home='gpu': use 'cpu'"):
        o.optimizer.state_home = "gpu"
    with pytest.raises(TypeError, match=r"LossScaling.dynamic=1 \(int\): use True or False"):
        o.optimizer.loss_scaling.dynamic = 1
    with pytest.raises(ValueError, match=r"OffloadOptimizerOptions.max_grad_norm=nan"):
        o.optimizer.max_grad_norm = float("nan")
    assert o.optimizer.defaults.lr == pytest.approx(1e-3)  # nothing half-set


def test_engine_takes_options_or_fields(runtime, comm):
    params = [("w", (8, 4), torch.arange(32, dtype=torch.float32).numpy())]
    o = strata.ZeroOptions(stage=3, param_dtype="float32", grad_dtype="float32",
                           bucket_bytes="4KiB", persist_below_bytes=0)
    o.optimizer.defaults.lr = 0.5
    engine = strata.ZeroEngine(runtime, comm, params, o)
    got = engine.options
    assert (got.stage, got.bucket_bytes, got.optimizer.defaults.lr) == (3, 4096, 0.5)
    assert engine.stage == 3
    # Keyword fields over the options (the optimizer's by their short names); `o` unchanged.
    other = strata.Runtime(backend="host", gpu_bytes="8MiB", cpu_bytes="8MiB", nvme_paths=None)
    again = strata.ZeroEngine(other, solo_communicator(other), [("v", 4)], o, stage=2,
                              lr=0.125, betas=(0.5, 0.6), groups=[{}, {"weight_decay": 0.5}])
    a = again.options
    assert (a.stage, a.optimizer.defaults.lr, a.bucket_bytes) == (2, 0.125, 4096)
    assert a.optimizer.defaults.betas == pytest.approx((0.5, 0.6))
    assert a.groups[1].lr == 0.125 and a.groups[1].weight_decay == 0.5  # over the defaults
    assert o.stage == 3 and o.optimizer.defaults.lr == 0.5
    with pytest.raises(TypeError, match=r"'colour' is not a ZeroEngine option"):
        strata.ZeroEngine(runtime, comm, [("u", 4)], colour=1)
    with pytest.raises(TypeError, match=r"options=\{\} \(dict\): use a strata.ZeroOptions"):
        strata.ZeroEngine(runtime, comm, [("u", 4)], {})


def test_policies_are_frozen_and_checked():
    mp = st.MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        mp.param_dtype = torch.float32
    bad = [
        (lambda: st.MixedPrecisionPolicy(param_dtype=torch.int8), ValueError,
         r"MixedPrecisionPolicy.param_dtype=torch.int8: use torch.float32"),
        (lambda: st.MixedPrecisionPolicy(reduce_dtype="float16"), ValueError,
         r"MixedPrecisionPolicy.reduce_dtype='float16'"),
        (lambda: st.MixedPrecisionPolicy(loss_scale=0), ValueError,
         r"MixedPrecisionPolicy.loss_scale=0: use a positive scale"),
        (lambda: st.MixedPrecisionPolicy(dynamic_loss_scale="yes"), TypeError,
         r"MixedPrecisionPolicy.dynamic_loss_scale='yes' \(str\): use True or False"),
        (lambda: st.OffloadPolicy(param_home="disk"), ValueError,
         r"OffloadPolicy.param_home='disk': use 'gpu', 'cpu' or 'nvme'"),
        (lambda: st.OffloadPolicy(state_home="gpu"), ValueError,
         r"OffloadPolicy.state_home='gpu': use 'cpu' or 'nvme'"),
        (lambda: st.FetchPolicy(order="sideways"), ValueError,
         r"FetchPolicy.order='sideways': use 'record' or 'module'"),
        (lambda: st.FetchPolicy(max_live_bytes=0), ValueError,
         r"FetchPolicy.max_live_bytes=0: use a positive byte count"),
        (lambda: st.FetchPolicy(max_live_bytes=2.5), TypeError,
         r"FetchPolicy.max_live_bytes=2.5 \(float\): use None \(automatic\), a byte count"),
        (lambda: st.PlacementPolicy(param_home="disk"), ValueError,
         r"PlacementPolicy.param_home='disk': use 'gpu', 'cpu' or 'nvme'"),
        (lambda: st.CPUOffloadPolicy(pin_memory="yes"), TypeError,
         r"CPUOffloadPolicy.pin_memory='yes' \(str\): use True or False"),
        (lambda: st.CPUOffloadPolicy(pin_memory=False), ValueError,
         r"CPUOffloadPolicy.pin_memory=False: strata's CPU tier is pinned host memory, always"),
        (lambda: st.CPUOffloadPolicy(param_home="gpu"), TypeError, r"param_home"),
        (lambda: st.FetchPolicy(prefetch_bytes="lots"), ValueError,
         r"FetchPolicy.prefetch_bytes='lots': .*not a size"),
        (lambda: st.FetchPolicy(reuse_window_bytes=1.5), TypeError,
         r"FetchPolicy.reuse_window_bytes=1.5 \(float\): use a byte count"),
        (lambda: st.ReducePolicy(bucket_bytes=-4), ValueError,
         r"ReducePolicy.bucket_bytes=-4: use a positive byte count"),
        (lambda: st.ReducePolicy(accumulation_steps=0), ValueError,
         r"ReducePolicy.accumulation_steps=0: use a value at least 1"),
        (lambda: st.ReducePolicy(alignment=2.0), TypeError,
         r"ReducePolicy.alignment=2.0 \(float\): use an int"),
        (lambda: st.ZeroAdamW(lr=-1e-3), ValueError, r"ZeroAdamW.lr=-0.001: use a value at"),
        (lambda: st.ZeroAdamW(betas=(0.9, 1.0)), ValueError,
         r"ZeroAdamW.betas=\(0.9, 1.0\): each in \[0, 1\)"),
        (lambda: st.ZeroAdamW(betas=0.9), TypeError, r"ZeroAdamW.betas=0.9: use a pair"),
        (lambda: st.ZeroAdamW(max_grad_norm=None), TypeError,
         r"ZeroAdamW.max_grad_norm=None \(NoneType\): use a number"),
    ]
    for make, error, message in bad:
        with pytest.raises(error, match=message):
            make()


def test_policy_defaults_are_the_cpp_defaults():
    # Every field a policy mirrors, but the dtypes (the torch module's float32).
    o, d = zero_policy.to_options(2), strata.ZeroOptions()
    for field in ("param_home", "bucket_bytes", "gradient_buckets", "alignment",
                  "persist_below_bytes", "prefetch_bytes", "max_live_bytes",
                  "reuse_window_bytes", "accumulation_steps"):
        assert getattr(o, field) == getattr(d, field), field
    for field in ("state_home", "max_grad_norm", "skip_on_overflow", "chunk_elements"):
        assert getattr(o.optimizer, field) == getattr(d.optimizer, field), field
    assert repr(o.optimizer.defaults) == repr(d.optimizer.defaults)
    assert repr(o.optimizer.loss_scaling) == repr(d.optimizer.loss_scaling)
    assert (o.param_dtype, o.grad_dtype) == ("float32", "float32")


def test_zero_shard_builds_the_engine_from_the_policies(runtime, comm):
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    model = st.zero_shard(
        net, comm, stage=3, units=None,
        mp_policy=st.MixedPrecisionPolicy(loss_scale=8.0),
        offload_policy=st.OffloadPolicy(param_home="cpu", state_home="cpu"),
        fetch_policy=st.FetchPolicy(order="module", prefetch_bytes=0, max_live_bytes="64KiB",
                                    persist_below_bytes=0),
        reduce_policy=st.ReducePolicy(bucket_bytes="1KiB", accumulation_steps=2),
        optimizer=st.ZeroAdamW(lr=0.05, betas=(0.8, 0.9), weight_decay=0.1, max_grad_norm=2.0))
    o = model.engine.options
    assert (o.stage, o.param_home, o.param_dtype, o.prefetch_bytes, o.max_live_bytes) == \
        (3, "cpu", "float32", 0, 64 << 10)
    assert (o.bucket_bytes, o.accumulation_steps, o.persist_below_bytes) == (1024, 2, 0)
    assert o.optimizer.defaults.lr == pytest.approx(0.05)
    assert o.optimizer.defaults.betas == pytest.approx((0.8, 0.9))
    assert (o.optimizer.max_grad_norm, o.optimizer.loss_scaling.scale) == (2.0, 8.0)
    assert model.optimizer.lr == 0.05 and model.fetch_policy.order == "module"
    assert model.loss_scale == 8.0
    model.close()


def test_zero_shard_argument_errors(runtime, comm):
    net = nn.Linear(4, 4)
    # The keywords before the policies: a message that says where each went.
    for old, where in (("lr", r"optimizer=ZeroAdamW\(lr=...\)"),
                       ("bucket_bytes", r"reduce_policy=ReducePolicy\(bucket_bytes=...\)"),
                       ("param_home", r"offload_policy=PlacementPolicy\(param_home=...\)"),
                       ("param_dtype", r"mp_policy=MixedPrecisionPolicy\(param_dtype=...\)"),
                       ("max_live_bytes", r"fetch_policy=FetchPolicy\(max_live_bytes=...\)")):
        with pytest.raises(TypeError, match=rf"zero_shard\({old}=...\): .*strata.torch.{where}"):
            st.zero_shard(net, comm, **{old: 1})
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'colour'"):
        st.zero_shard(net, comm, colour=1)
    with pytest.raises(TypeError, match=r"positional"):
        st.zero_shard(net, comm, 3)  # keyword-only
    with pytest.raises(TypeError, match=r"offload_policy=\{'param_home': 'cpu'\} \(dict\): use "
                                        r"strata.torch.PlacementPolicy\(param_home=..., "
                                        r"state_home=...\) or FSDP2's "
                                        r"strata.torch.CPUOffloadPolicy"):
        st.zero_shard(net, comm, offload_policy={"param_home": "cpu"})
    with pytest.raises(TypeError, match=r"\(SGD\): use strata.torch.ZeroAdamW"):
        st.zero_shard(net, comm, optimizer=torch.optim.SGD(nn.Linear(2, 2).parameters(), 0.1))
    with pytest.raises(ValueError, match=r"OffloadPolicy.param_home='nvme' needs stage 3"):
        st.zero_shard(net, comm, stage=2, offload_policy=st.OffloadPolicy(param_home="nvme"))
    with pytest.raises(ValueError, match=r"stage=True: use 1, 2 or 3"):
        st.zero_shard(net, comm, stage=True)


def test_fsdp2_spellings_and_strata_placement(runtime, comm):
    """strata's placement policy is PlacementPolicy; FSDP2's names mean FSDP2's things where
    strata can honour them (CPUOffloadPolicy) and say where it cannot (OffloadPolicy(): strata
    has no optimizer on the GPU); OffloadPolicy with fields is PlacementPolicy's old name."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these warns
        placed = st.PlacementPolicy()
        old = st.OffloadPolicy(param_home="cpu")
        cpu = st.CPUOffloadPolicy()
        pinned = st.CPUOffloadPolicy(pin_memory=True)
    assert (placed.param_home, placed.state_home) == ("gpu", "cpu")
    assert (old.param_home, old.state_home) == ("cpu", "cpu")
    assert isinstance(old, st.PlacementPolicy)
    assert (cpu.param_home, cpu.state_home, cpu.pin_memory) == ("cpu", "cpu", True)
    assert cpu == pinned == st.CPUOffloadPolicy(True)
    assert isinstance(cpu, st.OffloadPolicy)  # FSDP2's hierarchy
    with pytest.warns(UserWarning, match=r"OffloadPolicy\(\) is FSDP2's 'no offloading'.*"
                                         r"optimizer step always runs on the CPU"):
        none = st.OffloadPolicy()
    assert (none.param_home, none.state_home) == ("gpu", "cpu")
    # What the engine is created with.
    for policy, stage, homes in ((cpu, 3, ("cpu", "cpu")), (cpu, 2, ("cpu", "cpu")),
                                 (placed, 3, ("gpu", "cpu")), (none, 3, ("gpu", "cpu")),
                                 (st.OffloadPolicy(state_home="nvme"), 3, ("gpu", "nvme")),
                                 (st.PlacementPolicy("nvme", "nvme"), 3, ("nvme", "nvme"))):
        o = zero_policy.to_options(stage, offload_policy=policy)
        assert (o.param_home, o.optimizer.state_home) == homes, policy
    with pytest.raises(ValueError, match=r"PlacementPolicy.param_home='nvme' needs stage 3"):
        zero_policy.to_options(1, offload_policy=st.PlacementPolicy(param_home="nvme"))
    # FSDP2's CPUOffloadPolicy in zero_shard: the shards and the states in the CPU tier.
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    model = st.zero_shard(net, comm, offload_policy=st.CPUOffloadPolicy(),
                          fetch_policy=st.FetchPolicy(persist_below_bytes=0))
    assert model.offload_policy == cpu
    memory = model.memory()
    assert memory["params"]["cpu"] > 0 and memory["params"]["gpu"] == 0, memory
    assert memory["optimizer_states"]["cpu"] > 0, memory
    model(torch.randn(4, 8)).sum().backward()
    assert model.step()["step"] == 1
    model.close()


def test_torch_fsdp2_objects_are_refused_naming_strata_s(comm):
    """torch's own FSDP2 policy objects: refused with the strata.torch name to use (the same
    name), not taken for what they are not."""
    def fake(name):  # torch 1.13 has no FSDP2: a class from where torch >= 2.6 defines them
        return type(name, (), {"__module__": "torch.distributed.fsdp._fully_shard._fsdp_api",
                               "__repr__": lambda self: f"{name}()"})()

    net = nn.Linear(4, 4)
    with pytest.raises(TypeError, match=r"offload_policy=CPUOffloadPolicy\(\) is torch's "
                                        r"torch.distributed.fsdp._fully_shard._fsdp_api."
                                        r"CPUOffloadPolicy: use strata.torch.CPUOffloadPolicy"):
        st.zero_shard(net, comm, offload_policy=fake("CPUOffloadPolicy"))
    with pytest.raises(TypeError, match=r"mp_policy=MixedPrecisionPolicy\(\) is torch's .*: use "
                                        r"strata.torch.MixedPrecisionPolicy\(...\)"):
        st.zero_shard(net, comm, mp_policy=fake("MixedPrecisionPolicy"))
