"""Scripts that start their ranks themselves with ``torch.multiprocessing.spawn`` — PyTorch's DDP tutorial and many
scripts written from it (``mp.spawn(demo_basic, args=(world_size,), nprocs=world_size)``), run as
``python -m distprof.launch train.py``.

The launcher's process is then no rank: the ranks are the processes the script starts, each calling
``fn(i, *args)`` and making the process group itself. While the launcher runs the script, :func:`install` wraps
``torch.multiprocessing.start_processes`` (what ``spawn`` calls): at the call the launcher's profiler steps aside
(:meth:`RankProfiler.hand_over`: it claims the run directory and closes without a status file of its own), and each
process runs :class:`SpawnedRank` instead of `fn` — a profiler around ``fn(i, *args)`` with the launcher's options,
whose rank 0 takes the launcher's run directory as the same job, so that the run is one directory, as under torchrun.
A process learns its rank where the script makes its process group, as a torchrun worker whose script does. `fn`'s
exceptions and exit codes pass through unchanged (torch reports them to the script as it would).

Not wrapped — the processes then run unprofiled, as before: a launcher that is itself a rank (torchrun, mpiexec),
one that has already seen a training step (the script trains, then starts helpers), and processes started any other
way (``multiprocessing.Process``, DataLoader workers).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable

from ..config import ProfileConfig
from . import setup as run_setup
from .rundir import JobIdentity

log = logging.getLogger(__name__)

_MODULE = "torch.multiprocessing.spawn"
_installed: list[tuple[Any, str, Any]] = []  # (module, attribute, original)


#: The launcher's way of running a rank: runner(config, inherited run, call) runs `call()` under a profiler of that
#: rank (distprof.rank_entry.run_spawned); a module-level function, pickled by reference.
Runner = Callable[[ProfileConfig, "tuple[str, JobIdentity] | None", Callable[[], Any]], Any]


class SpawnedRank:
    """What each started process runs instead of `fn`: `fn(i, *args)` under a profiler with the launcher's options
    (`runner`). Picklable (`fn` and `runner` by reference, as torch requires of `fn`; the options a dataclass)."""

    def __init__(self, fn: Callable[..., Any], config: ProfileConfig, nprocs: int,
                 inherited: tuple[str, JobIdentity] | None, runner: Runner) -> None:
        self.fn = fn
        self.config = config
        self.nprocs = nprocs
        self.inherited = inherited
        self.runner = runner

    def __call__(self, i: int, *args: Any) -> Any:
        run_setup.expect_spawned_ranks(self.nprocs)
        return self.runner(self.config, self.inherited, lambda: self.fn(i, *args))


def install(prof, config: ProfileConfig, runner: Runner) -> None:
    """The launcher, before the script runs: ``torch.multiprocessing``'s start_processes (and the name the package
    re-exports) wrapped while `prof` is the launcher's profiler; each process started runs its function through
    `runner`. Does nothing where torch has no such function."""
    try:
        import torch.multiprocessing as tmp
        spawn_mod = sys.modules[_MODULE]
        original = spawn_mod.start_processes
    except (ImportError, KeyError, AttributeError) as e:
        log.debug("distprof: torch.multiprocessing.start_processes not found (%s): spawned ranks go unprofiled", e)
        return

    def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        fn = _ranks(fn, nprocs, prof, config, runner)
        return original(fn, args, nprocs, join, daemon, start_method)

    start_processes.__wrapped__ = original  # type: ignore[attr-defined]
    start_processes.__doc__ = original.__doc__
    for mod in (spawn_mod, tmp):
        if getattr(mod, "start_processes", None) is original:
            _installed.append((mod, "start_processes", original))
            mod.start_processes = start_processes


def uninstall() -> None:
    """Put back what :func:`install` wrapped (what was wrapped again since stays)."""
    while _installed:
        mod, name, original = _installed.pop()
        cur = getattr(mod, name, None)
        if getattr(cur, "__wrapped__", None) is original:
            setattr(mod, name, original)


def _ranks(fn, nprocs: int, prof, config: ProfileConfig, runner: Runner):
    """`fn` as the started processes run it: profiled once the launcher's profiler has stepped aside (a later call
    of the script's starts a job of its own: its rank 0 claims a run directory of its own); else `fn` as it is."""
    try:
        n = int(nprocs)
    except (TypeError, ValueError):
        return fn  # torch says what is wrong with it
    if n < 1 or isinstance(fn, SpawnedRank):
        return fn
    if prof.handed_over:
        inherited = None
    elif prof.can_hand_over():
        inherited = prof.hand_over()
    else:
        return fn
    log.info("distprof: the script starts %d process(es) with torch.multiprocessing: each is profiled as a rank "
             "(run %s)", n, inherited[0] if inherited else "claimed by their rank 0")
    return SpawnedRank(fn, config, n, inherited, runner)
