"""The terminal page of ``distprof diff`` (a ``RunDiff``): verdict, the three splits, comparisons."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .console_text import Style, table, terminal_text, wrap

if TYPE_CHECKING:
    from ..analysis.report.diff import Part, RunDiff

__all__ = ["render_diff"]

_HEAD = ["", "A ms/step", "B ms/step", "change", "noise", "share", ""]
_TITLES = {"phase": "By phase", "rank": "By rank (time on the cross-rank critical path)",
           "collective": "By collective (exposed communication per group and op)"}


def _f(x: float | None, fmt: str = "{:+.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _rows(parts: list[Part]) -> list[list[str]]:
    return [[terminal_text(p.label)[:56], _f(p.a, "{:.4g}"), _f(p.b, "{:.4g}"), _f(p.delta), "+/-" + _f(p.band, "{:.2f}"),
             _f(p.share_pct, "{:.0f}%") if p.share_pct is not None else "", "*" if p.significant else ""]
            for p in parts]


def _op_rows(parts: list[Part]) -> list[list[str]]:
    return [[terminal_text(p.label)[:56], _f(p.a, "{:.3f}"), _f(p.b, "{:.3f}"), _f(p.delta, "{:+.3f}"),
             "+/-" + _f(p.band, "{:.3f}"), _f(p.op.per_call_a_ms if p.op else None, "{:.4f}"),
             _f(p.op.per_call_b_ms if p.op else None, "{:.4f}"), "*" if p.significant else ""] for p in parts]


def render_diff(d: RunDiff, *, color: bool = False) -> str:
    st = Style(color)
    out = [st.bold(f"distprof diff: A = {terminal_text(d.a_id)} ({d.a_world} ranks), "
                   f"B = {terminal_text(d.b_id)} ({d.b_world} ranks)")]
    out += [st.bold(x) for x in wrap(terminal_text(d.verdict), "Verdict: ", "  ")]
    out.append(st.bold("Step time"))
    out += table(_HEAD, _rows([d.step]))
    for k, sp in d.splits.items():
        out.append(st.bold(_TITLES.get(k, k)) + f" (parts add up to {sp.total:+.2f} ms)")
        out += table(_HEAD, _rows(sp.parts))
    if d.ops:
        out.append(st.bold("Ops (own time per step; ops nest, so these do not add up)"))
        out += table(["op", "A ms/step", "B ms/step", "change", "noise", "A ms/call", "B ms/call", ""],
                     _op_rows(d.ops))
    comp = d.memory + d.flops
    if comp:
        out.append(st.bold("Memory and FLOPs"))
        out += table(["", "A", "B", "change", "noise", "", ""], _rows(comp))
    out.append(st.dim("* beyond its noise band (step-to-step spread, at least "
                      f"{d.rules.floor_pct:g} % of A's value)"))
    return "\n".join(out) + "\n"
