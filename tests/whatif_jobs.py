"""Jobs for the what-if and diff tests. Real torchrun jobs, run once per pytest process and shared by the test
modules: ``examples/ddp_mlp.py`` on 2 ranks (gloo, CPU), small enough that compute stays well below the injected
delay (ranks share the machine's cores: a large model's compute would change when a rank stops sleeping), and
``benchmarks/_whatif_job.py`` with a delay placed anywhere in the iteration. And :func:`simulated_run`: a two-rank job
whose times are computed exactly, for the chained replay's tests."""

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


#: benchmarks/_whatif_job.py: accelerator-like steps (40 ms of device sleep per iteration, a tiny model) with a delay
#: placed anywhere in the iteration on rank 1.
PLACED_JOB = EXAMPLES.parent / "benchmarks" / "_whatif_job.py"
PLACED_DEVICE_MS = 40.0
#: 12 recorded steps: medians over them hold when the machine holds a step or two off.
PLACED_SCHEDULE = ["--wait", "2", "--warmup", "1", "--active", "12"]
PLACED_CYCLE = 15  # iterations per window of PLACED_SCHEDULE


#: _whatif_job.py's model with a DDP bucket per block: six bucket all-reduces per step, queued on gloo's two workers
MANY_BUCKETS = ("--blocks", "6", "--dim", "256", "--bucket-mb", "0.25")


def placed_job(tmp_path_factory, job: str, place: str, delay_ms: float, *, alternate: int = 0,
               extra: tuple[str, ...] = ()) -> Path:
    """The run directory (run once per session) of benchmarks/_whatif_job.py `job` ("ddp", "fsdp2", "loop") under
    ``distprof.launch`` on 2 ranks, rank 1 spending `delay_ms` more per iteration at `place` (0: none). `alternate`:
    that many windows, the delay only in the even ones (:func:`alternate_windows` gives their steps). `extra`: more
    arguments of the job (its model: MANY_BUCKETS)."""
    name = f"{job}-{place}-{delay_ms:g}-{alternate}" + "".join(extra)
    if name not in _CACHE:
        d = tmp_path_factory.mktemp(f"whatif-{name}")
        cycle = PLACED_CYCLE if alternate else 0
        windows = max(alternate, 1)
        torchrun(2, ["-m", "distprof.launch", "--out", "out", *PLACED_SCHEDULE, "--repeat", str(windows),
                     str(PLACED_JOB), "--job", job, "--place", place, "--delay-ms", f"{delay_ms:g}",
                     "--device-ms", f"{PLACED_DEVICE_MS:g}", "--delay-cycle", str(cycle),
                     "--steps", str(windows * PLACED_CYCLE + 2), *extra], cwd=d, env=job_env())
        _CACHE[name] = only_run_dir(d / "out")
    return _CACHE[name]


def alternate_windows(n: int) -> list[tuple[int, int]]:
    """The (first, last) recorded step of each of `n` windows of PLACED_SCHEDULE (even: with the delay)."""
    return [(k * PLACED_CYCLE + 3, (k + 1) * PLACED_CYCLE - 1) for k in range(n)]


def twins(tmp_path_factory) -> tuple[Path, Path]:
    """Two runs of the unchanged job, run at the same time: whatever else loads the machine loads both alike (run one
    after the other, two runs of the same job differ here by 20-30 % with the load of the moment)."""
    if "twin-a" not in _CACHE:
        with ThreadPoolExecutor(2) as pool:
            a, b = [pool.submit(_launch, tmp_path_factory, n, 0.0, TWIN_WORKLOAD) for n in ("twin-a", "twin-b")]
            _CACHE["twin-a"], _CACHE["twin-b"] = a.result(), b.result()
    return _CACHE["twin-a"], _CACHE["twin-b"]


# ---- a simulated job: exact times, for the chained replay's tests ---------------------------------------------------
MS = 1_000_000


def simulated_run(*, steps: int = 6, first: int = 2, windows: int = 1, gap_steps: int = 0,
                  pre: dict[tuple[int, int], float] | None = None, mid: dict[tuple[int, int], float] | None = None,
                  work_ms: float = 30.0, transfer_ms: float = 1.0, opt_ms: float = 2.0, buckets: int = 1,
                  lanes: int = 1):
    """Two ranks, DDP-like: per iteration each rank works `work_ms` (+ ``mid[(rank, it)]``: between forward and
    backward), arrives at one all-reduce that moves for `transfer_ms` after the later arrival, runs its optimizer
    (`opt_ms`), then waits ``pre[(rank, it + 1)]`` before the next forward (a DataLoader wait, a step-begin callback).
    Steps begin at each forward, as the capture's do, so a pre-forward delay is in the previous step's tail. Records
    `windows` windows of `steps` steps from iteration `first`, `gap_steps` unrecorded iterations between them. The
    run object has what the step graph and the what-if read (steps, collectives, p2p, names).

    `buckets` > 1: the backward's last `buckets` shares of `work_ms` each end with a bucket ready for its all-reduce,
    which runs on one of `lanes` communication lanes per rank (gloo's worker threads: bucket b on lane b % lanes) as
    soon as the bucket is ready and the lane's previous all-reduce has ended; an event's arrival is when it began on
    its lane, as gloo's worker records it. The optimizer follows the last bucket's end."""
    from types import SimpleNamespace

    import numpy as np

    from distprof.analysis.align.matching import match_collectives
    from distprof.analysis.align.p2p import match_p2p

    pre, mid = pre or {}, mid or {}
    recorded = [first + w * (steps + gap_steps) + k for w in range(windows) for k in range(steps)]
    n_it = recorded[-1] + 2
    fwd = np.zeros((2, n_it + 1))
    arrive, end = np.zeros((2, n_it, buckets)), np.zeros((2, n_it, buckets))
    share = work_ms / (2 * buckets) if buckets > 1 else 0.0  # each bucket's share of the backward's work
    for it in range(n_it):
        free = np.zeros((2, lanes))  # each rank's lanes, free from the iteration's start
        for b in range(buckets):
            ready = np.array([fwd[r, it] + work_ms - (buckets - 1 - b) * share + mid.get((r, it), 0.0)
                              for r in range(2)])
            a = np.maximum(ready, free[:, b % lanes])
            arrive[:, it, b], end[:, it, b] = a, a.max() + transfer_ms
            free[:, b % lanes] = end[:, it, b]
        for r in range(2):
            fwd[r, it + 1] = end[r, it].max() + opt_ms + pre.get((r, it + 1), 0.0)
    rows = [(r, w, it, b) for w in range(windows) for it in recorded[w * steps:(w + 1) * steps] for b in range(buckets)
            for r in range(2)]
    rank = np.array([r for r, _, _, _ in rows], np.int32)
    window = np.array([w for _, w, _, _ in rows], np.int32)
    step = np.array([it for _, _, it, _ in rows], np.int64)
    bucket = np.array([b for _, _, _, b in rows], np.int64)
    i64 = lambda v: (np.asarray(v) * MS).astype(np.int64)  # noqa: E731
    coll = {"rank": rank, "window": window, "pg": np.zeros(rank.size, np.int32),
            "seq": np.array([(recorded.index(it) % steps) * buckets + b for it, b in zip(step, bucket)], np.int32),
            "op_id": np.zeros(rank.size, np.uint32), "bytes": np.full(rank.size, 64, np.int64),
            "start_ns": i64(arrive[rank, step, bucket]), "end_ns": i64(end[rank, step, bucket]), "step": step,
            "ev_row": np.arange(rank.size, dtype=np.int64), "exposed_ns": np.zeros(rank.size, np.int64)}
    rank_steps = [(r, w, it) for w in range(windows) for it in recorded[w * steps:(w + 1) * steps] for r in range(2)]
    rank = np.array([r for r, _, _ in rank_steps], np.int32)
    window = np.array([w for _, w, _ in rank_steps], np.int32)
    step = np.array([it for _, _, it in rank_steps], np.int64)
    start, stop = fwd[rank, step], fwd[rank, step + 1]
    st = {"rank": rank, "window": window, "step": step.astype(np.int32), "start_ns": i64(start),
          "end_ns": i64(stop), "step_ms": stop - start}
    no_p2p = {k: np.zeros(0, np.int64) for k in ("rank", "window", "pg", "peer", "bytes", "start_ns", "end_ns",
                                                   "step", "p2p_seq")}
    no_p2p["is_recv"] = np.zeros(0, bool)
    return SimpleNamespace(steps=st, collectives=match_collectives(coll), collective_rows=coll,
                           p2p=match_p2p(no_p2p, {0: [0, 1]}), names=np.array(["all_reduce"], dtype=object),
                           ranks={})
