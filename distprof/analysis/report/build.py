"""The report: every analysis of a summarised run, as one typed :class:`.model.Report` (docs/report-format.md).

    run = distprof.load("out/my-run")            # RunSummary
    report = build_report(run, peak_tflops=None, top=3, watch_dir="out/my-run")
    report = watch_only_report("out/my-run")    # a --watch run that recorded no window (None otherwise)
    report.to_json()                            # what report.json holds

No torch. The analyses are pure functions of the RunSummary; the only files read here are the run's ``--watch``
series (``watch_dir``), one segment at a time. Renderers (``distprof.render``) turn the Report into text or a file.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...storage import watchfile as wf
from ...storage.reader import find_shards, read_status
from ..cross.annotations import annotations
from ..cross.comm_table import comm_table
from ..cross.gpu_time import gpu_time
from ..cross.imbalance import imbalance
from ..cross.memory_timeline import memory_timeline
from ..cross.mfu import mfu
from ..cross.overlap import overlap_by_rank, overlap_by_step
from ..cross.parallelism import advice_for_exposed, detect_parallelism
from ..cross.pipeline import pipelines
from ..cross.rootcause import root_cause
from ..cross.step_summary import step_summary
from ..cross.stragglers import StragglerRule, find_stragglers
from ..findings import findings
from ..findings.gains import annotate_findings
from ..findings.uneven import LoopEnds, uneven_steps
from ..findings.verdict import verdict
from ..graph.critical_path import step_graph
from ..graph.path_report import critical_path_report
from ..graph.whatif import estimator, general_changes, reads_graph_only
from ..graph.whatif import standard as whatif_table
from ..load.catalog import clean_steps_seen
from ..summarize.heap import release_free_heap
from .model import ClockRow, P2PCounts, Report, RunInfo, SkippedShardRow, StepTable
from .watch import rule_of, watch_report
from .watch_section import WatchSection

from ..types import FindingRules

if TYPE_CHECKING:
    from ..types import RunSummary
    from .parallel import Handover

logger = logging.getLogger(__name__)

__all__ = ["build_report", "watch_only_report"]

#: Why a report has no MFU rows.
MFU_NOTE = "device peak unknown (CPU or unlisted device): pass --peak-tflops to compute MFU"


def _step_table(bd: dict[str, np.ndarray]) -> StepTable:
    """The breakdown `bd` with each rank-step's overlap."""
    return StepTable.from_columns({**bd, "overlap_pct": overlap_by_step(bd)["overlap_pct"]})


def _run_section(run: RunSummary) -> RunInfo:
    """The report's ``run`` section: the ranks, hosts, devices and steps the run holds."""
    st = run.steps
    hosts_present = sorted({run.hosts.get(r, "?") for r in run.ranks_present})
    return RunInfo(
        id=run.run_id, world_size=run.world_size, ranks_present=sorted(int(r) for r in run.ranks_present),
        ranks_missing=sorted(int(r) for r in run.ranks_missing),
        hosts={str(r): run.hosts[r] for r in sorted(run.hosts)}, n_hosts=len(hosts_present),
        devices=sorted({str(a.get("device", "?")) for a in run.attrs.values()}),
        backend=sorted({str(a.get("backend", "?")) for a in run.attrs.values()}),
        device_ranks=sorted(run.device_rank_set),
        windows=sorted({int(w) for w in np.unique(st["window"])}) if "window" in st else [],
        first_step=int(st["step"].min()) if st["step"].size else None,
        last_step=int(st["step"].max()) if st["step"].size else None,
        n_steps=int(np.unique(st["step"]).size), step_unit=_step_unit(run))


def _step_unit(run: RunSummary) -> str | None:
    """What the run's steps are when they are not ProfilerStep# (an imported trace without them), else None; ranks
    that differ are joined with '/'."""
    units = sorted({str(a.get("step_unit")) for a in run.attrs.values()} - {"None", "profiler_step"})
    return "/".join(units) or None


def _clock_section(run: RunSummary) -> dict[str, ClockRow]:
    """The report's ``clock`` section: per host, its clock's alignment to the reference."""
    return {host: ClockRow(offset_ns=hc.offset_ns, drift_ppm=hc.drift_ppm, residual_us=hc.residual_us,
                           residual_max_us=hc.residual_max_us, method=hc.method, n_samples=hc.n_samples,
                           ranks=list(hc.ranks))
            for host, hc in sorted(run.clock.items())}


def _p2p_section(run: RunSummary) -> P2PCounts:
    """The report's ``p2p`` section: the point-to-point pairs matched, and what was left unmatched."""
    p = run.p2p
    return P2PCounts(len(p), p.n_sends, p.n_recvs, p.n_unmatched, p.n_edge, p.n_unknown_peer)


def build_report(run: RunSummary, *, peak_tflops: float | None = None, top: int = 3, rule: StragglerRule | None = None,
                 finding_rules: FindingRules | None = None, watch_dir: str | Path | None = None,
                 helped: Handover | None = None, release: bool = False) -> Report:
    """Run every analysis on `run` and return the :class:`Report` (its JSON: docs/report-format.md).

    `peak_tflops` overrides the device peak for MFU; `top` bounds the stragglers given a root-cause analysis;
    `finding_rules` overrides the thresholds of the findings (``analysis/findings/``); `watch_dir`, the run
    directory, adds the ``watch`` section when it holds a --watch series. `helped` hands over the straggler
    analysis, the collectives table, the critical path (of the step graph it is sent) and perhaps the pipelines of
    `run` computed elsewhere (another MPI process, :mod:`.parallel`): the analyses that read none of them run before
    they are asked for. `release` says the caller hands `run` over and reads it no more: each per-rank table is let
    go once its last reader is done (the memory curves after the memory timeline, the collective and transfer rows
    after the step graph and the findings; ``RunSummary.release_rows``), so the tables are not all held at the
    report's peak.
    """
    warnings = list(run.warnings)
    bd = run.steps
    if bd["step"].size == 0:
        warnings.append("no recorded steps: the per-step analyses are empty")
    memory = memory_timeline(run)
    if release:  # the curves' only reader is done: their pages back to the OS (small blocks, which the large
        run.release_memory_curves()  # arrays below could not reuse)
        release_free_heap()
    # the stragglers first, then the other readers of the instance rows: their tables come and go before the step
    # graph is built and held (1,024 LLM-shaped ranks: the analysis +133 MB over the run, the graph 108 MB held)
    strag = find_stragglers(run, rule=rule) if helped is None else None
    if helped is None:
        pipes, table = pipelines(run), comm_table(run)
    if release:  # the straggler analysis's heap, in pieces the graph's columns do not fit, handed back
        release_free_heap()
    graph = step_graph(run)  # the cross-rank step graph: own work, critical path, what-ifs, each finding's gain
    general = path = None
    if helped is not None:  # what needs none of process 1's results: the what-ifs' replays are kept with the graph
        helped.send_graph(graph)  # process 1 replays it for the critical path once its own share is done
        est = estimator(run, graph)
        general = general_changes(run, est)  # made once: ranking the heaviest ops reads every rank's op totals
        elsewhere = [c for c in general if reads_graph_only(c)]
        helped.send_replays(est.replayed(), elsewhere)  # process 1 estimates these from the replay
        for change in general:
            if not reads_graph_only(change):
                est.estimate(change)
        pipes = pipelines(run) if helped.builds_pipelines() else None  # unless process 1, free first, builds them
        got = helped.result()
        strag, table, path = got.stragglers, got.collectives, got.critical_path  # path None: replayed below
        if got.gains is not None:  # else the what-if table estimates them here
            est.take_gains(elsewhere, got.gains)
        pipes = got.pipelines if pipes is None else pipes
    par = detect_parallelism(run, table, pipes)
    if strag.info.n_instances == 0 and not pipes:
        warnings.append("no collective was matched across ranks: no straggler analysis")
    named = [d.rank for d in strag.named_rows][: max(top, 0)]
    rc = root_cause(run, named) if named else []
    found = findings(run, stragglers=strag, root_cause=rc, rules=finding_rules, pipelines=pipes,
                     exposed_advice=advice_for_exposed(par, table))
    if release:  # the step graph holds what the rest reads of the collective rows (170 MB at 1,024 LLM-shaped ranks)
        run.release_rows()
        release_free_heap()
    if path is None:
        path = critical_path_report(run, graph=graph)
        if release:  # the frontier's arrays, shrinking pass by pass, leave the heap in pieces the what-ifs' larger
            release_free_heap()  # arrays cannot reuse: handed back, not held beside them
    annotate_findings(run, found, graph=graph)
    summary = step_summary(bd)
    mfu_rows = mfu(run, peak_tflops=peak_tflops)
    return Report(
        verdict=verdict(summary, strag, rc, found), findings=found, run=_run_section(run), clock=_clock_section(run),
        summary=summary, steps=_step_table(bd), stragglers=strag.ranks, straggler_info=strag.info, root_cause=rc,
        parallelism=par, collectives=table, pipelines=pipes, p2p=_p2p_section(run), overlap=overlap_by_rank(run),
        critical_path=path, whatif=whatif_table(run, stragglers=strag, graph=graph, general=general),
        imbalance=imbalance(run), mfu=mfu_rows, gpu_time=gpu_time(run), annotations=annotations(run),
        warnings=warnings, skipped_shards=[SkippedShardRow(str(sk.path), sk.reason) for sk in run.skipped_shards],
        mfu_note=None if mfu_rows else MFU_NOTE, watch=_watch_section(run, watch_dir), memory=memory)


def _watch_section(run: RunSummary, run_dir: str | Path | None) -> WatchSection | None:
    """The whole run from its --watch series (RUN_DIR/watch/), judged by the drift rule the job ran with; None
    without `run_dir` or without a series."""
    if run_dir is None:
        return None
    cfg = next((a.get("config") for a in run.attrs.values() if isinstance(a.get("config"), dict)), None)
    return watch_report(run_dir, rule_of(cfg))


def watch_only_report(run_dir: str | Path) -> Report | None:
    """A --watch run without any shard (nothing drifted, --schedule none): the report of its series alone; None when
    the run has shards (the full report) or no series (the usual "no shard files" error follows)."""
    if not Path(run_dir).is_dir() or find_shards(run_dir) or not wf.list_segments(Path(run_dir)):
        return None
    watch = watch_report(run_dir)
    ranks = [p.rank for p in watch.per_rank] if watch is not None else []
    warnings = ["no profile window was recorded (no shard): only the --watch series is reported"]
    found = uneven_steps(LoopEnds.from_status(clean_steps_seen(read_status(run_dir, warnings), ranks)),
                         FindingRules(), {})  # the one rule the status files answer without a window
    return Report(
        verdict=f"{found[0].title}." if found else "", findings=found,
        run=RunInfo(id=Path(run_dir).name, world_size=len(ranks), ranks_present=ranks), watch=watch,
        warnings=warnings)
