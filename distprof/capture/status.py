"""What a rank says when its profiler ends: the status file (``rank<R>.status.json``) and the closing line.

Both say what happened in words: the windows written, each window lost with its steps and why (no space, the
file-size limit, a signal while it was in flight, ...), the signal that ended the job, the run id actually used when
another job held the requested one, and the errors recorded.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..storage import schema
from ..storage.writer import ShardWriteError, write_durably

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LostWindow:
    """A window that was recorded (or being recorded) and is not on disk."""

    window: int
    first_step: int  # -1 when unknown
    last_step: int
    stage: str  # "write" (storing it failed), "extract", "signal", "deadline", "profiling stopped"
    reason: str  # in words

    def label(self) -> str:
        steps = (f"steps {self.first_step}-{self.last_step}" if self.last_step > self.first_step
                 else f"step {self.first_step}") if self.first_step >= 0 else "steps unknown"
        return f"w{self.window:04d} ({steps})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def signal_name(sig: int | None) -> str | None:
    if sig is None:
        return None
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def document(*, rank: int, run_id: str | None, job: dict | None, note: str, steps_seen: int, iterations: int,
             skipped_steps: int, windows: list[dict], lost: list[LostWindow], errors: list[dict[str, str]],
             signal_num: int | None, final: bool, triggered_windows: list[dict] | None = None) -> dict[str, Any]:
    """The status file's content (docs/shard-format.md)."""
    return {
        "rank": rank,
        "run_id": run_id,
        "job": job,
        "run_id_note": note,
        "steps_seen": steps_seen,
        "iterations": iterations,
        "skipped_steps": skipped_steps,
        "windows": windows,
        "triggered_windows": triggered_windows or [],  # capture/trigger.py: plan, window, steps, recorded, ...
        "lost": [w.to_dict() for w in lost],
        "errors": errors,
        "signal": signal_name(signal_num),
        "final": final,  # false: written from a side thread while the training thread could not close
        "closed_ns": time.time_ns(),
    }


def write(run_dir: Path, rank: int, doc: dict[str, Any]) -> None:
    """Write the status file (safe path: free space checked, tmp, fsync, rename); a failure is one warning."""
    path = run_dir / schema.STATUS_TEMPLATE.format(rank=rank)
    try:
        write_durably(path, json.dumps(doc, indent=1).encode(), floor=False)  # the room shards leave free is for it
    except ShardWriteError as e:
        log.warning("distprof: rank %d: status file not written: %s", rank, e)


def kind_of(reason: str) -> str:
    """What a reason is about, without its figures: the text before its first ':' ('not enough space on /out')."""
    return reason.split(":", 1)[0]


def windows_label(ws: list[LostWindow]) -> str:
    """'w0002-w0006 (steps 4-13)' for consecutive windows, else their labels joined (at most 4 named)."""
    ws = sorted(ws, key=lambda w: w.window)
    if len(ws) > 1 and ws[-1].window - ws[0].window == len(ws) - 1:
        first, last = ws[0].first_step, ws[-1].last_step
        steps = f" (steps {first}-{last})" if first >= 0 and last >= first else ""
        return f"w{ws[0].window:04d}-w{ws[-1].window:04d}{steps}"
    names = ", ".join(w.label() for w in ws[:4])
    return names + (f" and {len(ws) - 4} more" if len(ws) > 4 else "")


def lost_phrase(lost: list[LostWindow]) -> str:
    """'lost 5 window(s): w0002-w0006 (steps 4-13): not enough space on /out: ...' -- grouped by kind of reason, the
    first window's reason in full."""
    groups: dict[str, list[LostWindow]] = {}
    for w in sorted(lost, key=lambda w: w.window):
        groups.setdefault(kind_of(w.reason), []).append(w)
    parts = [f"{windows_label(ws)}: {ws[0].reason}" for ws in groups.values()]
    return f"lost {len(lost)} window(s): " + "; ".join(parts)


def closing_line(*, rank: int, run_dir: Path | None, written: int, lost: list[LostWindow],
                 errors: list[dict[str, str]], note: str, signal_num: int | None, cut_short: list[int],
                 no_window_hint: str | None) -> str | None:
    """The one line a rank prints on stderr when it closes (None: nothing to say). Rank 0 always speaks; another
    rank only when something went wrong there."""
    if written == 0 and not lost and not errors and signal_num is None:
        return None if rank != 0 or no_window_hint is None else f"distprof: {no_window_hint}"
    if run_dir is None:
        first = errors[0]["message"] if errors else "no run directory"
        return f"distprof: rank {rank} wrote no shard: {first}"
    if rank != 0 and not (lost or errors or note or signal_num is not None):
        return None
    line = f"distprof: rank {rank} wrote {written} shard(s) to {run_dir}"
    extra = []
    if signal_num is not None:
        extra.append(f"ended by {signal_name(signal_num)}")
    if cut_short:
        extra.append(f"window {', '.join(f'w{w:04d}' for w in cut_short)} saved cut short")
    if lost:
        extra.append(lost_phrase(lost))
    others = [e for e in errors if e.get("stage") not in ("write",)]
    if others:
        extra.append(f"{len(others)} error(s), first: {others[0]['stage']}: {others[0]['message']}")
    if note:
        extra.append(note)
    return line + ("; " + "; ".join(extra) if extra else "")
