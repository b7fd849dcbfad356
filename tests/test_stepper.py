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
