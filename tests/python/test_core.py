"""strata's core binding: Runtime, tensors, acquisitions, DLPack, errors, stats."""

import gc

import numpy as np
import pytest
import torch

import strata

MiB = 1 << 20


def test_runtime_keyword_overrides(runtime, nvme_dir):
    assert runtime.backend == "host"
    assert runtime.has_nvme
    config = runtime.config
    assert config["gpu_bytes"] == 32 * MiB
    assert config["cpu_bytes"] == 32 * MiB
    assert config["nvme_paths"] == [str(nvme_dir)]


def test_runtime_reads_the_environment_and_keywords_win(monkeypatch):
    monkeypatch.setenv("STRATA_GPU_BYTES", "16MiB")
    monkeypatch.setenv("STRATA_CPU_BYTES", "16MiB")
    rt = strata.Runtime(backend="host")
    assert rt.config["gpu_bytes"] == 16 * MiB
    rt = strata.Runtime(backend="host", gpu_bytes="8MiB")
    assert rt.config["gpu_bytes"] == 8 * MiB


def test_local_rank_picks_the_device_and_local_world_size_divides_memory(monkeypatch):
    monkeypatch.delenv("STRATA_DEVICE", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    rt = strata.Runtime(backend="host", gpu_bytes="8MiB", cpu_bytes="1%")
    assert rt.config["device"] == 1
    assert rt.config["device_reason"] == "from LOCAL_RANK=1 (STRATA_DEVICE unset)"
    whole = strata.Runtime(backend="host", gpu_bytes="8MiB", cpu_bytes="1%", device=0)
    assert whole.config["device"] == 0
    assert whole.config["device_reason"] == "from STRATA_DEVICE=0"
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    alone = strata.Runtime(backend="host", gpu_bytes="8MiB", cpu_bytes="1%")
    # 1% of this rank's share: half of it with two ranks on the node (rounding aside).
    assert abs(rt.config["cpu_bytes"] * 2 - alone.config["cpu_bytes"]) <= 8192


def test_bad_size_string_raises_value_error_with_the_runtime_message():
    with pytest.raises(ValueError, match=r"STRATA_GPU_BYTES='12XB' is not a size") as info:
        strata.Runtime(backend="host", gpu_bytes="12XB")
    assert isinstance(info.value, strata.InvalidArgumentError)
    assert isinstance(info.value, strata.Error)
    assert isinstance(info.value, RuntimeError)


def test_parse_size_is_the_runtime_parser():
    assert strata.parse_size("64KiB") == 64 * 1024
    assert strata.parse_size("1.5MiB") == 3 * MiB // 2
    assert strata.parse_size(4096) == 4096
    assert strata.parse_size(0) == 0
    with pytest.raises(strata.InvalidArgumentError, match="min_bytes=.*lots"):
        strata.parse_size("lots", "min_bytes")
    with pytest.raises(strata.InvalidArgumentError, match=r"window_bytes=-1: a byte count >= 0"):
        strata.parse_size(-1, "window_bytes")
    with pytest.raises(strata.InvalidArgumentError, match="a positive byte count"):
        strata.parse_size(0, "window_bytes", allow_zero=False)


def test_unknown_keyword_names_the_variable():
    with pytest.raises(strata.Error, match=r"did you mean STRATA_GPU_BYTES"):
        strata.Runtime(backend="host", gpu_byte="1GiB")


def test_missing_nvme_path_is_reported():
    with pytest.raises(strata.Error, match=r"/nonexistent/strata-py"):
        strata.Runtime(backend="host", gpu_bytes="8MiB", cpu_bytes="8MiB",
                       nvme_paths=["/nonexistent/strata-py"])


def test_tensor_records_shape_and_dtype(runtime):
    t = runtime.create("w", (3, 4, 5), "float16", home="cpu")
    assert t.shape == (3, 4, 5)
    assert t.dtype == "float16"
    assert t.nbytes == 3 * 4 * 5 * 2
    assert t.home == "cpu"
    found = runtime.find("w")
    assert found.shape == (3, 4, 5) and found.dtype == "float16"
    assert runtime.create("b", 7, torch.bfloat16).dtype == "bfloat16"
    assert runtime.create("n", (2,), np.int64).dtype == "int64"
    assert "strata.Tensor('w'" in repr(t)


def test_dlpack_round_trip_through_nvme(runtime):
    """Write through torch, move the tensor to NVMe and back, read it back through strata."""
    t = runtime.create("roundtrip", (256, 33), "float32", home="nvme")
    expected = torch.randn(256, 33)
    with t.acquire("gpu", "w") as view:
        assert view.__dlpack_device__() == (1, 0)  # kDLCPU: the host backend's "GPU"
        target = torch.from_dlpack(view)
        assert target.shape == (256, 33) and target.dtype == torch.float32
        assert target.data_ptr() == view.address  # zero copy
        target.copy_(expected)
        del target
    t.evict("gpu")  # written back to its home, NVMe; the GPU copy is dropped
    moves = runtime.stats()["moves"]
    assert moves["gpu->nvme"]["bytes"] == t.nbytes
    with t.acquire("cpu", "r") as view:  # NVMe -> CPU
        got = np.from_dlpack(view).copy()
    assert runtime.stats()["moves"]["nvme->cpu"]["bytes"] == t.nbytes
    assert got.tobytes() == expected.numpy().tobytes()
    t.evict("cpu")
    with t.acquire("gpu", "r") as view:  # and NVMe -> GPU through torch
        again = torch.from_dlpack(view).clone()
    assert torch.equal(again, expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64, torch.uint8,
                                   torch.float64, torch.int32])
def test_dlpack_dtypes(runtime, dtype):
    t = runtime.create("d", (5, 7), str(dtype).removeprefix("torch."), home="nvme")
    value = (torch.arange(35) % 100).reshape(5, 7).to(dtype)
    with t.acquire("cpu", "w") as view:
        torch.from_dlpack(view).copy_(value)
    t.evict("cpu")
    with t.acquire("gpu") as view:
        got = torch.from_dlpack(view).clone()
    assert got.dtype == dtype and torch.equal(got, value)


def test_scalar_and_empty_tensors(runtime):
    s = runtime.create("scalar", (), "float32")
    with s.acquire("cpu", "w") as view:
        torch.from_dlpack(view).fill_(2.5)
    with s.acquire("cpu") as view:
        assert float(np.from_dlpack(view)) == 2.5


def test_overwrite_mode(runtime):
    t = runtime.create("ow", (1024,), "float32", home="cpu")
    with t.acquire("cpu", "w") as view:
        torch.from_dlpack(view).fill_(1.0)
    with t.acquire("cpu", "overwrite") as view:
        assert view.mode == "o"
        torch.from_dlpack(view).fill_(3.0)  # every element: nothing was fetched for it
    with t.acquire("cpu") as view:
        assert np.from_dlpack(view).tolist() == [3.0] * 1024


def test_discard_drops_the_copies_without_a_write_back(runtime):
    t = runtime.create("dead", (4096,), "float32", home="cpu")
    with t.acquire("gpu", "w") as view:
        torch.from_dlpack(view).fill_(2.0)
    a = t.acquire("gpu")
    with pytest.raises(strata.Error, match=r"tensor 'dead' is acquired; release it before"):
        t.discard()
    a.release()
    before = runtime.stats()
    t.discard()
    t.evict("gpu")
    after = runtime.stats()
    assert after["discards"] == before["discards"] + 1
    assert after["moves"]["gpu->cpu"]["moves"] == before["moves"]["gpu->cpu"]["moves"]
    with t.acquire("cpu", "overwrite") as view:  # written again: whole
        torch.from_dlpack(view).fill_(5.0)
    with t.acquire("gpu") as view:
        assert torch.from_dlpack(view).eq(5.0).all()


def test_unknown_tier_and_mode(runtime):
    t = runtime.create("x", (4,), "float32")
    with pytest.raises(ValueError, match=r"'tape' is not a tier: use gpu or cpu"):
        t.acquire("tape")
    with pytest.raises(ValueError, match=r"'q' is not an access mode"):
        t.acquire("cpu", "q")
    with pytest.raises(ValueError, match=r"'disk' is not a tier: use gpu, cpu or nvme"):
        runtime.create("y", (4,), "float32", home="disk")
    with pytest.raises(ValueError, match=r"'complex7' is not a dtype"):
        runtime.create("z", (4,), "complex7")
    assert t.acquired == 0


def test_double_release(runtime):
    t = runtime.create("x", (4,), "float32")
    a = t.acquire("cpu", "w")
    a.release()
    with pytest.raises(strata.Error, match=r"tensor 'x': this acquisition was already released"):
        a.release()
    with pytest.raises(strata.Error, match=r"views must not outlive the acquisition"):
        a.__dlpack__()
    t.destroy()


def test_not_found_is_a_key_error_with_the_message(runtime):
    with pytest.raises(KeyError) as info:
        runtime.find("missing")
    assert isinstance(info.value, strata.NotFoundError)
    assert str(info.value) == "no tensor named 'missing'"


def test_destroy_while_acquired_fails_with_the_runtime_message(runtime):
    t = runtime.create("held", (16,), "float32")
    a = t.acquire("gpu", "w")
    with pytest.raises(strata.Error, match=r"tensor 'held' is acquired 1 time\(s\)"):
        t.destroy()
    a.release()
    t.destroy()
    assert t.destroyed
    with pytest.raises(strata.Error, match=r"tensor 'held' was destroyed"):
        t.acquire("cpu")


def test_duplicate_name_and_no_room(runtime):
    runtime.create("dup", (4,), "float32")
    with pytest.raises(strata.Error, match=r"dup"):
        runtime.create("dup", (4,), "float32")
    with pytest.raises(strata.Error) as info:
        runtime.create("huge", (64 * MiB,), "float32", home="cpu")
    assert "huge" in str(info.value)


def test_context_manager_releases_on_exception(runtime):
    t = runtime.create("x", (8,), "float32", home="nvme")
    with pytest.raises(ZeroDivisionError):
        with t.acquire("gpu", "w") as view:
            torch.from_dlpack(view).fill_(1.0)
            assert t.acquired == 1
            1 / 0
    assert t.acquired == 0
    assert view.released
    t.destroy()  # would fail if the tensor were still acquired


def test_acquisition_dropped_without_with_is_released(runtime):
    t = runtime.create("x", (8,), "float32")
    t.acquire("cpu", "w")  # never released explicitly
    gc.collect()
    t.destroy()


def test_nested_acquisitions(runtime):
    t = runtime.create("x", (8,), "float32")
    with t.acquire("cpu", "w") as outer:
        with t.acquire("cpu", "r") as inner:
            assert inner.address == outer.address
            assert t.acquired == 2
        assert t.acquired == 1
    assert t.acquired == 0


def test_stats_is_a_dict(runtime):
    before = runtime.stats()
    assert [tier["kind"] for tier in before["tiers"]] == ["gpu", "cpu", "nvme"]
    assert all(tier["present"] for tier in before["tiers"])
    assert before["tiers"][0]["capacity"] > 0
    t = runtime.create("x", (1024,), "float32", home="cpu")
    with t.acquire("gpu", "w"):
        pass
    with t.acquire("gpu", "r"):
        pass
    after = runtime.stats()
    assert after["tensors"] == before["tensors"] + 1
    assert after["acquires"] == before["acquires"] + 2
    assert after["hits"] + after["misses"] >= 2
    for key in ("stall_ns", "evictions_clean", "evictions_writeback", "errors",
                "prefetches_issued", "prefetches_used", "prefetches_late", "prefetches_wasted",
                "prefetches_failed", "prefetch_accuracy", "schedule", "overwrites", "discards",
                "early_writebacks", "early_writeback_bytes", "early_writebacks_used",
                "early_writebacks_wasted"):
        assert key in after
    assert set(after["moves"]) >= {"cpu->gpu", "gpu->cpu", "nvme->cpu", "cpu->nvme"}


def test_startup_reports_the_cpu_tier_pinned_as_it_fills():
    # 160 MiB in pieces of 64 MiB: 64, 64, 32; piece 0 is pinned at creation, the next as the
    # tier first hands out bytes in it (on the host backend "pinned" is registered with the
    # host device).
    rt = strata.Runtime(backend="host", gpu_bytes="8MiB", cpu_bytes="160MiB", nvme_paths=None)
    before = rt.startup()
    assert before["create_seconds"] > 0 and before["rings"] == 0
    assert before["pieces"] == 3 and before["piece_bytes"] == 64 * MiB
    assert before["pinned_pieces"] == 1 and before["pinned_bytes"] == 64 * MiB
    t = rt.create("x", (25 * MiB,), "float32", home="cpu")  # 100 MiB: into piece 1
    with t.acquire("cpu", "w"):
        pass
    after = rt.startup()
    assert after["pinned_pieces"] == 2 and after["pinned_bytes"] == 128 * MiB
    assert after["unpinned_pieces"] == 0 and after["pin_seconds"] >= before["pin_seconds"]


def test_step_boundaries_and_access_order(runtime):
    a = runtime.create("a", (64,), "float32")
    b = runtime.create("b", (64,), "float32")
    runtime.set_access_order([a, (b, "gpu")])
    assert runtime.stats()["schedule"]["given_order"]
    runtime.step_begin()
    for t in (a, b):
        with t.acquire("gpu"):
            pass
    runtime.step_end()
    runtime.flush()
    with pytest.raises(ValueError):
        runtime.set_access_order([(a, "tape")])


def test_offload_optimizer_binding(runtime, tmp_path):
    n = 1000
    p = runtime.create("p", (n,), "float32", home="cpu")
    g = runtime.create("p.grad", (n,), "float32", home="cpu")
    master = np.linspace(-1, 1, n, dtype=np.float32)
    opt = strata.OffloadOptimizer(runtime, state_home="nvme", lr=0.1, betas=(0.9, 0.99),
                                  eps=1e-8, weight_decay=0.0)
    pid = opt.add_param("p", p, g, initial_master=master)
    assert opt.find_param("p") == pid
    grad = np.full(n, 0.5, dtype=np.float32)
    with g.acquire("gpu", "w") as view:
        torch.from_dlpack(view).copy_(torch.from_numpy(grad))
    opt.grad_ready(pid)
    result = opt.step()
    assert not result["skipped"] and result["step"] == 1
    assert result["grad_norm"] == pytest.approx(0.5 * np.sqrt(n), rel=1e-5)
    m, v, s = opt.read_state(pid)
    # First Adam step: the update is lr * sign(grad) (bias-corrected m / sqrt(v)).
    np.testing.assert_allclose(m, master - 0.1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v, 0.05, rtol=1e-5)
    np.testing.assert_allclose(s, 0.01 * 0.25, rtol=1e-5)
    with p.acquire("cpu") as view:
        np.testing.assert_array_equal(np.from_dlpack(view), m)
    opt.save(tmp_path / "ckpt")
    opt.set_lr(0, 0.5)
    assert opt.group(0)["lr"] == 0.5
    with g.acquire("gpu", "w") as view:
        torch.from_dlpack(view).fill_(1.0)
    opt.grad_ready(pid)
    opt.step()
    opt.load(tmp_path / "ckpt")
    assert opt.step_count == 1
    assert opt.group(0)["lr"] == pytest.approx(0.1)
    np.testing.assert_array_equal(opt.read_state(pid)[0], m)
    stats = opt.stats()
    assert stats["steps"] == 2 and stats["params"] == 1
    with pytest.raises(ValueError, match=r"parameter id 7 is not registered"):
        opt.grad_ready(7)
    with pytest.raises(ValueError, match=r"parameter 'q': initial_master: got a float32 "
                                         r"numpy.ndarray of 3 elements; need float32 with 4 "
                                         r"elements \(the parameter's element count\)"):
        q = runtime.create("q", (4,), "float32")
        qg = runtime.create("q.grad", (4,), "float32")
        opt.add_param("q", q, qg, initial_master=np.zeros(3, np.float32))
