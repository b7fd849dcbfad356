"""Profile an unchanged training script on every rank.

    torchrun --nproc_per_node=N -m distprof.launch [distprof options] train.py [script args]
    torchrun --nproc_per_node=N -m distprof.launch [distprof options] -m pkg.train [script args]
    mpiexec -n N python -m distprof.launch [distprof options] train.py|-m pkg.train [script args]
    srun python -m distprof.launch [distprof options] train.py|-m pkg.train [script args]  (one Slurm task per rank)
    python -m distprof.launch [distprof options] train.py|-m pkg.train [script args]      (single process, or a
                                                     script that starts its ranks with torch.multiprocessing.spawn)

With -m the target is a module, run as `python -m pkg.train` would run it (torchrun's -m): found on sys.path (the
current directory first), a package's __main__, relative imports, sys.argv[0] the module's file, __name__ ==
"__main__".

Under mpiexec or srun the torchrun-style variables the script expects (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) are set from the launcher's own where missing (distprof.capture.env).
The script (or module) runs as `__main__` with its own argv. Every rank profiles the same global steps (advanced by the
optimizer-step hook, or by `distprof.step()` with --step-on manual) and writes one HDF5 shard per finished window to
OUT/<run-id>/. The script's exit code and exceptions pass through unchanged; a profiler failure logs one warning and
training goes on (unless --strict).

Every option is also an environment variable DISTPROF_<OPTION> (e.g. DISTPROF_OUT, DISTPROF_ACTIVE,
DISTPROF_FLOPS=0); a flag given on the command line wins.
"""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys

from .capture import env as launch_env
from .config import ProfileConfig, ScheduleConfig, TriggerConfig, WatchConfig, config_from_mapping
from .errors import ConfigError
from .rank_entry import profiled_call, run_spawned, run_started

log = logging.getLogger("distprof.launch")


def get_args_parser() -> argparse.ArgumentParser:
    d, s = ProfileConfig(), ScheduleConfig()
    p = argparse.ArgumentParser(
        prog="python -m distprof.launch",
        description=__doc__.split("\n\n")[0].strip() + " Run under torchrun, mpiexec or srun for several ranks.",
        epilog="Every option can also be set as DISTPROF_<NAME> (dashes become underscores); the flag wins. "
        "Test-only: DISTPROF_SIM_HOSTS / DISTPROF_SIM_CLOCKS simulate several hosts (docs/shard-format.md).",
        # each option's help ends with its default in [brackets]: no argparse "(default: None)" beside it
        formatter_class=argparse.HelpFormatter,
    )
    p.usage = ("%(prog)s [distprof options] train.py [script args]\n"
               "       %(prog)s [distprof options] -m pkg.module [script args]")
    _add_output_args(p, d)
    _add_schedule_args(p, d, s)
    _add_record_args(p, d)
    _add_behaviour_args(p, d)
    _add_trigger_args(p, d.trigger)
    _add_watch_args(p, d.watch)
    p.add_argument("-m", "--module", action="store_true",
                   help="the target is a module, run as `python -m` runs it (a package's __main__, relative imports), "
                        "as torchrun's -m")
    p.add_argument("script", metavar="script|module", help="the training script (a path), or with -m a module name "
                                                           "(pkg.train), run unchanged as __main__")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    return p


def _add_output_args(p: argparse.ArgumentParser, d: ProfileConfig) -> None:
    """The options of where the shards go and how they are compressed (defaults shown from `d`)."""
    g = p.add_argument_group("output")
    g.add_argument("--out", default=None, help=f"directory for runs; the run goes to OUT/<run-id> [{d.out}]")
    g.add_argument("--run-id", default=None,
                   help="run id shared by all ranks [SLURM_JOB_ID, else TORCHELASTIC_RUN_ID, else made by rank 0]")
    g.add_argument("--codec", choices=("zstd", "gzip"), default=None,
                   help=f"shard compression: zstd (smallest, fastest; needs hdf5plugin to read) or gzip (readable "
                        f"by any HDF5 tool) [{d.codec}]")
    g.add_argument("--summaries", dest="summaries", action=argparse.BooleanOptionalAction, default=None,
                   help="store the rank's summary in its shard, computed on the writer thread, when the schedule "
                        "records one window (the report then reads the summaries, not every event) "
                        f"[{'on' if d.summaries else 'off'}]")


def _add_schedule_args(p: argparse.ArgumentParser, d: ProfileConfig, s: ScheduleConfig) -> None:
    """The options of which global steps are recorded, and what advances a step (defaults shown from `d`, `s`)."""
    g = p.add_argument_group("schedule (global steps; same meaning as torch.profiler.schedule)")
    g.add_argument("--wait", type=int, default=None, help=f"idle steps at the start of each cycle [{s.wait}]")
    g.add_argument("--warmup", type=int, default=None, help=f"warm-up steps before recording [{s.warmup}]")
    g.add_argument("--active", type=int, default=None, help=f"recorded steps per window [{s.active}]")
    g.add_argument("--repeat", type=int, default=None, help=f"number of windows, 0 = until the job ends [{s.repeat}]")
    g.add_argument("--skip-first", type=int, default=None,
                   help=f"steps to skip before the first cycle [{s.skip_first}]")
    g.add_argument("--schedule", choices=("steps", "none"), default=None,
                   help="steps: the windows above; none: no window of its own, only those asked for with "
                        f"`distprof trigger` [{s.kind}]")
    g.add_argument("--step-on", choices=("optimizer", "manual"), default=None,
                   help="what advances a step: the optimizer-step hook (no code change), or distprof.step() "
                        f"[{d.step_on}]")


def _add_record_args(p: argparse.ArgumentParser, d: ProfileConfig) -> None:
    """The options of what torch.profiler and distprof record in a window (defaults shown from `d`)."""
    g = p.add_argument_group("what to record")
    _bool(g, "flops", d.flops, "FLOPs of matmul/conv ops (with_flops)")
    _bool(g, "memory", d.memory, "allocator events, memory timeline and per-step peaks (profile_memory)")
    _bool(g, "shapes", d.shapes, "input shapes (record_shapes); gives collective message sizes on gloo")
    _bool(g, "stack", d.stack, "Python stacks (with_stack); costly")
    g.add_argument("--memory-history", dest="memory_history", action=argparse.BooleanOptionalAction, default=None,
                   help="CUDA only: record the allocator's alloc/free history in each window (per-step peaks, "
                        "largest blocks with their stacks) and keep the raw snapshot for pytorch.org/memory_viz "
                        f"[{'on' if d.memory_history else 'off'}]")
    g.add_argument("--memory-history-entries", dest="memory_history_entries", type=int, default=None,
                   help=f"most allocator entries kept per window with --memory-history [{d.memory_history_entries}]")
    g.add_argument("--cpu-sample-ms", dest="cpu_sample_ms", type=float, default=None,
                   help="while recording, sample the training thread's wait for a CPU this often (ms; 0 off): tells "
                        f"a rank's own work from time the host's other processes held its cores [{d.cpu_sample_ms:g}]")


def _add_behaviour_args(p: argparse.ArgumentParser, d: ProfileConfig) -> None:
    """The options of strict mode and the clock sync (defaults shown from `d`)."""
    g = p.add_argument_group("behaviour")
    _bool(g, "strict", d.strict, "raise on profiler errors instead of warning and letting training go on")
    g.add_argument("--sync-rounds", type=int, default=None,
                   help=f"clock-sync ping-pongs per host leader at each window start and end [{d.sync_rounds}]")
    g.add_argument("--sync-timeout", dest="sync_timeout_s", type=float, default=None,
                   help="seconds a clock-sync message may wait for its peer (on a side thread; training never "
                        f"waits for it), and the reference rank for the host leaders at close [{d.sync_timeout_s:g}]")


def _add_trigger_args(p: argparse.ArgumentParser, t: TriggerConfig) -> None:
    """The options of on-demand windows, asked for with `distprof trigger` (defaults shown from `t`)."""
    g = p.add_argument_group("on-demand windows (distprof trigger RUN_DIR)")
    _bool(g, "trigger", t.enabled, "answer `distprof trigger`: rank 0 looks for a request in the run directory, the "
                                   "other ranks learn the window through the c10d store, on side threads")
    g.add_argument("--trigger-poll", dest="trigger_poll_s", type=float, default=None,
                   help="seconds between two looks for a request (rank 0) and, at least, between two store checks of "
                        "each other rank (more apart with many ranks: at most 200 checks/s in all) "
                        f"[{t.poll_s:g}]")
    g.add_argument("--trigger-margin", type=int, default=None,
                   help="fewest steps between rank 0 taking a request and the window's first (warm-up) step; more "
                        "when the ranks need longer to hear of it at the job's step rate (`distprof trigger --in` "
                        f"overrides it per request) [{t.margin}]")


def _add_watch_args(p: argparse.ArgumentParser, w: WatchConfig) -> None:
    """The options of the always-on watch (defaults shown from `w`)."""
    g = p.add_argument_group("always-on watch (docs/watch.md)")
    _bool(g, "watch", w.enabled, "time every step on every rank (step, data wait, optimizer, blocked in communication, "
                               "device memory peak) into RUN_DIR/watch/, and ask for a window when a rank drifts")
    g.add_argument("--watch-interval", dest="watch_interval_s", type=float, default=None,
                   help="seconds between two flushes of each rank's series and publications of its own work (rank 0 "
                        f"reads at most 100 ranks' per second) [{w.interval_s:g}]")
    g.add_argument("--watch-threshold", type=float, default=None,
                   help="a rank drifts when its own work per step (step time minus time blocked in communication) "
                        f"exceeds the other ranks' median by more than this fraction ... [{w.threshold:g}]")
    g.add_argument("--watch-steps", type=int, default=None,
                   help=f"... for this many consecutive steps [{w.steps}]")
    g.add_argument("--watch-cooldown", dest="watch_cooldown_s", type=float, default=None,
                   help=f"seconds between two windows asked for by the watch [{w.cooldown_s:g}]")


def _bool(group, name: str, default: bool, help_text: str) -> None:
    group.add_argument(f"--{name}", dest=name, action=argparse.BooleanOptionalAction, default=None,
                       help=f"{help_text} [{'on' if default else 'off'}]")


def config_from_args(args: argparse.Namespace) -> ProfileConfig:
    values = {k: v for k, v in vars(args).items() if k not in ("script", "script_args", "module")}
    return config_from_mapping(values)


def run(config: ProfileConfig, script: str, script_args: list[str], *, module: bool = False) -> None:
    """Run `script` (a path, or with `module` a module name) as __main__ under a RankProfiler (:func:`profiled_call`).
    Processes the script starts with torch.multiprocessing.spawn are the job's ranks, each profiled, this one their
    launcher (capture/spawned.py)."""
    from .capture import spawned
    from .capture.profiler import RankProfiler
    from .source_summary import summarize_shard

    prof = RankProfiler(config, summarizer=summarize_shard)
    sys.argv = [script, *script_args]  # runpy sets argv[0] to the module's file, as python -m does
    if module:
        if os.getcwd() not in sys.path:  # python -m puts the current directory first
            sys.path.insert(0, os.getcwd())
        target = lambda: runpy.run_module(script, run_name="__main__", alter_sys=True)  # noqa: E731
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        target = lambda: runpy.run_path(script, run_name="__main__")  # noqa: E731
    spawned.install(prof, config, run_spawned, run_started)
    try:
        profiled_call(prof, target)
    finally:
        spawned.uninstall()


def find_module(name: str) -> str | None:
    """Why `python -m name` would not find `name` (None: it would), without running any of it.

    Each dotted part is looked for in the package found before it (its __path__, read with the path finders: the
    packages' __init__ is not run), the first on sys.path; a package needs a __main__ module.
    """
    from importlib.machinery import PathFinder
    from importlib.util import find_spec

    if not name or not all(p.isidentifier() for p in name.split(".")):
        return f"module name {name!r} is not a dotted Python name (pkg.module)"
    parts = name.split(".")
    try:
        spec = find_spec(parts[0])
    except (ImportError, ValueError):
        spec = None
    where = f"on sys.path (the current directory {os.getcwd()} first)"
    for i in range(len(parts)):
        if spec is None:
            return f"no module named {'.'.join(parts[:i + 1])!r}: looked {where}"
        if i + 1 == len(parts):
            break
        locations = spec.submodule_search_locations
        if locations is None:
            return f"{'.'.join(parts[:i + 1])!r} ({spec.origin}) is a module, not a package: it has no {parts[i + 1]!r}"
        where = f"in the package {'.'.join(parts[:i + 1])} ({', '.join(locations)})"
        spec = PathFinder.find_spec(".".join(parts[:i + 2]), list(locations))
    if spec.submodule_search_locations is not None and \
            PathFinder.find_spec(f"{name}.__main__", list(spec.submodule_search_locations)) is None:
        return (f"{name!r} is a package without a __main__.py ({', '.join(spec.submodule_search_locations)}): "
                f"name the module to run (-m {name}.train) or add {name.replace('.', '/')}/__main__.py")
    return None


def main(argv: list[str] | None = None) -> None:
    parser = get_args_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as e:
        parser.error(str(e))
    problem = find_module(args.script) if args.module else _script_problem(args.script)
    if problem:
        print(f"{parser.prog}: error: {problem}", file=sys.stderr)  # one line, not the whole usage
        sys.exit(2)
    from .capture.rundir import check_out

    bad_out = check_out(config.out)  # a dangling --out: said now, before training starts
    if bad_out:
        print(f"{parser.prog}: error: {bad_out}", file=sys.stderr)
        sys.exit(2)
    launch_env.prepare()  # mpiexec / srun: RANK, WORLD_SIZE, MASTER_ADDR, ... for the script where missing
    _recorded(run)(config, args.script, args.script_args, module=args.module)


def _script_problem(script: str) -> str | None:
    if os.path.isfile(script):
        return None
    hint = ""
    if not script.endswith(".py") and os.sep not in script and find_module(script) is None:
        hint = f"; to run the module {script}, put -m before it"
    return f"script {script!r} not found (looked for the file {os.path.abspath(script)}){hint}"


def _recorded(fn):
    """torchrun's @record: an uncaught exception reaches torchrun's error summary (TORCHELASTIC_ERROR_FILE)."""
    if not os.environ.get("TORCHELASTIC_ERROR_FILE"):
        return fn
    try:
        from torch.distributed.elastic.multiprocessing.errors import record
    except ImportError:
        return fn
    return record(fn)


if __name__ == "__main__":
    main()
