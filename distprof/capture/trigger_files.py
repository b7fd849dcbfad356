"""The files through which ``distprof trigger`` talks to a running job, in its run directory (no torch here).

* ``trigger.json`` — the request (:class:`TriggerRequest`), written by the CLI (atomically: a temporary file renamed
  over the old request). Rank 0 of the job looks for it at most every ``--trigger-poll`` seconds.
* ``trigger.answer.json`` — rank 0's answer to the latest request (:class:`TriggerAnswer`): the steps chosen, then
  what was recorded; rewritten as the window goes on.
* ``distprof.live.json`` — rank 0's heartbeat while the job runs (:class:`LiveStatus`): the session, its step, the
  schedule; ``state`` "closed" once the job's profiler closed.

Every file is one JSON object with ``format`` and ``version``; a reader refuses a newer version, more than
:data:`MAX_FILE_BYTES`, anything but a regular file (a FIFO, a link: opened non-blocking, never followed) and wrong
fields with one line naming the file, the field and the fix. Writers never open the final name: a temporary file
is renamed over it (storage.safefs).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..config import MAX_TRIGGER_MARGIN
from ..errors import DistprofError
from ..storage import safefs

REQUEST_NAME = "trigger.json"
ANSWER_NAME = "trigger.answer.json"
LIVE_NAME = "distprof.live.json"
VERSION = 1
REQUEST_FORMAT = "distprof-trigger-request"
ANSWER_FORMAT = "distprof-trigger-answer"
LIVE_FORMAT = "distprof-live"
#: Neither side reads a file larger than this (each is well under 4 kB).
MAX_FILE_BYTES = 64 * 1024
#: The longest reason a request may give.
MAX_REASON_CHARS = 500
#: The most steps one triggered window may record.
MAX_TRIGGER_STEPS = 10_000
#: What an answer can say. "scheduled": steps chosen; "recorded": rank 0's shard is written, the other ranks are
#: being heard from; "done": every rank said whether it recorded; "incomplete": not every rank said so in time;
#: "cut": the job ended before the window's last step; "refused", "invalid", "stale": nothing will be recorded.
ANSWER_STATES = ("scheduled", "recorded", "done", "incomplete", "cut", "refused", "invalid", "stale")
FINAL_STATES = ("done", "incomplete", "cut", "refused", "invalid", "stale")
ACCEPTED_STATES = ("scheduled", "recorded", "done", "incomplete", "cut")
#: The job runs; its profiler closed; its profiler stopped after an error (training goes on, nothing is recorded).
LIVE_STATES = ("running", "closed", "disabled")
_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class TriggerFileError(DistprofError):
    """A trigger, answer or live file that cannot be used (one line: the file, the field, the fix)."""


def new_request_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class TriggerRequest:
    """Record `steps` steps (None: the job's ``--active``), beginning no sooner than `margin` steps from when rank 0
    sees the request (None: the job's ``--trigger-margin``). `session` names the job start it was written for."""

    request_id: str
    steps: int | None = None
    margin: int | None = None
    session: str | None = None
    created_ns: int = 0
    reason: str = ""  # why the window is asked for (the watch's drift; empty from the CLI), kept in its shards

    def to_doc(self) -> dict[str, Any]:
        return {"format": REQUEST_FORMAT, "version": VERSION, **asdict(self)}

    @classmethod
    def from_doc(cls, doc: Any, path: Path) -> "TriggerRequest":
        _check_header(doc, path, REQUEST_FORMAT, "write it with `distprof trigger RUN_DIR`")
        rid = doc.get("request_id")
        if not isinstance(rid, str) or not _ID_RE.match(rid):
            raise _field_error(path, "request_id", rid, "1-64 letters, digits, '_', '.' or '-'")
        steps = _opt_int(doc, "steps", path, 1, MAX_TRIGGER_STEPS)
        margin = _opt_int(doc, "margin", path, 0, MAX_TRIGGER_MARGIN)
        session = doc.get("session")
        if session is not None and (not isinstance(session, str) or not _ID_RE.match(session)):
            raise _field_error(path, "session", session, "the session id from distprof.live.json, or null")
        created = doc.get("created_ns", 0)
        if created.__class__ is not int or created < 0:
            raise _field_error(path, "created_ns", created, "nanoseconds since the epoch")
        reason = doc.get("reason", "")
        if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
            raise _field_error(path, "reason", reason, f"a string of at most {MAX_REASON_CHARS} characters")
        return cls(rid, steps, margin, session, created, reason)


@dataclass
class TriggerAnswer:
    """Rank 0's answer to one request. Steps are global steps; `begin` is the first warm-up step."""

    request_id: str | None
    state: str
    message: str
    session: str = ""
    window: int | None = None
    begin: int | None = None
    first: int | None = None
    last: int | None = None
    step: int | None = None  # rank 0's step when it decided
    world_size: int = 1
    ranks_recorded: int = 0  # ranks that said their shard of the window is written
    ranks_late: list[int] = field(default_factory=list)  # ranks that learnt of the window after it began
    updated_ns: int = 0

    def to_doc(self) -> dict[str, Any]:
        return {"format": ANSWER_FORMAT, "version": VERSION, **asdict(self)}

    @classmethod
    def from_doc(cls, doc: Any, path: Path) -> "TriggerAnswer":
        _check_header(doc, path, ANSWER_FORMAT, "it is rewritten by the job's next answer")
        state = doc.get("state")
        if state not in ANSWER_STATES:
            raise _field_error(path, "state", state, f"one of {', '.join(ANSWER_STATES)}")
        rid = doc.get("request_id")
        if rid is not None and not isinstance(rid, str):
            raise _field_error(path, "request_id", rid, "a string or null")
        msg = doc.get("message")
        if not isinstance(msg, str):
            raise _field_error(path, "message", msg, "a string")
        ints = {}
        for k in ("window", "begin", "first", "last", "step"):
            v = doc.get(k)
            if v is not None and v.__class__ is not int:
                raise _field_error(path, k, v, "an integer or null")
            ints[k] = v
        for k in ("world_size", "ranks_recorded", "updated_ns"):
            v = doc.get(k, 0)
            if v.__class__ is not int or v < 0:
                raise _field_error(path, k, v, "an integer >= 0")
            ints[k] = v
        late = doc.get("ranks_late", [])
        if not isinstance(late, list) or not all(r.__class__ is int for r in late):
            raise _field_error(path, "ranks_late", late, "a list of ranks")
        session = doc.get("session", "")
        return cls(rid, state, msg, session if isinstance(session, str) else "", ranks_late=late, **ints)


@dataclass
class LiveStatus:
    """Rank 0's heartbeat: rewritten every `heartbeat_s` while the job runs; `state` "closed" at the end."""

    session: str
    run_id: str
    pid: int
    host: str
    world_size: int
    started_ns: int
    updated_ns: int
    heartbeat_s: float
    state: str = "running"  # LIVE_STATES
    step: int = 0  # rank 0's global step
    schedule: dict[str, Any] = field(default_factory=dict)  # ScheduleConfig fields
    trigger_steps: int = 0  # steps a request without --steps records (the job's --active)
    trigger_margin: int = 0
    window: list[int] | None = None  # [window, begin, first, last] warming up or recording now
    closed_ns: int = 0

    @property
    def stale_after_s(self) -> float:
        """A heartbeat older than this means the job is not running (killed, or hung without its side threads)."""
        return max(30.0, 10 * self.heartbeat_s)

    def to_doc(self) -> dict[str, Any]:
        return {"format": LIVE_FORMAT, "version": VERSION, **asdict(self)}

    @classmethod
    def from_doc(cls, doc: Any, path: Path) -> "LiveStatus":
        _check_header(doc, path, LIVE_FORMAT, "it is rewritten by the running job every few seconds")
        kw: dict[str, Any] = {}
        for k, kind in (("session", str), ("run_id", str), ("host", str), ("state", str), ("pid", int),
                        ("world_size", int), ("started_ns", int), ("updated_ns", int), ("step", int),
                        ("trigger_steps", int), ("trigger_margin", int), ("closed_ns", int)):
            v = doc.get(k)
            if v.__class__ is not kind or (kind is int and v < 0):
                raise _field_error(path, k, v, "a string" if kind is str else "an integer >= 0")
            kw[k] = v
        if kw["state"] not in LIVE_STATES:
            raise _field_error(path, "state", kw["state"], " or ".join(LIVE_STATES))
        hb = doc.get("heartbeat_s")
        if hb.__class__ not in (int, float) or not 0 < hb <= 3600:
            raise _field_error(path, "heartbeat_s", hb, "seconds in (0, 3600]")
        sched = doc.get("schedule")
        if not isinstance(sched, dict):
            raise _field_error(path, "schedule", sched, "an object")
        win = doc.get("window")
        if win is not None and (not isinstance(win, list) or len(win) != 4 or
                                not all(v.__class__ is int for v in win)):
            raise _field_error(path, "window", win, "[window, begin, first, last] or null")
        return cls(heartbeat_s=float(hb), schedule=sched, window=win, **kw)


# -- reading and writing ------------------------------------------------------------------------------------------
def read_doc(path: Path) -> Any:
    """The JSON in `path`, read only when it is a regular file (not a link, never a FIFO: opened non-blocking) of at
    most MAX_FILE_BYTES. FileNotFoundError passes through; every other problem is a TriggerFileError naming the
    file."""
    try:
        data = safefs.read_file(path, MAX_FILE_BYTES, what="trigger file")
    except FileNotFoundError:
        raise
    except safefs.FileRefused as e:
        raise TriggerFileError(str(e)) from None
    except OSError as e:
        raise TriggerFileError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        return safefs.load_json(data, path)
    except safefs.FileRefused as e:
        raise TriggerFileError(f"{e}; rewrite it with `distprof trigger`") from None


def write_doc(path: Path, doc: dict[str, Any]) -> None:
    """`doc` as JSON at `path`, atomically: a new temporary file beside it (O_EXCL|O_NOFOLLOW), renamed over it —
    whatever is at `path` (a link, a FIFO) is replaced, never written through (storage.safefs). Raises OSError."""
    path = Path(path)
    safefs.write_file(path.parent, path.name, json.dumps(doc, indent=1).encode())


def read_request(path: Path) -> TriggerRequest:
    return TriggerRequest.from_doc(read_doc(path), path)


def read_answer(path: Path) -> TriggerAnswer:
    return TriggerAnswer.from_doc(read_doc(path), path)


def read_live(path: Path) -> LiveStatus:
    return LiveStatus.from_doc(read_doc(path), path)


def remove_temporaries(run_dir: Path) -> None:
    """Temporary files left by a writer of these files that was killed mid-write (rank 0 at its start)."""
    for name in (ANSWER_NAME, LIVE_NAME):
        for p in run_dir.glob(f"{name}.*.tmp"):
            try:
                p.unlink()
            except OSError:
                pass


# -- helpers ------------------------------------------------------------------------------------------------------
def _check_header(doc: Any, path: Path, fmt: str, fix: str) -> None:
    if not isinstance(doc, dict):
        raise TriggerFileError(f"{path}: holds {type(doc).__name__}, not a JSON object; {fix}")
    if doc.get("format") != fmt:
        raise _field_error(path, "format", doc.get("format"), repr(fmt) + f"; {fix}")
    v = doc.get("version")
    if v.__class__ is not int or v < 1:
        raise _field_error(path, "version", v, f"an integer (this distprof writes {VERSION})")
    if v > VERSION:
        raise TriggerFileError(f"{path}: version {v} is newer than this distprof's {VERSION}; use the same distprof "
                               "version as the job")


def _opt_int(doc: dict, key: str, path: Path, lo: int, hi: int) -> int | None:
    v = doc.get(key)
    if v is None:
        return None
    if v.__class__ is not int or not lo <= v <= hi:
        raise _field_error(path, key, v, f"an integer in {lo}..{hi} or null")
    return v


def _field_error(path: Path, key: str, value: Any, expected: str) -> TriggerFileError:
    return TriggerFileError(f"{path}: field {key!r} is {_show(value)}, expected {expected}")


def _show(v: Any) -> str:
    text = "missing" if v is None else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."
