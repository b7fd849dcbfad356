"""Terminal summary of a report: verdict and findings first, then run, clocks, step breakdown, stragglers, root
cause, overlap, imbalance, user annotations, MFU.

Takes a :class:`~distprof.analysis.report.model.Report` and nothing else. Plain text; ANSI bold/colour only when asked
(``color=True``) — the CLI asks only when stdout is a TTY. A section the report lacks (None: a report of a --watch
series alone has only the run, the watch section and the warnings) is skipped.

Bounded whatever the rank count (about 80 lines at 1,024 ranks): tables of one row per rank show every rank up to
``MAX_RANK_ROWS``; beyond, a distribution (min, median, p90, max, with the extreme ranks named) and the outliers
that matter (:mod:`.console_tables`); hosts are summarised the same way; at most ``_MAX_WARNINGS`` warnings. Every
per-rank figure stays in report.json.

Every string of the report is made safe for a terminal first (:func:`.console_text.terminal_safe` over the whole
record tree): names come from traces and shards, and a name holding ``\x1b]0;TITLE\x07`` or ``\nVerdict: ...`` must
print as text, not retitle the terminal or forge a line. Control characters are escaped; a run of more than 240
non-blank characters is shortened in the middle; hosts, run ids and devices are bounded as names.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from ..analysis.names import display_name, rank_ranges
from ..analysis.report.model import STEP_UNITS
from .console_tables import (MAX_OUTLIERS, MAX_RANK_ROWS, annotation_lines, gpu_time_lines, imbalance_lines,
                             many_ranks, mfu_lines, overlap_lines, spread_lines)
from .console_text import Style, fmt, name, table, terminal_safe, terminal_text, wrap
from .console_watch import watch_lines
from .console_whatif import critical_path_lines, gain_text, whatif_lines

if TYPE_CHECKING:
    from ..analysis.cross.comm_table import CommRow
    from ..analysis.cross.pipeline import Pipeline
    from ..analysis.cross.rootcause import RootCause
    from ..analysis.cross.step_summary import StepSummary
    from ..analysis.cross.stragglers import StragglerHost, StragglerInfo, StragglerRank
    from ..analysis.findings.finding import Finding
    from ..analysis.report.model import ClockRow, Report, RunInfo

logger = logging.getLogger(__name__)

__all__ = ["render_console", "terminal_text"]

_MAX_HOST_ROWS = 8
_MAX_WARNINGS = 6
_MAX_FINDINGS = 8
_MAX_COMM_ROWS = 8
_MAX_ROOT_CAUSE_OPS = 5
_MAX_CHANGES = 10
_MAX_CHAIN = 16  # ranks of a pipeline's stage order named
_ALWAYS_PARTS = ("compute_pct", "exposed_comm_pct", "idle_pct")
_SEVERITY_TAG = {"high": "HIGH", "medium": "MED ", "low": "LOW "}
def render_console(report: Report, *, color: bool = False, top: int = 3) -> str:
    """The terminal summary as one string (ends with a newline); every string from the report terminal-safe.

    `top` is the number of stragglers the report gave a root cause (``distprof report --top``)."""
    r: Report = terminal_safe(dataclasses.replace(report, memory=None))  # the console draws no memory curve
    st = Style(color)
    out = _run_lines(r.run, st)
    if r.verdict:
        out += [st.bold(x) for x in wrap(r.verdict, "Verdict: ", "  ")]
    out += _findings(r.findings, st)
    if r.parallelism is not None:  # always said, "no parallelism recognised" included; a derived string: made safe whole
        out.append(st.bold("Parallelism: ") + terminal_text(report.parallelism.label))
    out += _clock(r.clock or {}, st)
    out += _summary(r.summary, st)
    out += watch_lines(r.watch, st)
    out += _stragglers(r, st)
    out += critical_path_lines(r.critical_path, st.bold) + whatif_lines(r.whatif, st.bold)
    out += _collectives(r.collectives or [], st)
    out += _pipelines(r.pipelines or [], st)
    out += _root_cause(r.root_cause or [], _explained(r.findings))
    many = many_ranks(r.overlap or [], r.gpu_time or [], r.mfu or [])
    if many:
        out += spread_lines(r.overlap or [], r.gpu_time or [], r.mfu or [], st)
    else:
        out += overlap_lines(r.overlap or []) + gpu_time_lines(r.gpu_time or [])
    out += imbalance_lines(r.imbalance)
    out += annotation_lines(r.annotations or [], st)
    if r.mfu and not many:
        out += mfu_lines(r.mfu, st)
    elif not r.mfu and r.mfu_note:
        out.append(st.dim(f"MFU: {r.mfu_note}"))
    out += _warnings(r.warnings, st)
    return "\n".join(out) + "\n"


def _run_lines(run: RunInfo, st: Style) -> list[str]:
    """The first line (run id, ranks, hosts, steps, backends, devices) and the missing ranks."""
    steps_txt = f"steps {run.first_step}-{run.last_step} ({run.n_steps} steps)" if run.n_steps else "no steps"
    if run.step_unit:
        steps_txt += f" of {STEP_UNITS.get(run.step_unit, run.step_unit)}"
    head = f"distprof report: run {name(run.id, 80)}"
    parts = [f"{len(run.ranks_present)}/{run.world_size} ranks on {run.n_hosts} host(s)", steps_txt,
             "/".join(name(b, 32) for b in run.backend), "/".join(name(d) for d in run.devices)]
    out = wrap(f"{head} - " + ", ".join(x for x in parts if x), "", "  ")
    out[0] = st.bold(head) + out[0][len(head):]
    if run.ranks_missing:
        out.append(st.red(f"  missing ranks: {rank_ranges(run.ranks_missing)}"))
    return out


def _warnings(warnings: list[str], st: Style) -> list[str]:
    out = [st.red(f"warning: {w}") for w in warnings[:_MAX_WARNINGS]]
    if len(warnings) > _MAX_WARNINGS:
        out.append(st.dim(f"  ... {len(warnings) - _MAX_WARNINGS} more warnings in report.json"))
    return out


def _findings(fs: list[Finding], st: Style) -> list[str]:
    if not fs:
        return [st.bold("Findings: none") + " (no rule fired; thresholds in docs/report-format.md)"]
    out = [st.bold(f"Findings ({len(fs)}, most severe first)")]
    for i, f in enumerate(fs[:_MAX_FINDINGS], 1):
        tag = _SEVERITY_TAG.get(f.severity, f.severity.upper())
        color = st.red if f.severity == "high" else st.yellow if f.severity == "medium" else (lambda x: x)
        head = f"  {i}. [{tag.strip()}] "
        title = wrap(f.title, head, "       ")
        out.append(head[:5] + color(head[5:].rstrip()) + " " + st.bold(title[0][len(head):]))
        out += [st.bold(x) for x in title[1:]]
        out += wrap(f.evidence, "     ", "     ")
        out += [st.dim(x) for x in wrap("Fix: " + f.advice, "     ", "       ")]
        gain = gain_text(f)
        if gain:
            out += wrap(gain, "     ", "       ")
    if len(fs) > _MAX_FINDINGS:
        out.append(st.dim(f"  ... {len(fs) - _MAX_FINDINGS} more findings in report.json"))
    return out


def _summary(s: StepSummary | None, st: Style) -> list[str]:
    """Step time and how it splits into compute, exposed communication, memcpy, idle and other."""
    if s is None or not s.n_rank_steps:
        return []
    per_step, rest = divmod(s.n_rank_steps, max(s.n_steps or 1, 1))
    count = (f"{s.n_steps} steps x {per_step} ranks" if not rest else  # ranks that ran different steps (uneven loops)
             f"{s.n_steps} steps, {s.n_rank_steps} rank-steps")
    out = [st.bold(f"Step time: mean {fmt(s.step_ms_mean)} ms, max {fmt(s.step_ms_max)} ms ({count})")]
    rows = [[label, fmt(s.ms_of(getattr(s, k)), "{:.2f}"), fmt(getattr(s, k), "{:.1f}%")] for k, label in s.PARTS
            if k in _ALWAYS_PARTS or getattr(s, k) is None or getattr(s, k) >= 0.05]  # memcpy, other: when they are
    out += table(["part of step", "ms/step", "share"], rows)
    out.append(f"  communication (all) {fmt(s.ms_of(s.comm_pct), '{:.2f}')} ms/step ({fmt(s.comm_pct, '{:.1f}%')} of "
               f"step), {fmt(s.overlap_pct, '{:.1f}%')} of it overlapped by compute")
    return out


def _clock(clock: dict[str, ClockRow], st: Style) -> list[str]:
    """One line per host when there are few; else how the hosts were aligned, with their ranges, and the hosts whose
    alignment is worst (largest residual)."""
    if not clock:
        return []
    out = [st.bold("Clock alignment")]
    refs = [h for h, c in clock.items() if c.method == "reference"]
    if len(clock) > _MAX_HOST_ROWS and len(refs) == 1:
        out[0] += f" (reference {name(refs[0])})"
    if len(clock) <= _MAX_HOST_ROWS:
        return out + [f"  {name(h)}: offset {c.offset_ns / 1e6:+.3f} ms, drift {fmt(c.drift_ppm, '{:.2f}')} ppm, "
                      f"residual {fmt(c.residual_us, '{:.0f}')} us ({c.method})" for h, c in clock.items()]
    by_method: dict[str, list[str]] = {}
    for h, c in clock.items():
        by_method.setdefault(str(c.method), []).append(h)
    for method, hosts in sorted(by_method.items(), key=lambda kv: -len(kv[1])):
        if method == "reference":
            if len(hosts) == 1:
                continue  # named in the title
            out.append(f"  reference: {', '.join(name(h) for h in hosts[:MAX_OUTLIERS])}"
                       + (f" and {len(hosts) - MAX_OUTLIERS} more" if len(hosts) > MAX_OUTLIERS else ""))
            continue
        offs = [clock[h].offset_ns / 1e6 for h in hosts]
        drifts = [clock[h].drift_ppm or 0.0 for h in hosts]
        out.append(f"  {len(hosts)} host(s) by {method}: offsets {min(offs):+.3f} .. {max(offs):+.3f} ms, drift "
                   f"{min(drifts):.2f} .. {max(drifts):.2f} ppm" + (f" ({name(hosts[0])})" if len(hosts) == 1 else ""))
    res = sorted(((c.residual_us or 0.0, h) for h, c in clock.items()), reverse=True)
    worst = [(x, h) for x, h in res[:MAX_OUTLIERS] if x > 0]
    out.append(f"  residual: max {res[0][0]:.0f} us ({name(res[0][1])}), median {res[len(res) // 2][0]:.0f} us"
               + (" — worst: " + ", ".join(f"{name(h)} {x:.0f} us" for x, h in worst) if worst else ""))
    return out


def _stragglers(report: Report, st: Style) -> list[str]:
    """The straggler table, the late hosts and the rule; a line saying so when no collective matched (or none was
    recorded: a report of a --watch series alone)."""
    info, ranks = report.straggler_info, report.stragglers or []
    floor = fmt(info.rule.threshold_ms if info else None, "{:.2f}")
    out = [st.bold(f"Stragglers ({info.n_instances if info else 0} collective instances, floor {floor} ms)")]
    if not ranks or info is None:
        return out + ["  no collective matched across ranks"]
    if not any(d.named for d in ranks):
        out += _no_straggler(ranks, floor, st)
    out += _straggler_table(ranks, st)
    slow = {f.host for f in report.findings if f.id == "straggler_host"}
    out += _late_hosts([h for h in info.hosts if h.named and h.host in slow], st)
    return out + _straggler_notes(info, st)


def _no_straggler(ranks: list[StragglerRank], floor: str, st: Style) -> list[str]:
    """Why no rank is named: the latest rank's lateness, and whether the run had too few steps to tell."""
    worst = max(ranks, key=lambda d: d.lateness_ms or 0)
    out = [f"  no straggler: no rank is late by >= {floor} ms in most steps (latest: rank {worst.rank}, "
           f"{fmt(worst.lateness_ms, '{:.2f}')} ms lateness, late in "
           f"{fmt(100 * (worst.late_step_fraction or 0), '{:.0f}')} % of steps)"]
    return out


def _straggler_table(ranks: list[StragglerRank], st: Style) -> list[str]:
    """One row per rank: its lateness and extra work, how long each other rank waits for it and it for them."""
    others = max(len(ranks) - 1, 1)
    shown = ranks if len(ranks) <= MAX_RANK_ROWS else (  # many ranks: the named, then the next few (report order)
        [d for d in ranks if d.named][:MAX_RANK_ROWS] + [d for d in ranks if not d.named][:MAX_OUTLIERS])
    rows = [[str(d.rank), name(d.host), fmt(d.lateness_ms, "{:.2f}"), fmt(100 * (d.late_step_fraction or 0),
                                                                                "{:.0f}%"),
             fmt(d.extra_work_ms, "{:.2f}"), fmt(d.blame_ms_per_step / others, "{:.2f}"),
             fmt(d.wait_ms_per_step, "{:.2f}"), fmt(100 * d.late_fraction, "{:.0f}%"), "STRAGGLER" if d.named else ""]
            for d in shown]
    lines = table(["rank", "host", "late ms", "late steps", "extra work ms", "each other waits ms", "it waits ms",
                   "last", ""], rows)
    out = [st.red(x) if x.rstrip().endswith("STRAGGLER") else x for x in lines]
    if len(ranks) > len(shown):
        out.append(st.dim(f"  ... {len(ranks) - len(shown)} more ranks in report.json"))
    return out


def _late_hosts(hosts: list[StragglerHost], st: Style) -> list[str]:
    """The named late hosts a finding reports."""
    out = [st.red(f"  late host {name(h.host)} (ranks {rank_ranges(h.ranks)}): "
                  f"{fmt(h.lateness_ms, '{:.2f}')} ms lateness, last in "
                  f"{100 * h.late_fraction:.0f}% of collectives") for h in hosts[:MAX_OUTLIERS]]
    if len(hosts) > MAX_OUTLIERS:
        out.append(st.dim(f"  ... {len(hosts) - MAX_OUTLIERS} more late hosts in report.json"))
    return out


def _straggler_notes(info: StragglerInfo, st: Style) -> list[str]:
    """The clock-free check where it disagrees, the steps where the straggler changes, and the rule."""
    out = []
    cf = info.clock_free
    if cf.agrees is False:
        out.append(st.dim(f"  clock-free check: top rank by durations is {cf.top_rank},"
                          f" by aligned arrivals {cf.top_rank_by_lateness}"))
    if info.changes:
        txt = ", ".join(f"step {c.step}: {c.from_rank} -> {c.to_rank}" for c in info.changes[:_MAX_CHANGES])
        more = f" (+{len(info.changes) - _MAX_CHANGES} more)" if len(info.changes) > _MAX_CHANGES else ""
        out.append(f"  straggler changes: {txt}{more}".replace("None", "none"))
    return out + [st.dim(x) for x in wrap(_rule_line(info), "  ", "    ")]


def _rule_line(info: StragglerInfo) -> str:
    """The naming rule in figures: how often a rank must reach the floor, and what the floor came from (in words:
    report.json's straggler_info.rule.text and docs/report-format.md)."""
    r = info.rule
    return (f"rule: named when late by the floor in >= {r.min_late_fraction:.0%} of its steps; floor "
            f"{r.threshold_ms:.2f} ms, the largest of {r.min_lateness_ms:g} ms, {r.from_clock_residual_ms:.2f} "
            f"({r.residual_factor:g} x clock residual), {r.from_step_time_ms:.2f} ({r.step_fraction:g} x step) and "
            f"{r.from_noise_ms:.2f} ({r.noise_factor:g} x step noise, at most {r.max_noise_fraction:g} x step)")


def _explained(fs: list[Finding]) -> set[int]:
    """The ranks whose straggler finding (among those printed) already lists the ops they differ in."""
    return {int(f.rank) for f in fs[:_MAX_FINDINGS] if f.id == "straggler_rank" and f.rank is not None
            and "differs most in:" in f.evidence}


def _root_cause(rcs: list[RootCause], explained: set[int]) -> list[str]:
    """The ops each of the top ranks spends longer in than its peers (a rank whose straggler finding printed them
    is left out: each fact once)."""
    out: list[str] = []
    for rc in rcs:
        if int(rc.rank) in explained:
            continue
        out.append(f"Root cause, rank {rc.rank} ({name(rc.host)}, {rc.n_steps} steps vs. the other ranks' median):")
        if not rc.ops:
            out.append("  no op took longer than on the other ranks")
        out += [f"  +{op.excess_ms_per_step:.2f} ms/step  {display_name(op.name)} ({op.kind}):"
                f" {op.rank_ms_per_step:.2f} vs {op.others_median_ms_per_step:.2f} ms/step"
                for op in rc.ops[:_MAX_ROOT_CAUSE_OPS]]
    return out


def _bytes(x: float | None) -> str:
    if x is None:
        return "-"
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= k:
            return f"{x / k:.1f} {unit}"
    return f"{x:.0f} B"


def _collectives(rows: list[CommRow], st: Style) -> list[str]:
    if not rows:
        return []
    out = [st.bold("Collectives per group and op (per rank and step)")]
    body = [[name(r.group, 24) + (f" x{r.n_groups}" if r.n_groups > 1 else ""), str(r.group_size), name(r.op, 24),
             fmt(r.calls_per_step, "{:.1f}"), _bytes(r.bytes_per_step), fmt(r.ms_per_step, "{:.2f}"),
             fmt(r.exposed_ms_per_step, "{:.2f}"),
             "-" if r.slowest_rank is None else f"{r.slowest_rank} ({100 * (r.slowest_share or 0):.0f}%)"]
            for r in rows[:_MAX_COMM_ROWS]]
    out += table(["group", "size", "op", "calls", "bytes", "ms", "exposed ms", "last in"], body)
    if len(rows) > _MAX_COMM_ROWS:
        out.append(st.dim(f"  ... {len(rows) - _MAX_COMM_ROWS} more rows in report.json"))
    return out


def _pipeline_title(p: Pipeline) -> str:
    """The stage order (its first ranks), the micro-batches and the bubble."""
    chain = " -> ".join(str(r) for r in p.ranks[:_MAX_CHAIN]) + (" ..." if len(p.ranks) > _MAX_CHAIN else "")
    ideal = "" if p.ideal_bubble_pct is None else f" (fill and drain alone: {p.ideal_bubble_pct:.0f} %)"
    return (f"Pipeline {chain}: {len(p.stages)} stages, {p.micro_batches:g} micro-batches per step, bubble "
            f"{p.bubble_pct:.0f} % of step time{ideal}")


def _pipelines(pipes: list[Pipeline], st: Style) -> list[str]:
    """Per pipeline (at most MAX_OUTLIERS) its stages: step, compute and wait time, and what the others wait for."""
    out = []
    for p in pipes[:MAX_OUTLIERS]:
        out.append(st.bold(_pipeline_title(p)))
        body = [[str(s.stage), str(s.rank), fmt(s.step_ms, "{:.1f}"), fmt(s.busy_ms, "{:.1f}"),
                 fmt(s.wait_ms, "{:.1f}"), fmt(s.wait_pct, "{:.0f}%"), fmt(s.caused_ms, "{:.1f}")]
                for s in p.stages[:MAX_RANK_ROWS]]
        out += table(["stage", "rank", "step ms", "compute ms", "waits ms", "waits", "others wait for it ms"], body)
        if len(p.stages) > MAX_RANK_ROWS:
            out.append(st.dim(f"  ... {len(p.stages) - MAX_RANK_ROWS} more stages in report.json"))
    if len(pipes) > MAX_OUTLIERS:
        out.append(st.dim(f"  ... {len(pipes) - MAX_OUTLIERS} more pipelines in report.json"))
    return out
