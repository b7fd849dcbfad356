"""torch.compile jobs under distprof (capture/compiled.py): Dynamo never traces distprof's hooks, and the answers stay.

Two real torchrun/gloo jobs of examples/ddp_mlp.py, rank 1 slowed, run with ``--watch`` and Dynamo's graph-break log
(``TORCH_LOGS=graph_breaks``), which names the user code of every break:

* ``model.compile()`` (the DDP module's own call compiled: global module hooks inside the trace) and the optimizer
  step compiled as PyTorch's recipe has it, with the default backend (inductor);
* ``torch.compile(model)`` (an OptimizedModule) with the eager optimizer, Dynamo's ``eager`` backend;
* FSDP2 with each block compiled before ``fully_shard`` (torchtitan's way), the ``eager`` backend.

Before capture/compiled.py, Dynamo traced the step boundary's and the watch's hooks: breaks at distprof's clock,
``/proc`` and numpy calls (stepper.py, watch.py), distprof's functions compiled as frames, and two UserWarnings. Now the
only breaks in distprof's code are its trampolines' calls of the disabled hooks (compiled.py).
"""

from __future__ import annotations

import re

import pytest

from conftest import EXAMPLES, job_env, only_run_dir, torchrun

pytestmark = pytest.mark.slow

#: The default schedule's window (wait 3, warmup 2, active 5).
DEFAULT_STEPS = [5, 6, 7, 8, 9]
SLOW_MS = 25.0
#: "Graph break in user code at FILE:LINE" (Dynamo's graph_breaks log; a repeated break may be logged without it)
BREAK_AT = re.compile(r"Graph break(?: \(user stack suppressed[^)]*\))? in user code at (\S+):(\d+)")


def compile_job(tmp_path_factory, name: str, script: str, *args: str):
    d = tmp_path_factory.mktemp(name)
    proc = torchrun(2, ["-m", "distprof.launch", "--out", "out", "--watch", str(EXAMPLES / script), "--steps", "14",
                        "--slow-rank", "1", "--slow-ms", str(SLOW_MS), *args], cwd=d,
                    env=job_env(TORCH_LOGS="graph_breaks"), timeout=400)
    return only_run_dir(d / "out"), proc


@pytest.fixture(scope="module")
def inplace(tmp_path_factory):
    return compile_job(tmp_path_factory, "inplace", "ddp_mlp.py", "--hidden", "256", "--base-ms", "20",
                       "--compile", "inplace", "--compile-optimizer")


@pytest.fixture(scope="module")
def wrapped(tmp_path_factory):
    return compile_job(tmp_path_factory, "wrapped", "ddp_mlp.py", "--hidden", "256", "--base-ms", "20",
                       "--compile", "model", "--compile-backend", "eager")


@pytest.fixture(scope="module")
def fsdp2_blocks(tmp_path_factory):
    return compile_job(tmp_path_factory, "fsdp2", "fsdp2.py", "--compile", "--compile-backend", "eager")


def breaks_in_distprof(stderr: str) -> list[str]:
    """FILE:LINE of every graph break Dynamo logged in distprof's own code."""
    return [f"{f}:{n}" for f, n in BREAK_AT.findall(stderr) if "/distprof/" in f]


@pytest.mark.parametrize("job", ["inplace", "wrapped", "fsdp2_blocks"])
def test_dynamo_never_traces_distprofs_hooks(job, request):
    run, proc = request.getfixturevalue(job)
    if job != "fsdp2_blocks":  # DDP breaks the graph itself (its logger, _inside_ddp_forward): the log is read
        assert BREAK_AT.search(proc.stderr), "no graph break logged at all: is TORCH_LOGS=graph_breaks read?"
    ours = breaks_in_distprof(proc.stderr)
    assert all(b.rsplit(":", 1)[0].endswith("distprof/capture/compiled.py") for b in ours), sorted(set(ours))
    if job == "inplace":  # the optimizer's hooks are inside its compiled step: reached, and skipped as disabled
        assert ours and "Skip calling `torch.compiler.disable()`d function" in proc.stderr
    assert "UserWarning: Dynamo does not know how to trace the builtin" not in proc.stderr  # distprof's clocks, /proc
    assert "when there are global hooks on modules" not in proc.stderr  # the step boundary's hook: silenced


@pytest.mark.parametrize("job", ["inplace", "wrapped", "fsdp2_blocks"])
def test_compiled_job_is_recorded_and_its_straggler_named(job, request):
    """The window holds the default steps, rank 1 is the straggler, late by about its delay, and the watch saw every
    step of both ranks, rank 1's own work the larger by about the delay."""
    import distprof
    from distprof.analysis.report.build import build_report

    run, proc = request.getfixturevalue(job)
    assert "distprof: rank 0 wrote 1 shard(s)" in proc.stderr + proc.stdout
    rs = distprof.load(run, progress=False)
    rep = build_report(rs, watch_dir=run)
    assert rep.run.first_step == DEFAULT_STEPS[0] and rep.run.last_step == DEFAULT_STEPS[-1]
    assert rep.straggler_info.named == [1], (rep.stragglers, rep.verdict)
    late = {d.rank: d for d in rep.stragglers}[1]
    assert 0.5 * SLOW_MS < late.lateness_ms < 1.5 * SLOW_MS, late
    per_rank = {r.rank: r for r in rep.watch.per_rank}
    assert sorted(per_rank) == [0, 1] and all(r.steps >= 12 for r in per_rank.values()), per_rank
    extra = per_rank[1].own_ms_median - per_rank[0].own_ms_median
    assert 0.5 * SLOW_MS < extra < 1.5 * SLOW_MS, per_rank


def test_compiled_autograd_never_leaves_an_empty_shard(tmp_path):
    """Compiled autograd (DDP's python reducer, the whole step compiled) with --watch: the job runs to its end (the
    watch's gradient hook traced into the compiled backward used to stop it), and a window is either recorded with
    its events or said to be lost, with why (on torch 2.13 the default step boundary leaves torch's profiler session
    inactive) — never a shard without an event, which the report read as a run without steps. With --step-on manual
    and distprof.step() after each iteration, as the loss message says, the window is recorded."""
    from conftest import python
    from distprof.capture.windows import NO_EVENTS
    from distprof.storage import find_shards, read_shard

    script = tmp_path / "ca.py"
    script.write_text(
        "import sys, torch, torch.nn as nn, torch.distributed as dist\n"
        "import distprof\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "torch._dynamo.config.compiled_autograd = True\n"
        "torch._dynamo.config.optimize_ddp = 'python_reducer'\n"
        "model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
        "x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))\n"
        "@torch.compile(backend='eager')\n"
        "def train_step():\n"
        "    opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()\n"
        "for _ in range(12):\n"
        "    train_step()\n"
        "    if sys.argv[1:] == ['manual']:\n"
        "        distprof.step()\n"
        "print('trained')\n")
    for steps in ("optimizer", "manual"):
        proc = python(["-m", "distprof.launch", "--out", steps, "--watch", "--step-on", steps, str(script), steps],
                      cwd=tmp_path, timeout=300)
        assert "trained" in proc.stdout
        shards = [read_shard(p) for p in find_shards(only_run_dir(tmp_path / steps))]
        assert all(len(s.table("events", ["ts_ns"])["ts_ns"]) > 0 for s in shards)
        if steps == "manual":
            assert len(shards) == 1 and shards[0].attrs["steps_covered"] == DEFAULT_STEPS, proc.stderr[-3000:]
        elif not shards:
            assert f"lost 1 window(s): w0000 (steps 5-9): {NO_EVENTS}" in proc.stderr, proc.stderr[-3000:]
