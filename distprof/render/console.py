"""Terminal summary of a report: verdict and findings first, then run, clocks, step breakdown, stragglers, root
cause, overlap, imbalance, user annotations, MFU.

Plain text; ANSI bold/colour only when asked (``color=True``) — the CLI asks only when stdout is a TTY. Keys a report
lacks (older reports) are skipped.

Bounded whatever the rank count (about 80 lines at 1,024 ranks): tables of one row per rank show every rank up to
``_MAX_RANK_ROWS``; beyond, a distribution (min, median, p90, max, with the extreme ranks named) and the outliers
that matter; hosts are summarised the same way; at most ``_MAX_WARNINGS`` warnings. Every per-rank figure stays in
report.json.

Every string of the report is made safe for a terminal first (:func:`terminal_text`): names come from traces and
shards, and a name holding ``\x1b]0;TITLE\x07`` or ``\nVerdict: ...`` must print as text, not retitle the terminal or
forge a line. Control characters are escaped; a run of more than 240 non-blank characters is shortened in the middle;
hosts, run ids and devices are bounded as names.
"""

from __future__ import annotations

import logging
import re
import textwrap
from typing import Any

from ..analysis.names import display_name, rank_ranges
from .console_watch import watch_lines
from .console_whatif import critical_path_lines, gain_text, whatif_lines

logger = logging.getLogger(__name__)

__all__ = ["render_console", "terminal_text"]

_MAX_RANK_ROWS = 8
_MAX_OUTLIERS = 3
_MAX_HOST_ROWS = 8
_MAX_WARNINGS = 6
_WIDTH = 116
_MAX_FINDINGS = 8
_MAX_ANNOTATIONS = 10
_SEVERITY_TAG = {"high": "HIGH", "medium": "MED ", "low": "LOW "}


#: What a terminal would act on rather than print: C0 controls (newline, carriage return, escape, bell, ...), DEL, C1
#: controls (CSI, OSC, ...), bidirectional overrides/isolates and Unicode line/paragraph separators.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: Longest run of non-blank characters printed whole (a path fits; a 10,000-character name does not).
MAX_TOKEN = 240
_LONG_TOKEN = re.compile(r"\S{%d,}" % (MAX_TOKEN + 1))


def _escape(m: re.Match) -> str:
    c = m.group(0)
    return _ESCAPES.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def _shorten(m: re.Match) -> str:
    t = m.group(0)
    return t[: MAX_TOKEN // 2 - 1] + "…" + t[-(MAX_TOKEN // 2):]


def terminal_text(text: Any) -> str:
    """`text` safe to print on a terminal as one piece of a line: control characters escaped (``\\x1b``, ``\\n``),
    runs of more than MAX_TOKEN non-blank characters shortened in the middle."""
    s = str(text)
    if _UNSAFE.search(s):
        s = _UNSAFE.sub(_escape, s)
    if len(s) > MAX_TOKEN and _LONG_TOKEN.search(s):
        s = _LONG_TOKEN.sub(_shorten, s)
    return s


def _safe(x: Any) -> Any:
    """A copy of a report with every string (keys included) made terminal-safe."""
    if isinstance(x, str):
        return terminal_text(x)
    if isinstance(x, dict):
        return {(terminal_text(k) if isinstance(k, str) else k): _safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_safe(v) for v in x]
    return x


#: Report sections of numbers only (one record per rank and step: large), left as they are by _safe.
_NUMERIC_SECTIONS = frozenset({"steps"})


def _name(x: Any, limit: int = 64) -> str:
    """A host, run id or device as a bounded name."""
    return display_name(str(x), limit)


def _f(x: Any, fmt: str = "{:.1f}", none: str = "-") -> str:
    return none if x is None else fmt.format(x)


def _table(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return (indent + "  ".join(c.rjust(w) if i else c.ljust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths)))).rstrip()

    return [line(header)] + [line(r) for r in rows]


class _Style:
    def __init__(self, color: bool):
        self.color = color

    def _w(self, code: str, s: str) -> str:
        return f"\x1b[{code}m{s}\x1b[0m" if self.color else s

    def bold(self, s: str) -> str:
        return self._w("1", s)

    def red(self, s: str) -> str:
        return self._w("1;31", s)

    def dim(self, s: str) -> str:
        return self._w("2", s)

    def yellow(self, s: str) -> str:
        return self._w("33", s)


def _wrap(text: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, width=_WIDTH, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=False) or [first.rstrip()]


def render_console(report: dict[str, Any], *, color: bool = False, top: int = 3) -> str:
    """The terminal summary as one string (ends with a newline); every string from the report terminal-safe."""
    report = {k: v if k in _NUMERIC_SECTIONS else _safe(v) for k, v in report.items()}
    st = _Style(color)
    out: list[str] = []
    run = report.get("run", {})
    n_present = len(run.get("ranks_present", []))
    steps_txt = (
        f"steps {run.get('first_step')}-{run.get('last_step')} ({run.get('n_steps')} steps)"
        if run.get("n_steps")
        else "no steps"
    )
    out.append(
        st.bold(f"distprof report: run {_name(run.get('id'), 80)}")
        + f" - {n_present}/{run.get('world_size')} ranks on {run.get('n_hosts')} host(s), {steps_txt}, "
        f"{'/'.join(_name(b, 32) for b in run.get('backend', []))}, "
        f"{'/'.join(_name(d) for d in run.get('devices', []))}"
    )
    if run.get("ranks_missing"):
        out.append(st.red(f"  missing ranks: {rank_ranges(run['ranks_missing'])}"))

    verdict = report.get("verdict")
    if verdict:
        out += [st.bold(x) for x in _wrap(verdict, "Verdict: ", "  ")]
    out += _findings(report, st)
    par = report.get("parallelism") or {}
    if par.get("styles") or par.get("mesh"):
        out.append(st.bold("Parallelism: ") + str(par.get("label")))

    out += _clock(report.get("clock", {}), st)

    out += _summary(report.get("summary", {}), st)
    out += watch_lines(report.get("watch"), st)
    out += _stragglers(report, st, top)
    out += critical_path_lines(report, st.bold) + whatif_lines(report, st.bold)
    out += _collectives(report, st)
    out += _pipelines(report, st)
    out += _root_cause(report)
    out += _overlap(report)
    out += _gpu_time(report)
    out += _imbalance(report)
    out += _annotations(report, st)

    mfu = report.get("mfu") or []
    if mfu:
        out += _per_rank(
            st.bold("MFU"), ["rank", "device", "TFLOP/s", "peak", "MFU", "peak from"], mfu,
            lambda m: [str(m["rank"]), _name(m.get("device", "")), _f(m.get("achieved_tflops"), "{:.2f}"),
                       _f(m["peak_tflops"], "{:.0f}"), _f(None if m.get("mfu") is None else 100 * m["mfu"],
                                                          "{:.1f}%"), m.get("peak_source", "")],
            key=lambda m: m.get("mfu"), label="MFU", fmt="{:.1%}", worst="low")
    elif report.get("mfu_note"):
        out.append(st.dim(f"MFU: {report['mfu_note']}"))

    warnings = report.get("warnings", [])
    for w in warnings[:_MAX_WARNINGS]:
        out.append(st.red(f"warning: {w}"))
    if len(warnings) > _MAX_WARNINGS:
        out.append(st.dim(f"  ... {len(warnings) - _MAX_WARNINGS} more warnings in report.json"))
    return "\n".join(out) + "\n"


_MAX_COMM_ROWS = 8


def _bytes(x: Any) -> str:
    if x is None:
        return "-"
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= k:
            return f"{x / k:.1f} {unit}"
    return f"{x:.0f} B"


def _collectives(report: dict[str, Any], st: _Style) -> list[str]:
    rows = report.get("collectives") or []
    if not rows:
        return []
    out = [st.bold("Collectives per group and op (per rank and step)")]
    body = [[_name(r["group"], 24) + (f" x{r['n_groups']}" if r.get("n_groups", 1) > 1 else ""),
             str(r.get("group_size", "")), _name(r["op"], 24), _f(r["calls_per_step"], "{:.1f}"),
             _bytes(r.get("bytes_per_step")), _f(r["ms_per_step"], "{:.2f}"), _f(r["exposed_ms_per_step"], "{:.2f}"),
             "-" if r.get("slowest_rank") is None else
             f"{r['slowest_rank']} ({100 * (r.get('slowest_share') or 0):.0f}%)"]
            for r in rows[:_MAX_COMM_ROWS]]
    out += _table(["group", "size", "op", "calls", "bytes", "ms", "exposed ms", "last in"], body)
    if len(rows) > _MAX_COMM_ROWS:
        out.append(st.dim(f"  ... {len(rows) - _MAX_COMM_ROWS} more rows in report.json"))
    return out


def _pipelines(report: dict[str, Any], st: _Style) -> list[str]:
    out = []
    for p in (report.get("pipelines") or [])[:_MAX_OUTLIERS]:
        ideal = p.get("ideal_bubble_pct")
        out.append(st.bold(f"Pipeline {' -> '.join(str(r) for r in p['ranks'][:16])}"
                           + (" ..." if len(p["ranks"]) > 16 else "")
                           + f": {len(p['stages'])} stages, {p['micro_batches']:g} micro-batches per step, bubble "
                           f"{p['bubble_pct']:.0f} % of step time"
                           + (f" (fill and drain alone: {ideal:.0f} %)" if ideal is not None else "")))
        body = [[str(s["stage"]), str(s["rank"]), _f(s["step_ms"], "{:.1f}"), _f(s["busy_ms"], "{:.1f}"),
                 _f(s["wait_ms"], "{:.1f}"), _f(s["wait_pct"], "{:.0f}%"), _f(s["caused_ms"], "{:.1f}")]
                for s in p["stages"][:_MAX_RANK_ROWS]]
        out += _table(["stage", "rank", "step ms", "compute ms", "waits ms", "waits", "others wait for it ms"],
                      body)
        if len(p["stages"]) > _MAX_RANK_ROWS:
            out.append(st.dim(f"  ... {len(p['stages']) - _MAX_RANK_ROWS} more stages in report.json"))
    if len(report.get("pipelines") or []) > _MAX_OUTLIERS:
        out.append(st.dim(f"  ... {len(report['pipelines']) - _MAX_OUTLIERS} more pipelines in report.json"))
    return out


def _quantiles(items: list[dict[str, Any]], key, fmt: str) -> str:
    """'min X (rank a), median Y, p90 Z, max W (rank b)' of key(item) over the items that have it."""
    vals = sorted(((key(x), x["rank"]) for x in items if key(x) is not None), key=lambda v: v[0])
    if not vals:
        return "no values"
    n = len(vals)

    def at(q: float):
        return vals[min(n - 1, int(q * (n - 1) + 0.5))][0]

    return (f"min {fmt.format(vals[0][0])} (rank {vals[0][1]}), median {fmt.format(at(0.5))}, p90 "
            f"{fmt.format(at(0.9))}, max {fmt.format(vals[-1][0])} (rank {vals[-1][1]})")


def _clock(clock: dict[str, Any], st: _Style) -> list[str]:
    """One line per host when there are few; else how the hosts were aligned, with their ranges, and the hosts whose
    alignment is worst (largest residual)."""
    if not clock:
        return []
    out = [st.bold("Clock alignment")]

    def line(host: str, c: dict[str, Any]) -> str:
        return (f"  {_name(host)}: offset {c.get('offset_ns', 0) / 1e6:+.3f} ms, drift {_f(c.get('drift_ppm'), '{:.2f}')}"
                f" ppm, residual {_f(c.get('residual_us'), '{:.0f}')} us ({c.get('method')})")

    if len(clock) <= _MAX_HOST_ROWS:
        return out + [line(h, c) for h, c in clock.items()]
    by_method: dict[str, list[str]] = {}
    for h, c in clock.items():
        by_method.setdefault(str(c.get("method")), []).append(h)
    for method, hosts in sorted(by_method.items(), key=lambda kv: -len(kv[1])):
        if method == "reference":
            out.append(f"  reference: {', '.join(_name(h) for h in hosts[:_MAX_OUTLIERS])}"
                       + (f" and {len(hosts) - _MAX_OUTLIERS} more" if len(hosts) > _MAX_OUTLIERS else ""))
            continue
        cs = [clock[h] for h in hosts]
        offs = [c.get("offset_ns", 0) / 1e6 for c in cs]
        drifts = [c.get("drift_ppm") or 0.0 for c in cs]
        out.append(f"  {len(hosts)} host(s) by {method}: offsets {min(offs):+.3f} .. {max(offs):+.3f} ms, drift "
                   f"{min(drifts):.2f} .. {max(drifts):.2f} ppm" + (f" ({_name(hosts[0])})" if len(hosts) == 1 else ""))
    res = sorted(((c.get("residual_us") or 0.0, h) for h, c in clock.items()), reverse=True)
    worst = [(r, h) for r, h in res[:_MAX_OUTLIERS] if r > 0]
    out.append(f"  residual: max {res[0][0]:.0f} us ({_name(res[0][1])}), median {res[len(res) // 2][0]:.0f} us"
               + (" — worst: " + ", ".join(f"{_name(h)} {r:.0f} us" for r, h in worst) if worst else ""))
    return out


#: Below this many recorded steps an unnamed run says that small stragglers cannot be resolved (the own-work sign test
#: needs 8 steps with two ranks at 99 %, 9 with four).
FEW_STEPS = 10


def _stragglers(report: dict[str, Any], st: _Style, top: int) -> list[str]:
    info = report.get("straggler_info", {})
    ranks = report.get("stragglers", [])
    rule = info.get("rule", {})
    out = [st.bold(f"Stragglers ({info.get('n_instances', 0)} collective instances,"
                   f" floor {_f(rule.get('threshold_ms'), '{:.2f}')} ms)")]
    if not ranks:
        out.append("  no collective matched across ranks")
        return out
    named = [d for d in ranks if d.get("named")]
    if not named:
        worst = max(ranks, key=lambda d: d.get("mean_lateness_ms") or 0)
        out.append(
            f"  no straggler: no rank is late beyond the others by >= {_f(rule.get('threshold_ms'), '{:.2f}')} ms "
            f"consistently across steps (latest: rank {worst['rank']}, {_f(worst.get('mean_lateness_ms'), '{:.2f}')}"
            f" ms mean lateness)"
        )
        n_steps = max((d.get("n_steps") or 0) for d in ranks)
        if 1 < n_steps < FEW_STEPS:
            out.append(st.dim(f"  only {n_steps} recorded steps: too few to tell a straggler of a few percent from noise; "
                              f"record more (--active {3 * FEW_STEPS})"))
    rows = []
    for d in ranks[:_MAX_RANK_ROWS]:
        rows.append([
            str(d["rank"]), _name(d["host"]), _f(d.get("cost_ms_per_step"), "{:.2f}"),
            _f(d["mean_lateness_ms"], "{:.2f}"), _f(d.get("cpu_wait_excess_ms"), "{:.2f}"),
            _f(d.get("mean_excess_ms"), "{:.2f}"), _f(d.get("own_excess_median_ms"), "{:.2f}"),
            _f(100 * (d.get("excess_step_fraction") or 0), "{:.0f}%"), _f(100 * d["late_fraction"], "{:.0f}%"),
            _f(d["clock_free_lateness_ms"], "{:.2f}"), "STRAGGLER" if d["named"] else "",
        ])
    lines = _table(["rank", "host", "cost ms/step", "mean late ms", "cpu-wait ms", "excess ms", "own ms", "late steps",
                    "last",
                    "clock-free late ms", ""], rows)
    out += [st.red(x) if x.rstrip().endswith("STRAGGLER") else x for x in lines]
    if len(ranks) > _MAX_RANK_ROWS:
        out.append(st.dim(f"  ... {len(ranks) - _MAX_RANK_ROWS} more ranks in report.json"))
    slow = {f.get("host") for f in report.get("findings") or [] if f.get("id") == "straggler_host"}
    hosts = [h for h in info.get("hosts", []) if h.get("named") and h.get("host") in slow]
    for h in hosts[:_MAX_OUTLIERS]:
        out.append(st.red(f"  late host {_name(h['host'])} (ranks {rank_ranges(h['ranks'])}): "
                          f"{_f(h['mean_lateness_ms'], '{:.2f}')} ms mean lateness, last in "
                          f"{100 * h['late_fraction']:.0f}% of collectives"))
    if len(hosts) > _MAX_OUTLIERS:
        out.append(st.dim(f"  ... {len(hosts) - _MAX_OUTLIERS} more late hosts in report.json"))
    cf = info.get("clock_free", {})
    if cf.get("agrees") is False:
        out.append(st.dim(f"  clock-free check: top rank by durations is {cf.get('top_rank')},"
                          f" by aligned arrivals {cf.get('top_rank_by_lateness')}"))
    changes = info.get("changes", [])
    if changes:
        txt = ", ".join(f"step {c['step']}: {c['from_rank']} -> {c['to_rank']}" for c in changes[:10])
        more = f" (+{len(changes) - 10} more)" if len(changes) > 10 else ""
        out.append(f"  straggler changes: {txt}{more}".replace("None", "none"))
    out += [st.dim(x) for x in _wrap(f"rule: {rule.get('text', '')}", "  ", "    ")]
    return out


def _root_cause(report: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for rc in report.get("root_cause", []):
        out.append(f"Root cause, rank {rc['rank']} ({_name(rc['host'])}, {rc['n_steps']} steps vs. the other ranks' median):")
        if not rc["ops"]:
            out.append("  no op took longer than on the other ranks")
        for op in rc["ops"][:5]:
            out.append(
                f"  +{op['excess_ms_per_step']:.2f} ms/step  {display_name(op['name'])} ({op['kind']}):"
                f" {op['rank_ms_per_step']:.2f} vs {op['others_median_ms_per_step']:.2f} ms/step"
            )
    return out


def _per_rank(title: str, header: list[str], items: list[dict[str, Any]], row, *, key, label: str, fmt: str,
              worst: str = "high") -> list[str]:
    """A titled table of one row per rank; with more than ``_MAX_RANK_ROWS`` ranks, the distribution of `key` (named
    `label`, formatted with `fmt`) and the ``_MAX_OUTLIERS`` ranks at its `worst` end ("high" or "low") instead."""
    if not items:
        return []
    if len(items) <= _MAX_RANK_ROWS:
        return [title] + _table(header, [row(x) for x in items])
    have = [x for x in items if key(x) is not None]
    out_rows = sorted(have, key=key, reverse=worst == "high")[:_MAX_OUTLIERS]
    return ([title, f"  {label} over {len(items)} ranks: {_quantiles(items, key, fmt)}",
             f"  the {len(out_rows)} {'highest' if worst == 'high' else 'lowest'} (all ranks in report.json):"]
            + _table(header, [row(x) for x in out_rows], indent="    "))


def _overlap(report: dict[str, Any]) -> list[str]:
    return _per_rank(
        "Communication overlap per rank",
        ["rank", "mode", "comm ms/step", "exposed ms/step", "overlap", "exposed of step"],
        report.get("overlap") or [],
        lambda o: [str(o["rank"]), o["mode"], _f(o["comm_ms_per_step"], "{:.2f}"),
                   _f(o["exposed_comm_ms_per_step"], "{:.2f}"), _f(o["overlap_pct"], "{:.1f}%"),
                   _f(o["exposed_pct"], "{:.1f}%")],
        key=lambda o: o.get("exposed_pct"), label="exposed communication, % of step", fmt="{:.1f}%")


def _gpu_time(report: dict[str, Any]) -> list[str]:
    return _per_rank(
        "GPU time per rank (HTA's temporal breakdown and comm/comp overlap, all recorded steps)",
        ["rank", "span ms", "idle", "compute", "non-compute", "comm overlap"],
        report.get("gpu_time") or [],
        lambda g: [str(g["rank"]), _f(g.get("span_us", 0) / 1e3, "{:.1f}"), _f(g.get("idle_pct"), "{:.2f}%"),
                   _f(g.get("compute_pct"), "{:.2f}%"), _f(g.get("non_compute_pct"), "{:.2f}%"),
                   _f(g.get("overlap_pct"), "{:.2f}%")],
        key=lambda g: g.get("idle_pct"), label="GPU idle, % of span", fmt="{:.2f}%")


def _imbalance(report: dict[str, Any]) -> list[str]:
    metrics = (report.get("imbalance") or {}).get("metrics") or {}
    if not metrics:
        return []
    fmt = {"compute_ms": "{:.2f}", "flops": "{:.3g}", "tflops": "{:.4f}", "peak_mem_bytes": "{:.3g}",
           "step_ms": "{:.2f}"}
    rows = []
    for name, m in metrics.items():
        if m.get("mean") is None:
            continue
        f = fmt.get(name, "{:.3g}")
        rows.append([
            name, _f(m["min"], f), _f(m["mean"], f), f"{_f(m['max'], f)} (rank {m['max_rank']})",
            _f(None if m["lambda"] is None else 100 * m["lambda"], "{:.1f}%"), _f(m["cv"], "{:.3f}"),
            _f(m["lb"], "{:.3f}"),
        ])
    return ["Imbalance across ranks"] + _table(["metric", "min", "mean", "max", "lambda", "CV", "LB"], rows)


_SUMMARY_ROWS = (("compute_pct", "compute"), ("exposed_comm_pct", "exposed communication"), ("memcpy_pct", "memcpy"),
                 ("idle_pct", "idle"), ("other_pct", "other"))


def _summary(s: dict[str, Any], st: _Style) -> list[str]:
    if not s.get("n_rank_steps"):
        return []
    mean = s.get("step_ms_mean")
    out = [st.bold(f"Step time: mean {_f(mean)} ms, max {_f(s.get('step_ms_max'))} ms"
                   f" ({s.get('n_steps')} steps x {s['n_rank_steps'] // max(s.get('n_steps') or 1, 1)} ranks)")]

    def ms(pct: Any) -> str:
        return _f(None if pct is None or mean is None else pct * mean / 100, "{:.2f}")

    rows = [[label, ms(s.get(k)), _f(s.get(k), "{:.1f}%")] for k, label in _SUMMARY_ROWS]
    rows.append(["communication (all)", ms(s.get("comm_pct")), _f(s.get("comm_pct"), "{:.1f}%")])
    out += _table(["part of step", "ms/step", "share"], rows)
    out.append(f"  {_f(s.get('overlap_pct'), '{:.1f}%')} of communication overlapped by compute")
    return out


def _findings(report: dict[str, Any], st: _Style) -> list[str]:
    fs = report.get("findings")
    if fs is None:
        return []
    if not fs:
        return [st.bold("Findings: none") + " (no rule fired; thresholds in docs/report-format.md)"]
    out = [st.bold(f"Findings ({len(fs)}, most severe first)")]
    for i, f in enumerate(fs[:_MAX_FINDINGS], 1):
        sev = f.get("severity", "low")
        tag = _SEVERITY_TAG.get(sev, sev.upper())
        color = st.red if sev == "high" else st.yellow if sev == "medium" else (lambda x: x)
        out.append(f"  {i}. " + color(f"[{tag.strip()}]") + " " + st.bold(str(f.get("title", ""))))
        out += _wrap(str(f.get("evidence", "")), "     ", "     ")
        out += [st.dim(x) for x in _wrap("Fix: " + str(f.get("advice", "")), "     ", "       ")]
        if gain_text(f):
            out += _wrap(gain_text(f), "     ", "       ")
    if len(fs) > _MAX_FINDINGS:
        out.append(st.dim(f"  ... {len(fs) - _MAX_FINDINGS} more findings in report.json"))
    return out


def _annotations(report: dict[str, Any], st: _Style) -> list[str]:
    ann = report.get("annotations") or []
    if not ann:
        return []
    ranks = sorted({r for a in ann for r in a.get("ranks", {})}, key=int)
    per_rank = len(ranks) <= _MAX_RANK_ROWS
    header = ["annotation"] + ([f"r{r} ms" for r in ranks] if per_rank else ["min ms", "mean ms", "max ms"])
    header += ["calls/step", "spread"]
    rows = []
    for a in ann[:_MAX_ANNOTATIONS]:
        vals = [a["ranks"][r]["ms_per_step"] if r in a["ranks"] else 0.0 for r in ranks]
        calls = [a["ranks"][r]["count_per_step"] for r in a["ranks"]]
        name = display_name(a["name"], 40)
        cells = [_f(v, "{:.2f}") for v in vals] if per_rank else [
            _f(min(vals), "{:.2f}"), _f(sum(vals) / len(vals), "{:.2f}"), _f(max(vals), "{:.2f}")]
        rows.append([name] + cells + [_f(max(calls) if calls else None, "{:.1f}"),
                                      _f(a.get("spread_pct"), "{:.0f}%")])
    out = [st.bold("User annotations (record_function), ms per step")] + _table(header, rows)
    if len(ann) > _MAX_ANNOTATIONS:
        out.append(st.dim(f"  ... {len(ann) - _MAX_ANNOTATIONS} more in report.json"))
    return out
