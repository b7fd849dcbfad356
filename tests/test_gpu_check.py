"""tests/gpu/check_gpu.py: skips cleanly without CUDA, runs fully with it; its plumbing also runs on CPU (slow)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import ROOT, job_env

SCRIPT = ROOT / "tests" / "gpu" / "check_gpu.py"


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=job_env(), capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_gpu_check():
    proc = _run(timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if torch.cuda.is_available():
        assert "passed" in proc.stdout and "FAIL" not in proc.stdout, proc.stdout
        assert "ok   1gpu-none" in proc.stdout and "ok   2rank-" in proc.stdout
    else:
        assert proc.stdout.strip() == "skipped: no CUDA"


@pytest.mark.slow
def test_gpu_check_plumbing_on_cpu():
    if torch.cuda.is_available():
        pytest.skip("test_gpu_check runs the real thing")
    proc = _run("--allow-cpu", timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(ln.startswith("ok   1gpu-none") for ln in lines), proc.stdout
    assert any(ln.startswith("ok   2rank-gloo") and "gloo:all_reduce" in ln for ln in lines), proc.stdout
    assert lines[-1].startswith("passed")
