"""Map over ranks, reduce across ranks: a run directory -> ``RunSummary``, one rank's events in memory at a time.

    run = summarize("distprof/<run-id>", steps=(10, 19))       # serial
    mpiexec -n 4 distprof report RUN_DIR                        # the same, the ranks split over 4 MPI processes

Serial: scan the shards' attributes (``catalog.scan_run``), then for each rank take the summary stored in its shard
where the capture (or ``distprof import``) wrote one and the report may use it (``rank.stored``: one window, no
``--steps``, default rules, the same distprof), else read its shards (``rankdata.read_rank``), summarise them
(``summary.summarize_rank``) and drop the events; join the summaries (``align.reduce.reduce_run``). Peak memory:
the largest rank's events plus the summaries.

MPI (``comm`` given, or :func:`mpi_world` under ``mpiexec``/``srun``): MPI rank 0 scans and broadcasts the catalog;
the ranks are dealt out by their event counts (largest first, each to the least-loaded process), each process
summarises its share, and the summaries are gathered on MPI rank 0, which reduces them. Every process returns the
RunSummary on MPI rank 0 and None elsewhere. A process that fails sends its error instead of summaries; MPI rank 0
raises one error naming the failing process and rank, and nobody waits forever.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...errors import BadShardError, DistprofError, IncompleteRunError
from ...parallel import deal
from ...progress import progress_enabled
from ...storage.reader import find_shards
from ...storage.selection import SkippedShard
from ...storage.summary_group import SummaryUnreadable
from ...storage.validate import check_shard
from ..align.clock import ClockModel
from ..align.reduce import reduce_run
from ..align.rows import RowsJoiner
from ..load.catalog import (
    PROGRESS_MIN_SHARDS,
    RunCatalog,
    bar,
    scan_run,
    with_read_skips,
)
from ..load.rankdata import TABLES, RankData, RankUnreadable, read_rank
from ..names import rank_ranges
from ..rank.stored import load_stored, usable
from ..rank.summary import summarize_rank
from ..types import FindingRules, MergedRun, RankSummary, RunSummary
from .heap import release_free_heap, settle

log = logging.getLogger(__name__)

__all__ = ["summarize", "summarize_catalog", "stored_summary", "summarize_merged", "mpi_world", "assign_ranks",
           "MPI_ENV_VARS"]

#: Environment variables that say a process was started by an MPI launcher (MPICH/Hydra, Open MPI, Slurm's srun).
MPI_ENV_VARS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")


def mpi_world():
    """MPI.COMM_WORLD when this process runs under an MPI launcher with more than one process, else None.

    Needs mpi4py (``pip install distprof[mpi]``); without it, under a launcher, a DistprofError says so.
    """
    if not any(k in os.environ for k in MPI_ENV_VARS):
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        raise DistprofError("this process runs under an MPI launcher but mpi4py is not installed: "
                            "pip install 'distprof[mpi]' (or mpi4py), or run without mpiexec") from None
    comm = MPI.COMM_WORLD
    return comm if comm.Get_size() > 1 else None


def _rank_cost(cat: RunCatalog, rank: int) -> int:
    n = 0
    for s in cat.shards_of(rank):
        t = s.attrs.get("timings")
        n += int(t.get("n_events", 0)) if isinstance(t, dict) else 0
    return n or 1


def assign_ranks(cat: RunCatalog, n_procs: int) -> list[list[int]]:
    """Deal the run's ranks out to `n_procs` processes: largest first, each to the least-loaded one."""
    ranks = sorted(cat.ranks_read)
    return [[ranks[i] for i in share] for share in deal([_rank_cost(cat, r) for r in ranks], n_procs)]


def stored_summary(cat: RunCatalog, rank: int, rules: FindingRules | None) -> RankSummary | None:
    """The summary stored in the rank's shard when the report may take it instead of its events
    (``rank.stored.usable``); None otherwise (an older shard, several windows, ``--steps``, other rules, or one that
    cannot be used: a warning says why)."""
    shards = cat.shards_of(rank)
    if len(shards) != 1 or cat.steps is not None or (rules is not None and rules != FindingRules()):
        return None
    shard = shards[0]
    try:
        stored = shard.stored_summary()
    except SummaryUnreadable as e:  # the message names the file
        log.warning("distprof: %s; summarising the shard's events instead", e)
        return None
    except BadShardError:
        return None  # reading its events says what is wrong with it
    if stored is None:
        return None
    why = usable(stored)
    if why:
        log.debug("%s: stored summary not used (%s)", shard.path, why)
        return None
    try:
        return load_stored(stored, cat.pg_luts.get(shard.path))
    except Exception as e:  # noqa: BLE001 -- a stored summary is an optimisation: the events are the truth
        what = str(e) if isinstance(e, SummaryUnreadable) else f"{type(e).__name__}: {e}"
        log.warning("distprof: %s: /summary cannot be used (%s); summarising the shard's events instead",
                    shard.path, what)
    return None


def _summarize_ranks(cat: RunCatalog, ranks: list[int], rows: RowsJoiner, *, show: bool,
                     rules: FindingRules | None, stored: bool = True
                     ) -> tuple[list[RankSummary], list[SkippedShard]]:
    """Each rank summarised: from the summary stored in its shard where it can be (`stored`), else from its events
    read (bad shards left out and returned). Each summary's collective rows move into `rows` as it is made
    (``align.rows``): the rank's own copies are freed while the next ranks are read."""
    out: list[RankSummary] = []
    skipped: list[SkippedShard] = []
    for r in bar(ranks, show, "summarising ranks", unit="rank"):
        s = stored_summary(cat, r, rules) if stored else None
        if s is None:
            try:
                rd = read_rank(cat, r, skipped=skipped)
            except RankUnreadable:
                continue
            s = summarize_rank(rd, steps=cat.steps, rules=rules)
            del rd
        rows.take(s)
        out.append(s)
        settle()  # the summaries live to the end: the collector's full passes need not rescan them
    return out, skipped


def _reduce(cat: RunCatalog, summaries: list[RankSummary], skipped: list[SkippedShard],
            rows: tuple[dict[str, np.ndarray], np.ndarray], *, rules: FindingRules | None) -> RunSummary:
    if not summaries:
        raise IncompleteRunError(f"{cat.run_dir}: no readable shard ({len(skipped)} skipped, first "
                                 f"{skipped[0].path}: {skipped[0].reason})")
    return reduce_run(with_read_skips(cat, skipped, {s.rank for s in summaries}), summaries, rules=rules, rows=rows)


def summarize_catalog(cat: RunCatalog, *, progress: bool | None = None,
                      rules: FindingRules | None = None, stored: bool = True) -> RunSummary:
    """Serial map + reduce over a scanned run (`stored`: take the summaries stored in the shards where they can be)."""
    show = progress_enabled(progress, len(cat.shards), PROGRESS_MIN_SHARDS)
    rows = RowsJoiner(len(cat.ranks_read))
    summaries, skipped = _summarize_ranks(cat, cat.ranks_read, rows, show=show, rules=rules, stored=stored)
    return _reduce(cat, summaries, skipped, rows.finish(), rules=rules)


def summarize(run_dir: str | os.PathLike, *, steps: tuple[int, int] | None = None, progress: bool | None = None,
              rules: FindingRules | None = None, comm: Any = None, strict: bool = False,
              stored: bool = True) -> RunSummary | None:
    """Summarise a run directory (see the module docstring). With `comm` (an mpi4py communicator of more than one
    process), the work is split over its processes and only its rank 0 gets the RunSummary (others get None).
    `stored`: take each rank's summary stored in its shard where it can be (``stored_summary``); False: always
    summarise the events."""
    if comm is None or comm.Get_size() <= 1:
        cat = scan_run(run_dir, steps=steps, progress=progress, strict=strict, defer_layout=stored and steps is None)
        settle(force=True)
        out = summarize_catalog(cat, progress=progress, rules=rules, stored=stored)
    else:
        out = _summarize_mpi(comm, run_dir, steps=steps, progress=progress, rules=rules, strict=strict,
                             stored=stored)
    release_free_heap()  # the per-rank tables the join replaced, freed: back to the OS before the cross-rank phase
    settle(force=True)  # the run summary lives through the report
    return out


def summarize_merged(run: MergedRun, *, rules: FindingRules | None = None) -> RunSummary:
    """Summarise a MergedRun held in memory (tables built by hand, or ``load_run``'s): its times are aligned
    already, so the clock model is the identity and ``run.clock`` is kept."""
    summaries = []
    for r in sorted(int(x) for x in run.ranks_present):
        tabs = {}
        for t in TABLES:
            tab = getattr(run, t)
            if "rank" in tab and len(tab["rank"]):
                m = np.asarray(tab["rank"]) == r
                tabs[t] = {c: np.asarray(v)[m] for c, v in tab.items()}
            else:
                tabs[t] = {c: np.asarray(v)[:0] for c, v in tab.items()}
        ev_rows = np.flatnonzero(np.asarray(run.events["rank"]) == r)
        if len(tabs["comms"].get("row", ())):  # comms.row -> rows of this rank's events
            tabs["comms"]["row"] = np.searchsorted(ev_rows, tabs["comms"]["row"]).astype(np.int64)
        for t in TABLES:
            n = len(next(iter(tabs[t].values()))) if tabs[t] else 0
            tabs[t].setdefault("window", np.zeros(n, np.int32))
        rd = RankData(rank=r, names=run.names, attrs=run.attrs.get(r, {"host": run.hosts.get(r, "?")}),
                      windows=sorted({int(w) for w in np.unique(tabs["events"]["window"])}) or [0], **tabs)
        summaries.append(summarize_rank(rd, rules=rules))
    ranks = sorted(int(x) for x in run.ranks_present)
    rbw: dict[int, list[int]] = {}
    for s_ in summaries:
        for w in s_.windows:
            rbw.setdefault(w, []).append(s_.rank)
    cat = RunCatalog(run_dir=None, run_id=run.run_id, world_size=run.world_size, shards=[], ranks=ranks,
                     ranks_missing=list(run.ranks_missing), first_attrs={r: dict(run.attrs.get(r, {}),
                                                                              host=run.hosts.get(r, "?"))
                                                                          for r in ranks},
                     process_groups=list(run.process_groups), pg_luts={}, warnings=list(run.warnings),
                     windows_by_rank=rbw)
    hosts = sorted(set(run.hosts.values())) or ["?"]
    model = ClockModel(reference_host=run.hosts.get(min(ranks), hosts[0]) if ranks else hosts[0],
                       rank_host=dict(run.hosts), hosts=dict(run.clock))
    out = reduce_run(cat, summaries, rules=rules, model=model)
    out.device_peak_tflops = dict(run.device_peak_tflops)
    return out


def _check_one(path, defer_layout: bool = False) -> tuple:
    """A shard checked, as something every MPI process can send: ("ok", Shard) | ("bad", path, reason) |
    ("error", message)."""
    try:
        return ("ok", check_shard(path, defer_layout=defer_layout))
    except BadShardError as e:
        return ("bad", str(e.path), e.reason)
    except Exception as e:  # noqa: BLE001 -- sent to MPI rank 0, which raises it once
        return ("error", f"{path}: {type(e).__name__}: {e}")


def _check_shards_mpi(comm, run_dir, *, progress, defer_layout: bool = False) -> Callable[[Any], Any] | None:
    """Every shard of `run_dir` checked (attributes and layout), the shards dealt out to the MPI processes in turn
    and the answers gathered on MPI rank 0; returns there the `check` that ``scan_run`` asks (None elsewhere, or
    when there is no shard to check: scan_run then says what is wrong)."""
    me, size = comm.Get_rank(), comm.Get_size()
    paths = None
    if me == 0:
        paths = [str(p) for p in find_shards(run_dir)] if Path(run_dir).is_dir() else []
    paths = comm.bcast(paths, root=0)
    if not paths:
        return None
    mine = paths[me::size]
    show = me == 0 and progress_enabled(progress, len(paths), PROGRESS_MIN_SHARDS)
    checked = []
    for p in bar(mine, show, "checking shards"):
        checked.append(_check_one(p, defer_layout))
        settle()
    answers = comm.gather(checked, root=0)
    if me != 0:
        return None
    settle(force=True)
    by_path = {}
    for k, part in enumerate(answers):
        for p, a in zip(paths[k::size], part):
            by_path[p] = a

    def check(path):
        a = by_path.get(str(path))
        if a is None:
            return check_shard(path, defer_layout=defer_layout)
        if a[0] == "ok":
            return a[1]
        if a[0] == "bad":
            raise BadShardError(Path(a[1]), a[2])
        raise DistprofError(a[1])
    return check


#: MPI tag of the summaries sent to rank 0
_TAG = 7301


def _gather_summaries(comm, result: tuple[str, Any], rows: RowsJoiner) -> list[tuple[str, Any]] | None:
    """Every process's ("ok", (summaries, skipped)) or ("error", message) on MPI rank 0, in process order (None
    elsewhere), and every other process's collective rows (the third item of its "ok" payload: its finished
    ``RowsJoiner`` table) appended to rank 0's `rows`. Each summary travels as its own
    message and rank 0 takes them one at a time: one gather of everything held every process's pickled share next
    to its unpickled summaries (at 256 ranks on 2 processes, +55 MB on rank 0 for 12 MB of summaries). A process's
    collective rows, joined, go first as one message whose arrays travel out of band (``mpi4py.util.pkl5``: no
    pickled copy; 1,024 LLM-shaped ranks on 2 processes: ≈ 60 MB). Rank 0 receives everything before anyone raises,
    so no sender waits forever."""
    from mpi4py.util import pkl5

    me, size = comm.Get_rank(), comm.Get_size()
    bulk = pkl5.Intracomm(comm)
    if me != 0:
        kind, payload = result
        if kind != "ok":
            comm.send(("error", payload, 0), dest=0, tag=_TAG)
            return None
        summaries, skipped, joined = payload  # joined: this process's rows, finished where a failure is reported
        comm.send(("ok", skipped, len(summaries)), dest=0, tag=_TAG)
        bulk.send(joined, dest=0, tag=_TAG)
        for sm in summaries:
            comm.send(sm, dest=0, tag=_TAG)
        return None
    out = [result]
    for src in range(1, size):
        kind, payload, n = comm.recv(source=src, tag=_TAG)
        if kind != "ok":
            out.append((kind, payload))
            continue
        rows.extend(*bulk.recv(source=src, tag=_TAG))
        got = []
        for _ in range(n):
            got.append(_interned(comm.recv(source=src, tag=_TAG)))
            settle()
        out.append(("ok", (got, payload)))
    return out


def _interned(s: RankSummary) -> RankSummary:
    """A received summary's names made the process's shared strings again (unpickling gives every rank its own
    copy of each op name: at 16,384 ranks on 2 processes, ≈ 18 KB per received rank)."""
    for attr in ("op_names", "ops_names"):
        arr = getattr(s, attr)
        if isinstance(arr, np.ndarray) and arr.dtype == object:
            setattr(s, attr, np.array([sys.intern(x) if type(x) is str else x for x in arr.tolist()], dtype=object))
    s.op_kinds = [sys.intern(k) if type(k) is str else k for k in s.op_kinds]
    s.host = sys.intern(s.host) if type(s.host) is str else s.host
    return s


def _summarize_mpi(comm, run_dir, *, steps, progress, rules, strict=False, stored=True) -> RunSummary | None:
    me, size = comm.Get_rank(), comm.Get_size()
    cat: RunCatalog | None = None
    failure: Exception | None = None
    checked = _check_shards_mpi(comm, run_dir, progress=progress, defer_layout=stored and steps is None)
    if me == 0:
        try:
            cat = scan_run(run_dir, steps=steps, progress=progress, strict=strict, check=checked)
            settle(force=True)
        except Exception as e:  # noqa: BLE001 -- every process must hear about it, or they would wait forever
            failure = e
    cat, failed = comm.bcast((cat, failure is not None) if me == 0 else None, root=0)
    if failed:
        if failure is not None:
            raise failure
        return None
    share = sorted(assign_ranks(cat, size)[me])  # in rank order: the joined rows need no sort
    show = me == 0 and progress_enabled(progress, len(cat.shards), PROGRESS_MIN_SHARDS)
    result: tuple[str, Any]
    rows = RowsJoiner(len(cat.ranks_read) if me == 0 else len(share))  # rank 0's takes every process's rows
    try:
        summaries, skipped = _summarize_ranks(cat, share, rows, show=show, rules=rules, stored=stored)
        result = ("ok", (summaries, skipped) if me == 0 else (summaries, skipped, rows.finish()))
    except Exception as e:  # noqa: BLE001 -- sent to MPI rank 0, which reports it once
        where = f"MPI process {me} (ranks {rank_ranges(share)} of the run)" if share else f"MPI process {me}"
        msg = f"{e}" if isinstance(e, DistprofError) else f"{type(e).__name__}: {e}"
        result = ("error", f"{where}: {msg}")
    gathered = _gather_summaries(comm, result, rows)
    if me != 0:
        return None
    errors = [m for kind, m in gathered if kind == "error"]
    if errors:
        raise DistprofError(errors[0] + (f" (and {len(errors) - 1} more process(es) failed)" if len(errors) > 1
                                         else ""))
    summaries = [s for _, (part, _) in gathered for s in part]
    skipped = [sk for _, (_, sks) in gathered for sk in sks]
    return _reduce(cat, summaries, skipped, rows.finish(), rules=rules)

