"""Real torchrun jobs for the what-if and diff tests, run once per pytest process and shared by both test modules:
``examples/ddp_mlp.py`` on 2 ranks (gloo, CPU), small enough that compute stays well below the injected delay
(ranks share the machine's cores: a large model's compute would change when a rank stops sleeping)."""

from __future__ import annotations

from pathlib import Path

from conftest import EXAMPLES, job_env, only_run_dir, torchrun

#: The launcher's schedule: 2 idle steps, 1 warm-up, 8 recorded.
SCHEDULE = ["--wait", "2", "--warmup", "1", "--active", "8"]
#: ddp_mlp.py's workload: a tiny width, so a step is a few ms here and CPU contention stays small in ms.
WORKLOAD = ["--hidden", "32", "--batch", "8", "--steps", "13"]
#: The delay the tests inject (ms) on rank 1.
DELAY_MS = 25.0

_CACHE: dict[str, Path] = {}


def job(tmp_path_factory, name: str, slow_ms: float = 0.0) -> Path:
    """The run directory of job `name` (run once per session): 2 ranks, rank 1 slowed by `slow_ms` per step."""
    if name not in _CACHE:
        d = tmp_path_factory.mktemp(f"whatif-{name}")
        args = ["-m", "distprof.launch", "--out", "out", *SCHEDULE, str(EXAMPLES / "ddp_mlp.py"), *WORKLOAD]
        if slow_ms > 0:
            args += ["--slow-rank", "1", "--slow-ms", f"{slow_ms:g}"]
        torchrun(2, args, cwd=d, env=job_env())
        _CACHE[name] = only_run_dir(d / "out")
    return _CACHE[name]
