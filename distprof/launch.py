"""Profile an unchanged training script on every rank.

    torchrun --nproc_per_node=N -m distprof.launch [distprof options] train.py [script args]
    mpiexec -n N python -m distprof.launch [distprof options] train.py [script args]
    srun python -m distprof.launch [distprof options] train.py [script args]  (one Slurm task per rank)
    python -m distprof.launch [distprof options] train.py [script args]      (single process)

Under mpiexec or srun the torchrun-style variables the script expects (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) are set from the launcher's own where missing (distprof.capture.env).
The script runs as `__main__` with its own argv. Every rank profiles the same global steps (advanced by the
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
from .config import ProfileConfig, ScheduleConfig, config_from_mapping
from .errors import ConfigError

log = logging.getLogger("distprof.launch")


def get_args_parser() -> argparse.ArgumentParser:
    d, s = ProfileConfig(), ScheduleConfig()
    p = argparse.ArgumentParser(
        prog="python -m distprof.launch",
        description=__doc__.split("\n\n")[0].strip() + " Run under torchrun, mpiexec or srun for several ranks.",
        epilog="Every option can also be set as DISTPROF_<NAME> (dashes become underscores); the flag wins. "
        "Test-only: DISTPROF_SIM_HOSTS / DISTPROF_SIM_CLOCKS simulate several hosts (docs/shard-format.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_output_args(p, d)
    _add_schedule_args(p, d, s)
    _add_record_args(p, d)
    _add_behaviour_args(p, d)
    _add_trigger_args(p, d)
    _add_watch_args(p, d)
    p.add_argument("script", help="the training script, run unchanged as __main__")
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


def _add_trigger_args(p: argparse.ArgumentParser, d: ProfileConfig) -> None:
    """The options of on-demand windows, asked for with `distprof trigger` (defaults shown from `d`)."""
    g = p.add_argument_group("on-demand windows (distprof trigger RUN_DIR)")
    _bool(g, "trigger", d.trigger, "answer `distprof trigger`: rank 0 looks for a request in the run directory, the "
                                   "other ranks learn the window through the c10d store, on side threads")
    g.add_argument("--trigger-poll", dest="trigger_poll_s", type=float, default=None,
                   help="seconds between two looks for a request (rank 0) and, at least, between two store checks of "
                        "each other rank (more apart with many ranks: at most 200 checks/s in all) "
                        f"[{d.trigger_poll_s:g}]")
    g.add_argument("--trigger-margin", type=int, default=None,
                   help="fewest steps between rank 0 taking a request and the window's first (warm-up) step; more "
                        "when the ranks need longer to hear of it at the job's step rate (`distprof trigger --in` "
                        f"overrides it per request) [{d.trigger_margin}]")


def _add_watch_args(p: argparse.ArgumentParser, d: ProfileConfig) -> None:
    """The options of the always-on watch (defaults shown from `d`)."""
    g = p.add_argument_group("always-on watch (docs/watch.md)")
    _bool(g, "watch", d.watch, "time every step on every rank (step, data wait, optimizer, blocked in communication, "
                               "device memory peak) into RUN_DIR/watch/, and ask for a window when a rank drifts")
    g.add_argument("--watch-interval", dest="watch_interval_s", type=float, default=None,
                   help="seconds between two flushes of each rank's series and publications of its own work (rank 0 "
                        f"reads at most 100 ranks' per second) [{d.watch_interval_s:g}]")
    g.add_argument("--watch-threshold", type=float, default=None,
                   help="a rank drifts when its own work per step (step time minus time blocked in communication) "
                        f"exceeds the other ranks' median by more than this fraction ... [{d.watch_threshold:g}]")
    g.add_argument("--watch-steps", type=int, default=None,
                   help=f"... for this many consecutive steps [{d.watch_steps}]")
    g.add_argument("--watch-cooldown", dest="watch_cooldown_s", type=float, default=None,
                   help=f"seconds between two windows asked for by the watch [{d.watch_cooldown_s:g}]")


def _bool(group, name: str, default: bool, help_text: str) -> None:
    group.add_argument(f"--{name}", dest=name, action=argparse.BooleanOptionalAction, default=None,
                       help=f"{help_text} [{'on' if default else 'off'}]")


def config_from_args(args: argparse.Namespace) -> ProfileConfig:
    values = {k: v for k, v in vars(args).items() if k not in ("script", "script_args")}
    return config_from_mapping(values)


def run(config: ProfileConfig, script: str, script_args: list[str]) -> None:
    """Run `script` as __main__ under a RankProfiler; exceptions and SystemExit pass through after close(), which
    prints this rank's closing line (also when a signal ends the job: capture.signals)."""
    from .capture.profiler import RankProfiler

    prof = RankProfiler(config)
    prof.on_closed = _print_closing_line
    sys.argv = [script, *script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    prof.start()
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        prof.close()


def _print_closing_line(prof) -> None:
    """One line per rank on stderr: where the shards went, what was lost and why (rank 0 always speaks)."""
    line = prof.closing_line()
    if line:
        print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = get_args_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as e:
        parser.error(str(e))
    if not os.path.isfile(args.script):
        parser.error(f"script {args.script!r} not found")
    launch_env.prepare()  # mpiexec / srun: RANK, WORLD_SIZE, MASTER_ADDR, ... for the script where missing
    _recorded(run)(config, args.script, args.script_args)


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
