"""compare_runner.py (no torch): how compare.py reads its workers. Small stand-in workers (a
Python one-liner in place of compare_worker.py) take each road a GPU worker can take: a JSON then
a hang in teardown (the figures are kept, the process is killed, the note says so), no JSON
before the limit (timeout, nothing left behind, how far it got from its ".partial" figures), killed by a signal without a JSON (oom), an exit
without a JSON (failed, with the output's tail), a budget refused before start (no process, no
log), and too little time left (skipped, no process)."""

import json
import os
import sys
import time
import types

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                                "torch_trainer"))

import compare_runner as cr  # noqa: E402


def fake_worker(body: str):
    """A Runner.command stand-in: python -c BODY, with OUT the JSON's path."""
    def command(self, system, layers, steps, batch, out, extra=()):
        return [sys.executable, "-c", f"OUT = {out!r}\n" + body]
    return command


WRITE = ("import json, os, sys, time\n"
         "with open(OUT + '.tmp', 'w') as f:\n"
         "    json.dump({'status': 'ok', 'tokens_per_s': 123.0, 'pid': os.getpid()}, f)\n"
         "os.rename(OUT + '.tmp', OUT)\n"
         "sys.stdout.write('wrote\\n'); sys.stdout.flush()\n")


def runner(tmp_path, monkeypatch, body, deadline_s=60.0, sizing=None):
    monkeypatch.setattr(cr.Runner, "command", fake_worker(body))
    args = types.SimpleNamespace(deadline_s=deadline_s)
    return cr.Runner(args, str(tmp_path), sizing or (lambda system, layers: ({}, None)))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_worker_that_hangs_after_its_json_keeps_its_figures(tmp_path, monkeypatch):
    monkeypatch.setattr(cr, "EXIT_GRACE_S", 1.0)
    r = runner(tmp_path, monkeypatch, WRITE + "time.sleep(600)\n")
    t0 = time.monotonic()
    result = r.run("torch", 2, 3, limit=30, batch=1)
    took = time.monotonic() - t0
    assert result["status"] == "ok" and result["tokens_per_s"] == 123.0
    p = result["process"]
    assert p["hung_after_json"] and p["killed"]
    assert p["json_s"] is not None and p["json_s"] <= p["exit_s"]
    assert any("stuck in teardown" in n for n in result["notes"])
    assert took < 25, f"waited {took:.0f} s: the limit, not the grace after the JSON"
    assert not alive(result["pid"]), "the hung worker was left behind"


def test_a_worker_that_exits_after_its_json_is_not_called_hung(tmp_path, monkeypatch):
    r = runner(tmp_path, monkeypatch, WRITE)
    result = r.run("torch", 2, 3, limit=30, batch=1)
    assert result["status"] == "ok"
    assert not result["process"]["hung_after_json"] and not result["process"]["killed"]
    assert "notes" not in result


def test_no_json_within_the_limit_is_a_timeout_and_nothing_is_left(tmp_path, monkeypatch):
    body = ("import os, time\n"
            "open(OUT + '.pid', 'w').write(str(os.getpid()))\n"
            "print('still working', flush=True)\n"
            "time.sleep(600)\n")
    monkeypatch.setattr(cr, "MIN_TRY_S", 1.0)
    r = runner(tmp_path, monkeypatch, body)
    result = r.run("strata-cpu", 2, 3, limit=2, batch=1)
    assert result["status"] == "timeout"
    assert "did not finish within 2 s" in result["error"]
    assert "still working" in result["output_tail"]
    pid = int(open(os.path.join(tmp_path, "1-strata-cpu.json.pid")).read())
    assert not alive(pid)


def test_a_timeout_says_how_far_the_worker_got(tmp_path, monkeypatch):
    body = ("import json, time\n"
            "json.dump({'status': 'running', 'startup': {'build_s': 4.25}, 'steps': ["
            "{'step': 1, 'seconds': 6.0}, {'step': 2, 'seconds': 5.5}]}, "
            "open(OUT + '.partial', 'w'))\n"
            "time.sleep(600)\n")
    monkeypatch.setattr(cr, "MIN_TRY_S", 1.0)
    r = runner(tmp_path, monkeypatch, body)
    result = r.run("strata-nvme", 2, 6, limit=2, batch=1)
    assert result["status"] == "timeout"
    assert result["error"] == ("did not finish within 2 s (built in 4.2 s, 2 of 6 steps done, "
                               "in 6.0, 5.5 s)")
    assert cr.progress(str(tmp_path / "none.partial"), 6) == \
        "(no result written; it had not finished building its model)"


def test_killed_by_a_signal_without_json_is_oom(tmp_path, monkeypatch):
    r = runner(tmp_path, monkeypatch, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    result = r.run("strata-nvme", 2, 3, limit=30, batch=1)
    assert result["status"] == "oom" and "killed by signal 9" in result["error"]


def test_an_exit_without_json_is_failed_with_the_output(tmp_path, monkeypatch):
    r = runner(tmp_path, monkeypatch, "print('Traceback: something broke')\nraise SystemExit(3)\n")
    result = r.run("strata-cpu", 2, 3, limit=30, batch=1)
    assert result["status"] == "failed"
    assert "exited 3" in result["error"] and "something broke" in result["error"]


def test_a_half_written_json_is_not_read(tmp_path):
    path = tmp_path / "w.json"
    path.write_text('{"status": "ok", "tok')
    assert cr.read_json(str(path)) is None
    path.write_text(json.dumps({"status": "ok"}))
    assert cr.read_json(str(path)) == {"status": "ok"}
    path.write_text("[1, 2]")
    assert cr.read_json(str(path)) is None


def test_a_budget_that_does_not_fit_is_refused_before_start(tmp_path, monkeypatch):
    why = "strata-cpu at 2 layers needs 2.88 MiB of pinned host memory but 1.00 MiB is available"
    r = runner(tmp_path, monkeypatch, WRITE, sizing=lambda system, layers: (None, why))
    result = r.run("strata-cpu", 2, 3, limit=30, batch=1)
    assert result == {"status": "refused", "fits": False, "error": why, "not_started": True}
    assert r.n == 0 and os.listdir(tmp_path) == []  # no process, no log


def test_too_little_time_left_starts_nothing(tmp_path, monkeypatch):
    r = runner(tmp_path, monkeypatch, WRITE, deadline_s=cr.MIN_TRY_S + 1)
    result = r.run("torch", 2, 3, limit=30, batch=1)
    assert result["status"] == "skipped"
    assert result["skipped"].startswith("not started: ") and "deadline" in result["skipped"]
    assert os.listdir(tmp_path) == []


def test_the_sizing_reaches_the_worker_and_launch_variables_do_not(tmp_path, monkeypatch):
    body = ("import json, os\n"
            "json.dump({'status': 'ok', 'env': {k: os.environ.get(k) for k in "
            "('STRATA_CPU_BYTES', 'RANK', 'MASTER_PORT', 'SLURM_PROCID', 'STRATA_GONE')}}, "
            "open(OUT, 'w'))\n")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("STRATA_GONE", "x")
    r = runner(tmp_path, monkeypatch, body, sizing=lambda system, layers: (
        {"STRATA_CPU_BYTES": 12345 * layers, "STRATA_GONE": None}, None))
    result = r.run("strata-cpu", 3, 3, limit=30, batch=1)
    assert result["env"] == {"STRATA_CPU_BYTES": "37035", "RANK": None, "MASTER_PORT": None,
                             "SLURM_PROCID": None, "STRATA_GONE": None}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
