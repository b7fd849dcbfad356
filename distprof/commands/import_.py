"""``distprof import PATH... -o RUN_DIR``: Kineto chrome traces (torch.profiler JSON) -> a distprof run directory."""

from __future__ import annotations

import argparse
import sys


def register(sub) -> None:
    p = sub.add_parser(
        "import",
        help="convert Kineto/torch.profiler JSON traces into a run directory for `distprof report`",
        description="Read Kineto chrome-trace files (.json or .json.gz; files or directories: TensorBoard "
                    "*.pt.trace.json.gz, rank-N.json.gz) and write one shard per rank into RUN_DIR. Rank and world "
                    "size come from the trace's distributedInfo, else from rank-N in the file name, else --rank; a "
                    "single file that names none is rank 0 of 1. A trace without ProfilerStep# is analysed by its "
                    "top-level user regions, its CUDA-graph replays or as one step (the import says which). Under "
                    "mpiexec / srun (mpi4py) the files are split over the MPI processes; the shards are those of a "
                    "serial import.",
    )
    p.add_argument("paths", metavar="PATH", nargs="+", help="trace files or directories holding them")
    p.add_argument("-o", "--out", metavar="RUN_DIR", required=True, help="run directory to write (created)")
    p.add_argument("--run-id", metavar="ID", help="run id stored in the shards (default: RUN_DIR's name)")
    p.add_argument("--world-size", metavar="N", type=int, help="ranks in the job (default: from the traces)")
    p.add_argument("--rank", metavar="N", type=int,
                   help="rank of a single trace that names none (without it: rank 0)")
    p.add_argument("--one-host", action="store_true",
                   help="all traces come from one machine (one clock): no clock alignment between ranks")
    p.add_argument("--force", action="store_true", help="replace shards already in RUN_DIR")
    p.add_argument("--codec", choices=("zstd", "gzip"), default="zstd", help="shard compression (default zstd)")
    p.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..analysis.summarize.engine import mpi_world
    from ..errors import ConfigError
    from ..importers.run import import_traces
    from ._common import _other_srun_task

    if args.world_size is not None and args.world_size < 1:
        raise ConfigError(f"--world-size {args.world_size}: must be >= 1")
    if args.rank is not None and args.rank < 0:
        raise ConfigError(f"--rank {args.rank}: must be >= 0")
    comm = mpi_world()
    if comm is None and _other_srun_task("import"):  # N serial imports would race for the same run directory
        return 0
    res = import_traces(args.paths, args.out, run_id=args.run_id, world_size=args.world_size, rank=args.rank,
                        one_host=args.one_host, force=args.force, codec=args.codec,
                        progress=False if args.no_progress else None, comm=comm)
    if res is None:  # an MPI process other than rank 0: its share of the files is written, rank 0 reports
        return 0
    rate = res.n_events / res.seconds if res.seconds > 0 else float("inf")
    sys.stdout.write(f"imported {len(res.shards)} trace(s), ranks {res.ranks[0]}..{res.ranks[-1]} of "
                     f"{res.world_size}, {res.n_events:,} events, {res.raw_bytes / 1e6:.1f} MB JSON in "
                     f"{res.seconds:.2f} s ({rate:,.0f} events/s) -> {res.run_dir}\n")
    return 0
