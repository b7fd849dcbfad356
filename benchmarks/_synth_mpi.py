"""benchmarks/synth.py split over MPI processes: `mpiexec -n P python benchmarks/_synth_mpi.py [synth.py args]`.

Every process computes the same job timeline and writes the shards of its ranks (rank r goes to process r mod P).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synth  # noqa: E402
from mpi4py import MPI  # noqa: E402


def main() -> None:
    comm = MPI.COMM_WORLD
    me, size = comm.Get_rank(), comm.Get_size()
    args = synth.parse_args()
    spec = synth.spec_from(args)
    t0 = time.perf_counter()
    n = synth.generate(spec, Path(args.out), ranks=range(me, spec.ranks, size), progress=me == 0,
                       summaries=args.summaries)
    total = comm.reduce(n, root=0)
    if me == 0:
        print(f"synth: {spec.ranks} ranks, {total:,} events in {time.perf_counter() - t0:.1f} s on {size} processes "
              f"-> {args.out}")


if __name__ == "__main__":
    main()
