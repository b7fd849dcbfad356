"""The terminal page of ``distprof diff`` (from ``RunDiff.to_dict()``): verdict, the three splits, comparisons."""

from __future__ import annotations

from typing import Any

from .console_text import Style, table, terminal_text, wrap

__all__ = ["render_diff"]


def _f(x: Any, fmt: str = "{:+.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _rows(parts: list[dict[str, Any]], st: Style, unit: str = "ms") -> list[list[str]]:
    out = []
    for p in parts:
        mark = "*" if p.get("significant") else ""
        out.append([terminal_text(p["label"])[:56], _f(p.get("a"), "{:.4g}"), _f(p.get("b"), "{:.4g}"),
                    _f(p.get("delta")), "+/-" + _f(p.get("band"), "{:.2f}"),
                    _f(p.get("share_pct"), "{:.0f}%") if p.get("share_pct") is not None else "", mark])
    return out


def render_diff(doc: dict[str, Any], *, color: bool = False) -> str:
    st = Style(color)
    out = [st.bold(f"distprof diff: A = {terminal_text(doc['a']['id'])} ({doc['a']['world_size']} ranks), "
                   f"B = {terminal_text(doc['b']['id'])} ({doc['b']['world_size']} ranks)")]
    out += [st.bold(x) for x in wrap(terminal_text(doc["verdict"]), "Verdict: ", "  ")]
    head = ["", "A ms/step", "B ms/step", "change", "noise", "share", ""]
    out.append(st.bold("Step time"))
    out += table(head, _rows([doc["step_time"]], st))
    titles = {"phase": "By phase", "rank": "By rank (time on the cross-rank critical path)",
              "collective": "By collective (exposed communication per group and op)"}
    for k, sp in doc["splits"].items():
        out.append(st.bold(titles.get(k, k)) + f" (parts add up to {sp['total_delta_ms']:+.2f} ms)")
        out += table(head, _rows(sp["parts"], st))
    if doc.get("ops"):
        out.append(st.bold("Ops (own time per step; ops nest, so these do not add up)"))
        rows = []
        for p in doc["ops"]:
            rows.append([terminal_text(p["label"])[:56], _f(p.get("a"), "{:.3f}"), _f(p.get("b"), "{:.3f}"),
                         _f(p.get("delta"), "{:+.3f}"), "+/-" + _f(p.get("band"), "{:.3f}"),
                         _f(p.get("per_call_a_ms"), "{:.4f}"), _f(p.get("per_call_b_ms"), "{:.4f}"),
                         "*" if p.get("significant") else ""])
        out += table(["op", "A ms/step", "B ms/step", "change", "noise", "A ms/call", "B ms/call", ""], rows)
    comp = (doc.get("memory") or []) + (doc.get("flops") or [])
    if comp:
        out.append(st.bold("Memory and FLOPs"))
        out += table(["", "A", "B", "change", "noise", "", ""], _rows(comp, st))
    out.append(st.dim("* beyond its noise band (step-to-step spread, at least "
                      f"{doc['rules']['floor_pct']:g} % of A's value)"))
    return "\n".join(out) + "\n"
