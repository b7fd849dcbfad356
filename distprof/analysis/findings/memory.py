"""Memory rule: allocator churn and peak swings between steps (measured in :mod:`.measures`).

* ``memory_churn`` — from ``run.memory`` (allocator events) per rank and step. *Churn* fires when allocations run at
  ≥ ``churn_min_allocs_per_ms`` (20) per ms of step time and ≥ ``churn_min_allocs_per_step`` (500) per step, or when
  the bytes allocated per step are ≥ ``churn_min_turnover`` (8) × the step's swing of allocated memory (max − min)
  and ≥ ``churn_min_alloc_mib`` (64 MiB). *Swing between steps* fires when the per-step peak of allocated memory
  varies by ≥ ``swing_min_pct`` (50 %) of its mean across steps and ≥ ``swing_min_mib`` (64 MiB). No time is
  measured for it: severity is medium when a measure is ≥ 2× its threshold, else low.

With ``--memory-history`` (``run.cuda_memory``), a rank's measures come from the CUDA allocator history instead
(:func:`.measures.memory_history_measures`: exact counts and levels per step, swing = peak − the lower of the step's
and the previous step's end level), with the same thresholds, plus *fragmentation*: the reserved peak (the
allocator's cached segments) ≥ ``frag_min_ratio`` (1.5) × the allocated peak and ≥ ``frag_min_mib`` (1024 MiB) above
it. The evidence names the largest allocation sites (``cuda_memory_blocks`` frames), cudaMalloc/cudaFree of segments
per step and OOMs; ``metrics["memory_history"]`` is 1. Ranks without history are measured and worded as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..types import FindingRules
from .rules import Hit, on_rank

if TYPE_CHECKING:
    from ..rank.measures import Churn, HistoryChurn, RankMeasures


#: The churn measures a finding carries, from the memory events or the allocator history.
_CHURN = ("allocs_per_step", "allocs_per_ms", "alloc_mib_per_step", "swing_mib_per_step", "turnover", "peak_mib_mean",
          "peak_swing_mib")
_HISTORY = _CHURN + ("frees_per_step", "alloc_peak_mib", "reserved_peak_mib", "reserved_ratio", "reserved_gap_mib",
                     "segment_allocs_per_step", "segment_frees_per_step", "n_oom")


def memory_churn(ms: list[RankMeasures], rules: FindingRules) -> list[Hit]:
    hits = []
    for m in ms:
        if m.history is not None:
            hit = _history_hit(m, m.history, rules)
            if hit is not None:
                hits.append(hit)
            continue
        if m.churn is None:
            continue
        rate, turn, swing = _scores(m.churn, rules)
        worst = max(rate, turn, swing)
        if worst < 1.0:
            continue
        hits.append(Hit(m.rank, m.host, 0.0, {
            **{k: getattr(m.churn, k) for k in _CHURN},
            "churn_rate": float(rate >= 1.0), "churn_turnover": float(turn >= 1.0), "churn_swing": float(swing >= 1.0),
            **_thresholds(rules), "times_threshold": worst}, severity="medium" if worst >= 2.0 else "low"))
    keys = dict.fromkeys(k for h in hits for k in h.metrics)  # each key once: the fill is hits x keys, not hits^2
    for h in hits:  # ranks with and without history in one run: one key set, so that grouping can average them
        for k in keys:
            h.metrics.setdefault(k, 0.0)
    return hits


def _scores(x: Churn, rules: FindingRules) -> tuple[float, float, float]:
    """Rate, turnover and swing of measures `x` as multiples of their thresholds (0 below a floor)."""
    rate = (x.allocs_per_ms / rules.churn_min_allocs_per_ms
            if x.allocs_per_step >= rules.churn_min_allocs_per_step else 0.0)
    turn = (x.turnover / rules.churn_min_turnover
            if x.alloc_mib_per_step >= rules.churn_min_alloc_mib else 0.0)
    swing = (x.peak_swing_mib / x.peak_mib_mean * 100.0 / rules.swing_min_pct
             if x.peak_swing_mib >= rules.swing_min_mib and x.peak_mib_mean > 0 else 0.0)
    return rate, turn, swing


def _thresholds(rules: FindingRules) -> dict[str, float]:
    return {"threshold_allocs_per_ms": rules.churn_min_allocs_per_ms,
            "threshold_allocs_per_step": rules.churn_min_allocs_per_step,
            "threshold_turnover": rules.churn_min_turnover, "threshold_alloc_mib": rules.churn_min_alloc_mib,
            "threshold_swing_pct": rules.swing_min_pct, "threshold_swing_mib": rules.swing_min_mib}


def _history_hit(m: RankMeasures, h: HistoryChurn, rules: FindingRules) -> Hit | None:
    rate, turn, swing = _scores(h, rules)
    frag = (h.reserved_ratio / rules.frag_min_ratio if h.reserved_gap_mib >= rules.frag_min_mib else 0.0)
    worst = max(rate, turn, swing, frag)
    if worst < 1.0:
        return None
    metrics = {k: float(getattr(h, k)) for k in _HISTORY}
    metrics.update({
        "memory_history": 1.0, "history_steps": float(h.n_steps), "complete_steps": float(h.complete_steps),
        "churn_rate": float(rate >= 1.0), "churn_turnover": float(turn >= 1.0), "churn_swing": float(swing >= 1.0),
        "churn_fragmentation": float(frag >= 1.0), **_thresholds(rules),
        "threshold_frag_ratio": rules.frag_min_ratio, "threshold_frag_mib": rules.frag_min_mib,
        "times_threshold": worst})
    return Hit(m.rank, m.host, 0.0, metrics, severity="medium" if worst >= 2.0 else "low",
               notes={"sites": h.sites or []})


def memory_churn_text(m, where, worst):
    if m.get("memory_history", 0.0) >= 0.5:
        return _history_text(m, where, worst)
    title = f"Memory churn on {where}: " + "; ".join(_kinds(m, "allocations"))
    ev = (f"{m['allocs_per_step']:.0f} allocations per step ({m['allocs_per_ms']:.1f} per ms), "
          f"{m['alloc_mib_per_step']:.1f} MiB allocated per step against a swing of {m['swing_mib_per_step']:.1f} MiB "
          f"(turnover {m['turnover']:.1f}x); per-step peak {m['peak_mib_mean']:.1f} MiB, varying by "
          f"{m['peak_swing_mib']:.1f} MiB. {_rule(m)}.")
    advice = ("Reuse buffers instead of allocating per step (preallocate, in-place ops, out= arguments, no torch.cat "
              "in loops), keep input shapes fixed (pad or bucket variable lengths), and on CUDA set "
              "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; record the allocator history (--memory-history on "
              "CUDA) to see which code allocates.")
    return title, ev, advice


def _kinds(m, allocs: str) -> list[str]:
    """The churn angles that fired, as title phrases."""
    kinds = []
    if m["churn_rate"] >= 0.5:
        kinds.append(f"{m['allocs_per_step']:.0f} {allocs} per step ({m['allocs_per_ms']:.0f} per ms)")
    if m["churn_turnover"] >= 0.5:
        kinds.append(f"{m['alloc_mib_per_step']:.0f} MiB allocated per step, {m['turnover']:.1f}x its "
                     f"{m['swing_mib_per_step']:.0f} MiB swing")
    if m["churn_swing"] >= 0.5:
        kinds.append(f"the per-step peak varies by {m['peak_swing_mib']:.0f} MiB around {m['peak_mib_mean']:.0f} MiB")
    return kinds


def _rule(m) -> str:
    """The thresholds shared by both sources (no final full stop)."""
    return (f"Rule: >= {m['threshold_allocs_per_ms']:.0f} allocations per ms and >= "
            f"{m['threshold_allocs_per_step']:.0f} per step, or turnover >= {m['threshold_turnover']:.0f}x with >= "
            f"{m['threshold_alloc_mib']:.0f} MiB per step, or a per-step peak varying by >= "
            f"{m['threshold_swing_pct']:.0f} % and >= {m['threshold_swing_mib']:.0f} MiB")


def _size(mib: float) -> str:
    return f"{mib:.1f} MiB" if mib >= 0.1 else f"{mib * 1024:.1f} KiB"


def _history_text(m, where, worst):
    kinds = _kinds(m, "CUDA allocations")
    if m["churn_fragmentation"] >= 0.5:
        kinds.append(f"the allocator reserves {m['reserved_peak_mib']:.0f} MiB for a {m['alloc_peak_mib']:.0f} MiB "
                     f"allocated peak ({m['reserved_ratio']:.1f}x)")
    title = f"Memory churn on {where}: " + "; ".join(kinds)
    ev = (f"From the CUDA allocator history ({m['history_steps']:.0f} steps, {m['complete_steps']:.0f} complete): "
          f"{m['allocs_per_step']:.0f} allocations and {m['frees_per_step']:.0f} frees per step "
          f"({m['allocs_per_ms']:.1f} allocations per ms), {m['alloc_mib_per_step']:.1f} MiB allocated per step "
          f"against a swing of {m['swing_mib_per_step']:.1f} MiB (turnover {m['turnover']:.1f}x); per-step peak "
          f"{m['peak_mib_mean']:.1f} MiB, varying by {m['peak_swing_mib']:.1f} MiB; reserved peak "
          f"{m['reserved_peak_mib']:.1f} MiB for an allocated peak of {m['alloc_peak_mib']:.1f} MiB "
          f"({m['reserved_ratio']:.2f}x).")
    if m["segment_allocs_per_step"] > 0 or m["segment_frees_per_step"] > 0:
        ev += (f" The allocator made {m['segment_allocs_per_step']:.1f} new segments (cudaMalloc) and returned "
               f"{m['segment_frees_per_step']:.1f} (cudaFree) per step.")
    if m["n_oom"] > 0:
        ev += f" {m['n_oom']:.0f} allocations failed (OOM)."
    sites = worst.notes.get("sites") or []
    if sites:
        ev += (f" Largest allocation sites{on_rank(where, worst)}, among each step's largest allocations: "
               + "; ".join(f"{label}: {_size(mib)} in {k:.1f} allocations per step"
                           + (f", {100 * live:.0f} % alive at the step's peak" if live > 0 else "")
                           for label, mib, k, live in sites) + ".")
    ev += (f" {_rule(m)}, or a reserved peak >= {m['threshold_frag_ratio']:.1f}x the allocated peak and >= "
           f"{m['threshold_frag_mib']:.0f} MiB above it.")
    advice = []
    if m["churn_rate"] >= 0.5 or m["churn_turnover"] >= 0.5:
        advice.append("Reuse buffers at the sites named instead of allocating per step (preallocate, in-place ops, "
                      "out= arguments, no torch.cat in loops).")
    if m["churn_swing"] >= 0.5:
        advice.append("Keep input shapes fixed (pad or bucket variable lengths).")
    if m["churn_fragmentation"] >= 0.5:
        advice.append("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so segments grow in place instead of "
                      "caching blocks of every size; torch.cuda.empty_cache() is not a fix: it hands the cache back "
                      "to CUDA only for it to be cudaMalloc'd again (each call synchronises the device).")
    advice.append("Open the rank's snapshot (rank<R>.w<W>.memsnap.pickle beside the shards) on "
                  "https://pytorch.org/memory_viz for the full timeline and stacks.")
    return title, ev, " ".join(advice)
