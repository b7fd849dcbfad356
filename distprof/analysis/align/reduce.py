"""The run, summarised: every rank's ``RankSummary`` joined on one clock. What every cross-rank analysis takes.

    run = distprof.load("distprof/<run-id>")        # RunSummary (engine.summarize: one rank's events at a time)
    run.steps                                       # aligned step breakdown of every rank
    run.collectives, run.collective_rows            # matched collectives (aligned times), and their rows

Reduce (:func:`reduce_run`), from the catalog and the rank summaries: merge the collectives' op names → match
collectives per process group and window on raw times → build the clock model (samples, else collectives) → align
the rows, the steps and the collectives → warnings. Memory: O(ranks × (steps + collectives + top ops)).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..load.catalog import RunCatalog
from ..names import rank_ranges
from ..rank.breakdown import BREAKDOWN_COLUMNS, empty_breakdown
from ..types import RankSummary
from .clock import ClockModel, drop_windows, estimate_clocks
from .matching import Collectives, match_collectives, with_times
from .p2p import P2PPairs, match_p2p
from .rows import CPU_WAIT_AT, joined

log = logging.getLogger(__name__)

from ..types import RunSummary

__all__ = ["reduce_run", "join", "Joined", "aligned_collectives"]

Table = dict[str, np.ndarray]


def _unknown_group(cat: RunCatalog, rows: Table) -> str:
    """Collectives whose process group is unknown (pg -1) on a rank that belongs to several groups cannot be
    matched with anyone's: taking them as the default group's would match a tensor-parallel all-reduce with a
    data-parallel one. They are left out of matching (seq -1) and counted; the warning says so ('' when none).
    On a rank whose shards list at most one group (old traces without groups), -1 is that one group."""
    multi = [r for r, a in cat.first_attrs.items() if isinstance(a.get("process_groups"), list)
             and len(a["process_groups"]) > 1]
    if not multi or not len(rows["pg"]):
        return ""
    bad = (rows["pg"] < 0) & np.isin(rows["rank"], multi) & (rows["seq"] >= 0)
    if not bad.any():
        return ""
    rows["seq"][bad] = -1
    ranks = np.unique(rows["rank"][bad]).tolist()
    return (f"{int(bad.sum())} collective(s) on rank(s) {rank_ranges(ranks, sep=',')} ran on a process group "
            "distprof could not identify (the rank belongs to several): they are not matched with other ranks' "
            "and no wait is attributed for them")


@dataclass
class Joined:
    """The cross-rank facts from every rank's collectives and clock samples (``join``)."""

    rows: Table
    names: np.ndarray
    matched: Collectives  # raw times
    model: ClockModel
    warnings: list[str]


def join(cat: RunCatalog, rows: Table, names: np.ndarray, samples: dict[tuple[int, int], Table], *,
         model: ClockModel | None = None) -> Joined:
    """Match the collectives (raw times), build the clock model, and the warnings both give (the catalog's first).

    `rows`, `names`: every rank's collective rows joined (``rows.joined`` / ``RowsJoiner``), sorted by rank;
    `samples`: every rank's clock samples. `model`: a clock model to use instead of estimating one (times already
    aligned: the identity).
    """
    unknown = _unknown_group(cat, rows)
    matched = match_collectives(rows, names=names, group_ranks=cat.group_ranks() or None,
                                ranks_by_window=cat.ranks_by_window())
    if model is None:
        model = estimate_clocks(cat.clock_infos(), samples, matched, names=names)
        if model.left_out:  # a clock stepped while these windows were recorded: out of every cross-rank analysis
            rows = drop_windows(rows, model.left_out)
            matched = match_collectives(rows, names=names, group_ranks=cat.group_ranks() or None,
                                        ranks_by_window=cat.ranks_by_window())
    rows.pop("nccl_seq", None)  # read by the matching alone (10.6 MB at 1,024 LLM-shaped ranks)
    warnings = list(cat.warnings) + list(model.warnings)
    if unknown:
        warnings.append(unknown)
    if matched.n_mismatched:
        warnings.append(f"{matched.n_mismatched} collective instance(s) disagree across ranks on op or size "
                        f"(capture mismatch or a rank skipped a collective); first: {matched.mismatches[0]['message']}")
    if matched.n_incomplete:
        warnings.append(f"{matched.n_incomplete} collective instance(s) missing on some ranks of their group; "
                        f"first: {matched.incomplete[0]['message']}" + _ran_past(cat))
    for w in warnings:
        log.warning("%s", w)
    return Joined(rows, names, matched, model, warnings)


def _ran_past(cat: RunCatalog) -> str:
    """Why collectives can miss on some ranks of a run whose loops ended unevenly: a rank whose window its script's
    end cut short, beside ranks whose same window ended with the schedule, records on past the end of theirs."""
    early = sorted({r for ranks in cat.cut_beside_finished().values() for r in ranks})
    return (f" (rank(s) {rank_ranges(early, sep=',')}: the script's end cut its window short, and it recorded on "
            "until then, past the end of the others' window)" if early else "")


#: Breakdown columns that are durations (ms): measured on the rank's clock, scaled by its drift when aligned.
_DURATION_COLUMNS = ("compute_ms", "comm_ms", "overlapped_ms", "exposed_comm_ms", "memcpy_ms", "idle_ms", "other_ms")


def _aligned_steps(summaries: list[RankSummary], model: ClockModel) -> Table:
    """Every rank's breakdown on the reference clock: start/end aligned, step_ms from them, the other durations
    scaled by 1 + the host's drift in that window (the rate of the rank's clock against the reference)."""
    parts = [s.steps for s in summaries if s.steps["step"].size]
    if not parts:
        return empty_breakdown()
    out = {c: np.concatenate([p[c] for p in parts]) for c in BREAKDOWN_COLUMNS}
    for c in CPU_WAIT_AT:  # raw per-rank values (differences on one rank's clock): not aligned
        out[c] = np.concatenate([p.get(c, np.full(p["step"].size, np.nan)) for p in parts])
    for c in ("start_ns", "end_ns"):
        out[c] = model.align(out["rank"], out["window"], out[c])
    out["step_ms"] = (out["end_ns"] - out["start_ns"]) / 1e6
    rate = 1.0 + model.slopes(out["rank"], out["window"])
    for c in _DURATION_COLUMNS:
        out[c] = out[c] * rate
    return out


def aligned_collectives(c: Collectives, model: ClockModel) -> Collectives:
    """The matched collectives with aligned member times: start aligned, end = aligned start + duration."""
    m = c.members
    start = model.align(m["rank"], m["window"], m["start_ns"])
    return with_times(c, start, start + (m["end_ns"] - m["start_ns"]))


def aligned_p2p(cat: RunCatalog, summaries: list[RankSummary], model: ClockModel) -> P2PPairs:
    """Every rank's point-to-point rows on the reference clock, matched sender to receiver."""
    parts = [dict(s.p2p, rank=np.full(s.p2p["start_ns"].size, s.rank, np.int64)) for s in summaries
             if s.p2p and s.p2p["start_ns"].size]
    if not parts:
        return match_p2p({}, {})
    rows = drop_windows({k: np.concatenate([p[k] for p in parts]) for k in parts[0]}, model.left_out)
    start = model.align(rows["rank"], rows["window"], rows["start_ns"])
    rows["end_ns"] = start + (rows["end_ns"] - rows["start_ns"])
    rows["start_ns"] = start
    return match_p2p(rows, cat.group_ranks())


#: Work after a window's last step is named when it takes at least this share of the median step (and 1 ms).
AFTER_LAST_STEP_MIN = 0.5


def outside_step_notes(summaries: list[RankSummary], steps: Table) -> list[str]:
    """What belongs to no step, said once for the run: device events launched before the recording began, and large
    work after a window's last step (each with its ranks, count or time)."""
    out = []
    un = [(s.rank, *s.unlaunched) for s in summaries if s.unlaunched[0]]
    if un:
        out.append(f"{sum(n for _, n, _ in un)} GPU event(s) ({sum(ms for _, _, ms in un):.1f} ms) on rank(s) "
                   f"{rank_ranges([r for r, _, _ in un], sep=',')} were launched before the recording began (their "
                   "launch is not in the trace): they belong to no step and are left out of the per-step analyses")
    med = float(np.median(steps["step_ms"])) if len(steps["step_ms"]) else 0.0
    big = [(s.rank, w, ms) for s in summaries for w, ms in s.after_last_step.items()
           if ms >= max(AFTER_LAST_STEP_MIN * med, 1.0)]
    if big:
        worst = max(big, key=lambda x: x[2])
        out.append(f"after the last step of a window, rank(s) {rank_ranges(sorted({r for r, _, _ in big}), sep=',')} "
                   f"ran up to {worst[2]:.1f} ms of work (rank {worst[0]}, window {worst[1]}; a checkpoint, "
                   "evaluation or teardown after the loop): it belongs to no step and is left out of the step times")
    return out


def rows_in_one_home(summaries: list[RankSummary], rows: Table, names: np.ndarray) -> dict[int, RankSummary]:
    """rank -> its summary, whose collectives are now views of its rows of the run's `rows` (sorted by rank), ``op``
    indexing the run's `names`: each collective row is held once. At 1,024 LLM-shaped ranks the per-rank copies were
    124 MB beside the joined table's 128 MB."""
    ranks = np.asarray(rows["rank"])
    cols = [k for k in rows if k not in ("rank", "op_id")]
    want = np.array([[s.rank, s.rank + 1] for s in summaries], ranks.dtype).reshape(-1, 2)
    bounds = np.searchsorted(ranks, want).tolist()  # at once: one call per rank cast the whole column each time
    out = {}
    for s, (lo, hi) in zip(summaries, bounds):
        own = {k: rows[k][lo:hi] for k in cols}
        own["op"] = rows["op_id"][lo:hi]
        out[s.rank] = replace(s, collectives=own, ops_names=names)
    return out


def reduce_run(cat: RunCatalog, summaries: list[RankSummary], *, rules: Any = None,
               model: ClockModel | None = None, rows: tuple[Table, np.ndarray] | None = None) -> RunSummary:
    """Join the rank summaries of `cat`'s run (see the module docstring); `model` as in :func:`join`. `rows`: the
    summaries' collective rows already joined (``rows.RowsJoiner``, which took them out of the summaries as they
    were made); None: joined here from the summaries."""
    summaries = sorted(summaries, key=lambda s: s.rank)
    if rows is None:
        rows = joined([(s.rank, s.collectives, s.ops_names) for s in summaries])
    j = join(cat, *rows, {k: v for s in summaries for k, v in s.samples.items()}, model=model)
    steps = drop_windows(_aligned_steps(summaries, j.model), j.model.left_out)
    j.warnings.extend(outside_step_notes(summaries, steps))
    p2p = aligned_p2p(cat, summaries, j.model)
    if p2p.n_unmatched or p2p.n_unknown_peer:
        j.warnings.append(f"{p2p.n_unmatched + p2p.n_unknown_peer} point-to-point transfer(s) could not be paired "
                          f"sender to receiver ({p2p.n_unknown_peer} with an unknown peer)"
                          + (f"; first: {p2p.examples[0]}" if p2p.examples else ""))
    if cat.world_size > 1 and any(s.device_rank for s in summaries) and len(steps["comm_ms"]) \
            and not float(np.sum(steps["comm_ms"])) > 0:
        j.warnings.append(
            f"no communication was recognised in this {cat.world_size}-rank GPU job: its collectives may run in "
            "kernels no rule knows (an in-house library); name them with DISTPROF_COMM_KERNELS='REGEX[=op];...' "
            "(e.g. 'my_ep::.*dispatch=all_to_all') and import or capture again (docs/gpu-semantics.md)")
    return RunSummary(
        run_id=cat.run_id, world_size=cat.world_size, ranks_present=list(cat.ranks),
        ranks_missing=list(cat.ranks_missing), hosts=cat.hosts, attrs=dict(sorted(cat.first_attrs.items())),
        process_groups=cat.process_groups, ranks=rows_in_one_home(summaries, j.rows, j.names),
        steps=steps, collective_rows=j.rows, names=j.names,
        collectives=aligned_collectives(j.matched, j.model), clock=j.model.hosts, model=j.model,
        warnings=j.warnings, steps_selection=cat.steps, rules=rules, catalog=cat, p2p=p2p)
