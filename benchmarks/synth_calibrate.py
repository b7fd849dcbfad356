"""What a run looks like, per rank and step: the figures benchmarks/synth.py is calibrated against.

    python benchmarks/synth_calibrate.py RUN_DIR [RUN_DIR ...]          # a capture, an import, or a synthetic run
    python benchmarks/synth_calibrate.py /tmp/run --ranks 0,1 --markdown

For each rank (every rank of the run unless --ranks): recorded steps, events per step, executed collectives per
step (NCCL kernels / gloo work, ``comms.role == exec`` with a sequence number: what the summary keeps) and
point-to-point transfers per step, distinct op names (``cpu_op``) and kernel names, device streams and CPU threads,
and the pickled size of the rank's ``RankSummary`` with the part of it that is collective rows (what issue 25
measured as "189 KB pickled, 162 KB collective rows"). Real traces are imported first (``distprof import``).
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from distprof.analysis.load.catalog import scan_run
from distprof.analysis.load.rankdata import read_rank
from distprof.analysis.summarize.engine import summarize
from distprof.storage.schema import KIND_CODE, ROLE_EXEC

COLUMNS = ("run", "rank", "steps", "events/step", "colls/step", "p2p/step", "op names", "kernel names", "streams",
           "threads", "summary KB", "coll rows KB")


def _names_of(names: np.ndarray, ids: np.ndarray) -> set[str]:
    return {str(names[i]) for i in np.unique(ids).tolist()}


def rank_figures(run_dir: Path, rank: int, cat, summary) -> dict:
    """The figures of one rank (see the module docstring)."""
    rd = read_rank(cat, rank)
    ev, cm, names = rd.events, rd.comms, rd.names
    step = np.asarray(ev["step"])
    n_steps = max(int(np.unique(step[step >= 0]).size), 1)
    in_steps = int(np.count_nonzero(step >= 0))
    kind = np.asarray(ev["kind"])
    dev = np.asarray(ev["device"])
    exec_ = (np.asarray(cm["role"]) == ROLE_EXEC)
    row = np.asarray(cm["row"], np.int64)
    in_step = step[row] >= 0 if row.size else np.zeros(0, bool)
    colls = exec_ & (np.asarray(cm["seq"]) >= 0) & in_step
    p2p = exec_ & (np.asarray(cm["seq"]) < 0) & (np.asarray(cm.get("peer", np.full(row.size, -1))) >= 0) & in_step
    tracks = {(int(d), int(t)) for d, t in zip(dev.tolist(), np.asarray(ev["tid"]).tolist())}
    s = summary.ranks.get(rank) if summary is not None else None
    size = len(pickle.dumps(s, protocol=pickle.HIGHEST_PROTOCOL)) if s is not None else 0
    coll = len(pickle.dumps(s.collectives, protocol=pickle.HIGHEST_PROTOCOL)) if s is not None else 0
    return {"run": run_dir.name, "rank": rank, "steps": n_steps, "events/step": in_steps / n_steps,
            "colls/step": int(colls.sum()) / n_steps, "p2p/step": int(p2p.sum()) / n_steps,
            "op names": len(_names_of(names, np.asarray(ev["name_id"])[kind == KIND_CODE["cpu_op"]])),
            "kernel names": len(_names_of(names, np.asarray(ev["name_id"])[kind == KIND_CODE["kernel"]])),
            "streams": sum(1 for d, _ in tracks if d >= 0), "threads": sum(1 for d, _ in tracks if d < 0),
            "summary KB": size / 1e3, "coll rows KB": coll / 1e3, "events": int(kind.size)}


def run_figures(run_dir: Path, ranks: list[int] | None = None) -> list[dict]:
    cat = scan_run(run_dir)
    present = list(cat.ranks)
    summary = summarize(run_dir, progress=False)
    return [rank_figures(run_dir, r, cat, summary) for r in (ranks if ranks is not None else present)
            if r in present]


def _fmt(v) -> str:
    return f"{v:,.1f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)


def print_table(rows: list[dict], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "---|" * len(COLUMNS))
        for r in rows:
            print("| " + " | ".join(_fmt(r[c]) for c in COLUMNS) + " |")
        return
    print("  ".join(f"{c:>12}" for c in COLUMNS))
    for r in rows:
        print("  ".join(f"{_fmt(r[c]):>12}" for c in COLUMNS))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run directories")
    ap.add_argument("--ranks", default=None, help="comma-separated ranks (default: every rank)")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = ap.parse_args(argv)
    ranks = [int(x) for x in args.ranks.split(",")] if args.ranks else None
    rows = [r for d in args.runs for r in run_figures(Path(d), ranks)]
    print_table(rows, args.markdown)


if __name__ == "__main__":
    main()
