"""Where a report's memory goes once every rank is summarised: bytes per field of RankSummary, over all ranks.

    python benchmarks/summary_memory.py RUN_DIR [--tracemalloc] [--phases]

Prints, for each field of the per-rank summaries the report keeps (RunSummary.ranks), its bytes summed over ranks
and per rank: numpy arrays by their buffers plus their object headers, containers by their own size, strings once
(op names are interned: one copy serves every rank). With --tracemalloc, also the traced Python heap held after
summarising and the peak during build_report, with the ten allocation sites that hold the most. With --phases (it
implies --tracemalloc), the traced heap before, at the peak of and after each phase of build_report (the analyses it
calls, in order; the what-if schedule's build apart): where the report's peak is set. docs/scaling.md ("16,384 ranks",
"Each phase's peak") quotes it; the rank count of RUN_DIR scales every per-rank figure.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import tracemalloc
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def deep_bytes(v, seen: set[int]) -> int:
    """Bytes of `v` and what it holds, each object once (`seen`)."""
    if id(v) in seen:
        return 0
    seen.add(id(v))
    if isinstance(v, np.ndarray):
        own = sys.getsizeof(v) if v.base is None else sys.getsizeof(v) + v.nbytes
        if v.dtype.kind == "O":
            own += sum(deep_bytes(x, seen) for x in v.tolist())
        return own
    if isinstance(v, dict):
        return sys.getsizeof(v) + sum(deep_bytes(k, seen) + deep_bytes(x, seen) for k, x in v.items())
    if isinstance(v, (list, tuple, set)):
        return sys.getsizeof(v) + sum(deep_bytes(x, seen) for x in v)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return sys.getsizeof(v) + sum(deep_bytes(getattr(v, f.name), seen) for f in dataclasses.fields(v)) + (
            sys.getsizeof(v.__dict__) if hasattr(v, "__dict__") else 0)
    return sys.getsizeof(v)


def field_bytes(ranks: dict) -> dict[str, int]:
    seen: set[int] = set()
    out: dict[str, int] = defaultdict(int)
    for s in ranks.values():
        out["(the RankSummary objects)"] += sys.getsizeof(s) + sys.getsizeof(s.__dict__)
        for f in dataclasses.fields(s):
            out[f.name] += deep_bytes(getattr(s, f.name), seen)
    return dict(out)


#: The analyses build_report calls, by their names in its module (each one a phase), and the what-if schedule's build.
PHASES = ("find_stragglers", "step_graph", "pipelines", "comm_table", "critical_path_report", "estimator",
          "root_cause", "findings", "annotate_findings", "whatif_table", "overlap_by_rank", "imbalance",
          "memory_timeline", "gpu_time", "mfu")


def phase_peaks(run) -> list[tuple[str, int, int, int, float]]:
    """build_report(run) with each phase timed and traced: (phase, held before, peak, held after, CPU s), in call
    order. tracemalloc must be tracing."""
    from distprof.analysis.graph import whatif
    from distprof.analysis.report import build

    got: list[tuple[str, int, int, int, float]] = []

    def traced(name, f):
        def call(*a, **k):
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            t = time.process_time()
            out = f(*a, **k)
            after, peak = tracemalloc.get_traced_memory()
            got.append((name, before, peak, after, time.process_time() - t))
            return out
        return call

    saved = [(build, n, getattr(build, n)) for n in PHASES if hasattr(build, n)] + [(whatif, "schedule",
                                                                                     whatif.schedule)]
    for mod, n, f in saved:
        setattr(mod, n, traced("what-if schedule" if mod is whatif else n, f))
    try:
        build.build_report(run, release=True)  # as `distprof report` does
    finally:
        for mod, n, f in saved:
            setattr(mod, n, f)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--tracemalloc", action="store_true", help="also trace the Python heap (slower)")
    ap.add_argument("--phases", action="store_true", help="the traced heap of each phase of build_report")
    args = ap.parse_args()
    args.tracemalloc |= args.phases
    from distprof.analysis.report.build import build_report
    from distprof.analysis.summarize.engine import summarize

    if args.tracemalloc:
        tracemalloc.start(1)
    t0 = time.perf_counter()
    run = summarize(args.run_dir, progress=False)
    t1 = time.perf_counter()
    held = tracemalloc.get_traced_memory()[0] if args.tracemalloc else 0
    snap = tracemalloc.take_snapshot() if args.tracemalloc else None
    n = len(run.ranks)
    fb = field_bytes(run.ranks)
    total = sum(fb.values())
    print(f"{n} ranks summarised in {t1 - t0:.1f} s; the summaries hold {total / 1e6:.1f} MB "
          f"({total / n / 1e3:.1f} KB per rank)")
    print(f"{'field':<28} {'MB':>9} {'KB per rank':>12} {'share':>6}")
    for k, v in sorted(fb.items(), key=lambda kv: -kv[1]):
        print(f"{k:<28} {v / 1e6:>9.1f} {v / n / 1e3:>12.2f} {v / total:>6.1%}")
    ot = [s.op_totals for s in run.ranks.values() if s.op_totals.get("name") is not None]
    if ot:
        rows = sum(int(t["name"].size) for t in ot)
        row_b = sum(col.itemsize for col in ot[0].values())
        print(f"op_totals: {rows / n:.0f} rows per rank of {row_b} B ({', '.join(f'{c} {ot[0][c].dtype}' for c in ot[0])})")
    if args.phases:
        print(f"{'phase':<24} {'before MB':>10} {'peak MB':>8} {'after MB':>9} {'CPU s':>6}")
        for name, before, peak, after, cpu in phase_peaks(run):
            print(f"{name:<24} {before / 1e6:>10.0f} {peak / 1e6:>8.0f} {after / 1e6:>9.0f} {cpu:>6.2f}")
        return
    if args.tracemalloc:
        tracemalloc.reset_peak()
        build_report(run, release=True)
        peak = tracemalloc.get_traced_memory()[1]
        print(f"traced heap: {held / 1e6:.0f} MB held after summarising, {peak / 1e6:.0f} MB peak in build_report")
        for st in snap.statistics("lineno")[:10]:
            fr = st.traceback[0]
            print(f"  {st.size / 1e6:8.1f} MB  {Path(fr.filename).name}:{fr.lineno}")


if __name__ == "__main__":
    main()
