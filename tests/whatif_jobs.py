"""Real torchrun jobs for the what-if and diff tests, run once per pytest process and shared by both test modules:
``examples/ddp_mlp.py`` on 2 ranks (gloo, CPU), small enough that compute stays well below the injected delay
(ranks share the machine's cores: a large model's compute would change when a rank stops sleeping)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conftest import EXAMPLES, job_env, only_run_dir, torchrun

#: The launcher's schedule: 2 idle steps, 1 warm-up, 8 recorded.
SCHEDULE = ["--wait", "2", "--warmup", "1", "--active", "8"]
#: ddp_mlp.py's workload: a tiny width and 20 ms per step in which every rank sleeps (standing in for accelerator
#: work, which does not compete for the host's CPU): on a loaded 2-core machine a CPU-only step of a few ms is
#: stretched several-fold by descheduling, and differently in every run.
WORKLOAD = ["--hidden", "32", "--batch", "8", "--base-ms", "20", "--steps", "13"]
#: The twins' workload: 50 ms of the step asleep. diff's 5 % floor stands for the run-to-run drift of accelerator-bound
#: steps; two side-by-side runs of the 20 ms workload, CPU-bound on a loaded 2-core host, once differed by 6.5 %
#: (62 ms steps, a fresh-clone CI run), a whole run on the busier core — drift that no step-to-step spread shows.
TWIN_WORKLOAD = [*WORKLOAD, "--base-ms", "50"]
#: The delay the tests inject (ms) on rank 1.
DELAY_MS = 25.0

_CACHE: dict[str, Path] = {}


def _launch(tmp_path_factory, name: str, slow_ms: float, workload: list[str] = WORKLOAD) -> Path:
    d = tmp_path_factory.mktemp(f"whatif-{name}")
    args = ["-m", "distprof.launch", "--out", "out", *SCHEDULE, str(EXAMPLES / "ddp_mlp.py"), *workload]
    if slow_ms > 0:
        args += ["--slow-rank", "1", "--slow-ms", f"{slow_ms:g}"]
    torchrun(2, args, cwd=d, env=job_env())
    return only_run_dir(d / "out")


def job(tmp_path_factory, name: str, slow_ms: float = 0.0) -> Path:
    """The run directory of job `name` (run once per session): 2 ranks, rank 1 slowed by `slow_ms` per step."""
    if name not in _CACHE:
        _CACHE[name] = _launch(tmp_path_factory, name, slow_ms)
    return _CACHE[name]


def twins(tmp_path_factory) -> tuple[Path, Path]:
    """Two runs of the unchanged job, run at the same time: whatever else loads the machine loads both alike (run one
    after the other, two runs of the same job differ here by 20-30 % with the load of the moment)."""
    if "twin-a" not in _CACHE:
        with ThreadPoolExecutor(2) as pool:
            a, b = [pool.submit(_launch, tmp_path_factory, n, 0.0, TWIN_WORKLOAD) for n in ("twin-a", "twin-b")]
            _CACHE["twin-a"], _CACHE["twin-b"] = a.result(), b.result()
    return _CACHE["twin-a"], _CACHE["twin-b"]
