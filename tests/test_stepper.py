"""One schedule step per training iteration from the optimizer hook: several optimizers, ZeRO, GradScaler skips."""

from __future__ import annotations

import socket
import time

import pytest
import torch

from distprof.capture.stepper import OptimizerStepper


@pytest.fixture
def stepper():
    fired = []
    s = OptimizerStepper(lambda: fired.append(s.iterations))
    s.install()
    s.fired = fired
    yield s
    s.remove()


def model_and_loss():
    m = torch.nn.Linear(4, 2)
    return m, lambda: m(torch.randn(3, 4)).sum()


def test_one_step_per_iteration_deferred_to_next_forward(stepper):
    m, loss = model_and_loss()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for i in range(3):
        loss().backward()  # the forward of iteration i fires the step deferred from iteration i-1
        opt.step()
        assert stepper.pending
    assert stepper.fired == [1, 2]  # iterations 0 and 1 fired at the next forward
    stepper.fire()
    assert stepper.fired == [1, 2, 3] and not stepper.pending


def test_iteration_end_time_is_the_optimizer_step_end(stepper):
    """last_end_ns: when the primary optimizer's step returned (a step still pending at close ends there)."""
    m, loss = model_and_loss()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(2):
        loss().backward()
        before = time.time_ns()
        opt.step()
        after = time.time_ns()
        assert before <= stepper.last_end_ns <= after
        time.sleep(0.002)  # work after the step (a checkpoint) does not move it
        assert stepper.last_end_ns <= after


def test_several_optimizers_count_the_primary(stepper):
    m, loss = model_and_loss()
    a = torch.optim.SGD(m.parameters(), lr=0.1)
    b = torch.optim.AdamW(m.parameters(), lr=0.1)
    for i in range(6):
        loss().backward()
        a.step()
        if i % 2 == 1:
            b.step()
    stepper.fire()
    assert stepper.iterations == 6 and len(stepper.fired) == 6


def test_loop_without_module_forward_advances_at_next_optimizer_step(stepper):
    w = torch.zeros(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    for _ in range(4):
        (w * 2).sum().backward()  # no nn.Module: no forward pre-hook
        opt.step()
    stepper.fire()
    assert len(stepper.fired) == 4


def test_grad_scaler_skipped_steps_still_count(stepper):
    m, loss = model_and_loss()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    steps_taken = []
    for i in range(4):
        out = loss()
        if i == 1:
            out = out * float("inf")  # inf gradients: the scaler skips optimizer.step()
        scaler.scale(out).backward()
        before = stepper.iterations
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        steps_taken.append(stepper.iterations - before)
    stepper.fire()
    assert steps_taken == [1, 1, 1, 1]
    assert stepper.skipped == 1 and len(stepper.fired) == 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_zero_redundancy_optimizer_counts_once(stepper, monkeypatch):
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        m, loss = model_and_loss()
        opt = ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
        for _ in range(3):
            loss().backward()
            opt.step()
        stepper.fire()
        assert stepper.iterations == 3 and len(stepper.fired) == 3
    finally:
        dist.destroy_process_group()


# ---- closure-based optimizers: forward and backward inside optimizer.step(closure) ---------------------------------

def _cut_events(prof, prefix="Optimizer.step#"):
    """Events named `prefix`… that no ProfilerStep#N span holds whole (cut by a step boundary)."""
    evs = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()]
    steps = [(a, b) for n, a, b in evs if n.startswith("ProfilerStep")]
    assert steps, "no ProfilerStep recorded"
    return [(n, a, b) for n, a, b in evs if n.startswith(prefix) and not any(s <= a and b <= e for s, e in steps)]


@pytest.mark.parametrize("make_opt", [
    lambda p: torch.optim.LBFGS(p, lr=0.1, max_iter=3),  # the closure runs several times inside one step
    lambda p: torch.optim.AdamW(p, lr=0.01),  # Lightning's automatic optimization: opt.step(closure=closure)
])
def test_closure_optimizer_step_is_never_cut_by_a_step_boundary(make_opt):
    """The boundary of a closure-based optimizer falls before its Optimizer.step#… event, not inside it (where the
    forward pre-hook or the optimizer's pre-hook would put it): every Optimizer.step event lies in one step."""
    from torch.profiler import ProfilerActivity, profile, schedule

    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = make_opt(m.parameters())
    x = torch.randn(16, 8)

    def closure():
        opt.zero_grad()
        loss = m(x).pow(2).mean()
        loss.backward()
        return loss

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=10, repeat=1)) as prof:
        at_fire = []
        s = OptimizerStepper(lambda: (at_fire.append(s._depth), prof.step()))
        s.install()
        try:
            for i in range(6):
                if isinstance(opt, torch.optim.LBFGS):
                    opt.step(closure)
                else:
                    opt.step(closure=closure)
        finally:
            s.fire()
            s.remove()
    assert s.iterations == 6 and at_fire == [0] * 6  # each boundary outside every optimizer step
    assert _cut_events(prof) == []
    assert "step" not in opt.__dict__  # the wrapper is gone with the stepper


def test_closure_wrapper_composes_with_lr_schedulers():
    """An LR scheduler made before (its own opt.step wrapper stays inside ours, no 'overridden' warning) and one
    made after (it wraps ours) both work; removing the stepper puts the earlier scheduler's wrapper back."""
    import warnings

    m, loss = model_and_loss()
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    before = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    fired = []
    s = OptimizerStepper(lambda: fired.append((s.iterations, s._depth)))
    s.install()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for i in range(4):
                opt.step(closure=lambda: (opt.zero_grad(), loss().backward())[0])
                before.step()
                if i == 1:
                    after = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
                if i >= 1:
                    after.step()
        assert fired == [(1, 0), (2, 0), (3, 0)] and s.pending  # each before the optimizer step began
        assert before._step_count == 5 and after._step_count == 4
    finally:
        s.remove()
    assert opt.step._wrapped_by_lr_sched  # the schedulers' wrappers are still there
    opt.step(closure=lambda: (opt.zero_grad(), loss().backward())[0])  # and the optimizer still steps


def test_forward_inside_an_open_optimizer_step_is_no_boundary(stepper):
    """A module forward inside an optimizer step (a closure the stepper did not recognise as one) leaves the
    pending step pending; the next forward outside any optimizer step advances it."""
    m, loss = model_and_loss()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    loss().backward()
    opt.step()
    assert stepper.pending
    opt.register_step_pre_hook(lambda o, a, k: loss())  # a forward inside the step, no closure argument
    stepper._depth += 1  # as inside another optimizer's step
    loss()
    assert stepper.pending and stepper.fired == []
    stepper._depth -= 1
    loss()
    assert not stepper.pending and stepper.fired == [1]


@pytest.mark.slow
def test_lightning_closure_steps_are_whole_and_a_delay_is_counted_once(tmp_path):
    """A real 2-rank Lightning DDP job (gloo; forward and backward run inside optimizer.step(closure)), rank 1
    sleeping 30 ms more per forward: no event of a rank's main thread is cut by a step boundary (before, every
    Optimizer.step#AdamW.step began in one step and ended in the next), no collective is reported as disagreeing, and
    rank 1's root cause lists the sleep once, under DistributedDataParallel.forward, not also under the
    Optimizer.step around it."""
    import numpy as np
    from conftest import EXAMPLES, job_env, only_run_dir, torchrun

    import distprof
    from distprof.analysis.cross.rootcause import root_cause
    from distprof.storage.reader import find_shards, read_shard

    pytest.importorskip("lightning")
    torchrun(2, ["-m", "distprof.launch", "--out", "out", "--wait", "2", "--warmup", "2", "--active", "6",
                 str(EXAMPLES / "lightning_trainer.py"), "--steps", "12", "--base-ms", "10", "--slow-rank", "1",
                 "--slow-ms", "30"], cwd=tmp_path, env=job_env(), timeout=420)
    run_dir = only_run_dir(tmp_path / "out")
    for shard in find_shards(run_dir):
        s = read_shard(shard)
        ev, st, names = s.table("events"), s.table("steps"), s.names
        is_step = np.array([names[i].startswith("ProfilerStep#") for i in ev["name_id"]], bool)
        main = np.isin(ev["tid"], np.unique(ev["tid"][is_step])) & (ev["device"] < 0) & (ev["step"] >= 0)
        span = {int(k): (a, b) for k, a, b in zip(st["step"], st["start_ns"], st["end_ns"])}
        start = np.array([span[int(k)][0] for k in ev["step"][main]], np.int64)
        end = np.array([span[int(k)][1] for k in ev["step"][main]], np.int64)
        cut = (ev["ts_ns"][main] < start) | (ev["ts_ns"][main] + ev["dur_ns"][main] > end)
        assert not cut.any(), sorted({names[i] for i in ev["name_id"][main][cut]})
        assert (np.array([names[i] for i in ev["name_id"][main]]) == "Optimizer.step#AdamW.step").sum() >= 5
    run = distprof.load(run_dir)
    assert not [w for w in run.warnings if "disagree" in w or "missing on some ranks" in w], run.warnings
    (rc,) = root_cause(run, [1])
    ex = {op.name: op.excess_ms_per_step for op in rc.ops}
    assert rc.ops[0].name == "DistributedDataParallel.forward" and rc.ops[0].excess_ms_per_step > 20, rc.ops
    assert ex.get("Optimizer.step#AdamW.step", 0.0) < 5.0, ex
    assert sum(ex.values()) < 1.5 * 30, ex  # the 30 ms delay, not the forward and the step around it both
