"""capture/compiled.py in one process: a hook behind opaque() runs eagerly, once per call, wherever Dynamo meets it;
torch.compile is wrapped only until the job first compiles, and torch._dynamo is never imported for a job that does
not. (The real jobs: tests/test_compile_jobs.py.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT

torch = pytest.importorskip("torch")


def run_py(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=240, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_job_that_never_compiles_never_imports_dynamo():
    out = run_py("""
        import sys, torch
        from distprof.capture import compiled
        compiled.install()
        wrapped = getattr(torch.compile, "__distprof_compile__", None) is not None
        hook = compiled.opaque(lambda x: x + 1)
        assert hook(1) == 2
        compiled.remove()
        print(wrapped, "torch._dynamo" in sys.modules, hasattr(torch.compile, "__distprof_compile__"),
              compiled.sealed())
    """)
    assert out.split() == ["True", "False", "False", "False"]


def test_hooks_run_eagerly_once_per_call_inside_compiled_code():
    """A hook made before the job's first torch.compile, reached inside the compiled function (where Dynamo would
    trace it) and from eager code: it runs every time, never traced (is_compiling False inside it), and Dynamo
    compiles none of its frames."""
    out = run_py("""
        import torch
        from distprof.capture import compiled
        compiled.install()
        seen = []
        def hook(x):
            seen.append(torch.compiler.is_compiling())
            return None
        t = compiled.opaque(hook)
        @torch.compile(backend="eager")
        def f(x):
            t(x)
            return x * 2
        for _ in range(3):
            assert f(torch.ones(2)).sum().item() == 4.0
        t(0)
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
        print(compiled.sealed(), seen, len(_debug_get_cache_entry_list(hook.__code__)))
        compiled.remove()
        assert not hasattr(torch.compile, "__distprof_compile__")
    """)
    assert out.split(maxsplit=1)[0] == "True"
    assert out.split(maxsplit=1)[1].strip() == "[False, False, False, False] 0"


def test_install_seals_at_once_when_dynamo_is_loaded():
    out = run_py("""
        import torch, torch._dynamo
        from distprof.capture import compiled
        compiled.install()
        print(compiled.sealed(), hasattr(torch.compile, "__distprof_compile__"))
    """)
    assert out.split() == ["True", "False"]


MODES = ("none", "model", "inplace")
OPTIMIZERS = ("eager", "compiled")


@pytest.fixture(scope="module")
def boundaries() -> dict[tuple[str, str], list[str]]:
    """One process, DDP on a 1-rank gloo group, each style in turn: where each iteration's boundary fired."""
    out = run_py(f"""
        import traceback, torch, torch.nn as nn, torch.distributed as dist
        from distprof.capture import compiled
        from distprof.capture.stepper import OptimizerStepper
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        compiled.install()
        for mode in {MODES!r}:
            for optimizer in {OPTIMIZERS!r}:
                where = []
                def on_iteration():
                    names = [f.name for f in traceback.extract_stack()]
                    where.append("forward" if "_forward_pre" in names else "optimizer")
                stepper = OptimizerStepper(on_iteration)
                stepper.install()
                m = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)))
                if mode == "inplace":
                    m.compile(backend="eager")
                elif mode == "model":
                    m = torch.compile(m, backend="eager")
                opt = torch.optim.AdamW(m.parameters())
                step = torch.compile(lambda: opt.step(), backend="eager") if optimizer == "compiled" else opt.step
                for _ in range(5):
                    m(torch.ones(1, 2)).sum().backward()
                    step()
                stepper.remove()
                print(mode, optimizer, *where, stepper.iterations)
    """)
    return {tuple(line.split()[:2]): line.split()[2:] for line in out.splitlines()}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_the_step_boundary_stays_at_the_forward(boundaries, mode, optimizer):
    """DDP without compile, under torch.compile(model) and under model.compile(), the optimizer step compiled or not:
    every iteration after the first ends at the next forward (the forward pre-hook), never at an optimizer step."""
    assert boundaries[mode, optimizer] == ["forward"] * 4 + ["5"]
