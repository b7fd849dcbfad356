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

Processes the script starts one by one with ``multiprocessing.Process`` (``torch.multiprocessing.Process`` is the
same class; PyTorch's "Writing Distributed Applications" tutorial) may be ranks or helpers, which cannot be told
when they start. While the launcher runs, ``BaseProcess.start`` is wrapped too: a process whose target is the
script's own code (not a library's: DataLoader workers, pools and executors are left alone) runs it through
:class:`StartedRank` (a subclass's own ``run()`` too, as the instance's ``run``), which profiles nothing unless the process
makes a default process group — then, inside that registration, it starts a profiler as that rank
(``rank_entry.run_started``). The launcher's claimed run directory
is offered through a :class:`Handoff`: whichever takes it first keeps it — the started group's rank 0 (the run is
then one directory, the launcher closes without a status of its own), or the launcher at its first training step or
its close (a started group then claims a directory of its own).

Not wrapped — the processes then run unprofiled, as before: a launcher that is itself a rank (torchrun, mpiexec),
one that has already seen a training step (the script trains, then starts helpers), a process whose target (or
``run()``) is a library's, and processes started outside Python's multiprocessing.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import site
import sys
import sysconfig
import tempfile
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


#: The launcher's way of running a process the script started with multiprocessing.Process:
#: runner(config, handoff, call) runs `call()`, profiled from the moment the process makes a default process group
#: (distprof.rank_entry.run_started); module-level, pickled by reference.
StartedRunner = Callable[[ProfileConfig, "Handoff", Callable[[], Any]], Any]

_OWNER = "owner"


class Handoff:
    """The launcher's run directory, offered to the ranks its script starts with multiprocessing.Process. Whoever
    takes it first keeps it: a started group's rank 0 (as the same job: `inherited`), or the launcher at its first
    step or close. The token is a file created with O_EXCL in a private directory (``tempfile.mkdtemp``: 0700, this
    user's) that the launcher makes and removes; a process that finds it gone has not taken it. Picklable."""

    def __init__(self, inherited: tuple[str, JobIdentity] | None) -> None:
        self.inherited = inherited
        self.dir = tempfile.mkdtemp(prefix="distprof-handoff-")
        self._pid = os.getpid()

    def take(self, who: str) -> bool | None:
        """True when this call took the directory; False when someone else had; None when the token could not be
        made at all (the offer has ended: its directory is gone). Never raises."""
        try:
            fd = os.open(os.path.join(self.dir, _OWNER), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            return False
        except OSError:
            return None
        try:
            os.write(fd, who.encode()[:200])
        except OSError:
            pass
        finally:
            os.close(fd)
        return True

    def discard(self) -> None:
        """The offer ends (the launcher's process only: a forked child leaving through the launcher's code does not
        end its parent's offer)."""
        if os.getpid() == self._pid:
            shutil.rmtree(self.dir, ignore_errors=True)


class StartedRank:
    """What a process the script starts with multiprocessing.Process runs instead of its target: the target as it is,
    through `runner` (profiled only once the process makes a default process group). Picklable (the target by
    reference, as multiprocessing's spawn requires of it)."""

    def __init__(self, target: Callable[..., Any], config: ProfileConfig, handoff: Handoff,
                 runner: StartedRunner) -> None:
        self.target = target
        self.config = config
        self.handoff = handoff
        self.runner = runner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.runner(self.config, self.handoff, lambda: self.target(*args, **kwargs))


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    """Where library code lives: the standard library, site-packages (system and user), and distprof itself."""
    dirs = {p for k, p in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except AttributeError:  # a virtualenv's old site module
        pass
    dirs.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d)


def script_code(fn: Any) -> bool:
    """Whether `fn` is the script's own code (its module is the script, or a file outside the standard library,
    site-packages and distprof): a library's process target (a DataLoader worker loop, a pool's worker) is not."""
    fn = getattr(fn, "func", fn)  # functools.partial
    fn = getattr(fn, "__func__", fn)  # a bound method
    name = getattr(fn, "__module__", None) or type(fn).__module__
    if name in ("__main__", "__mp_main__"):
        return True
    path = getattr(sys.modules.get(name or ""), "__file__", None)
    if not path:
        return False
    return not os.path.realpath(path).startswith(_library_dirs())


def install(prof, config: ProfileConfig, runner: Runner, started_runner: StartedRunner | None = None) -> None:
    """The launcher, before the script runs: ``torch.multiprocessing``'s start_processes (and the name the package
    re-exports) wrapped while `prof` is the launcher's profiler; each process started runs its function through
    `runner`. Does nothing where torch has no such function. With `started_runner`, multiprocessing's
    ``BaseProcess.start`` too (the module docstring)."""
    if started_runner is not None:
        _wrap_process_start(prof, config, started_runner)
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
    """Put back what :func:`install` wrapped (what was wrapped again since stays); the run directory's offer ends (a
    started process that makes its group later claims a directory of its own)."""
    while _installed:
        mod, name, original = _installed.pop()
        cur = getattr(mod, name, None)
        if getattr(cur, "__wrapped__", None) is original:
            setattr(mod, name, original)
    while _handoffs:
        _handoffs.pop().discard()


_handoffs: list[Handoff] = []


def _wrap_process_start(prof, config: ProfileConfig, runner: StartedRunner) -> None:
    from multiprocessing import process as mp_process

    original = mp_process.BaseProcess.start

    def start(self):
        try:
            _as_started_rank(self, prof, config, runner)
        except Exception as e:  # noqa: BLE001 -- the process starts as the script asked, unprofiled
            log.debug("distprof: could not prepare a started process for profiling: %s", e)
        return original(self)

    start.__wrapped__ = original  # type: ignore[attr-defined]
    start.__doc__ = original.__doc__
    _installed.append((mp_process.BaseProcess, "start", original))
    mp_process.BaseProcess.start = start


def _as_started_rank(process, prof, config: ProfileConfig, runner: StartedRunner) -> None:
    """`process` (about to start) runs its target through `runner` when it may be a rank of a job the script starts:
    the target is the script's own code, torch is loaded, and the launcher is no rank and has seen no step."""
    from multiprocessing.process import BaseProcess

    target = getattr(process, "_target", None)
    own_run = type(process).run
    overridden = own_run is not BaseProcess.run  # a subclass's run(): the target, if any, is its business
    if isinstance(target, StartedRank) or isinstance(vars(process).get("run"), StartedRank):
        return
    if (target is None and not overridden) or not prof.can_hand_over():
        return
    if "torch" not in sys.modules or not script_code(own_run if overridden else target):
        return
    if prof.handoff is None:
        _handoffs.append(prof.offer_run_dir(Handoff))
    if overridden:  # the instance's run crosses with the process (a reference back to it pickles as one)
        process.run = StartedRank(functools.partial(own_run, process), config, prof.handoff, runner)
    else:
        process._target = StartedRank(target, config, prof.handoff, runner)


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
