"""``distprof trigger RUN_DIR``: ask a running job (started with ``python -m distprof.launch``) to record a window now.

The request goes into ``RUN_DIR/trigger.json``; rank 0 of the job picks it up at a step boundary, chooses steps every
rank can still record, and answers in ``RUN_DIR/trigger.answer.json`` (capture/trigger.py). This command waits for
that answer (``--wait``: also for the window to be written on every rank) and prints it.

Exit status: 0 when the window is scheduled (``--wait``: recorded), 1 when the job refused or did not answer in time,
2 when RUN_DIR holds no running distprof job (one line saying why).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

from ..errors import DistprofError

#: How often the answer file is looked at while waiting.
_POLL_S = 0.1


class TriggerError(DistprofError):
    """RUN_DIR holds no job that can take a trigger (one line naming why and what to do)."""


def register(sub) -> None:
    from ..capture.trigger_files import MAX_TRIGGER_STEPS
    from ..config import MAX_TRIGGER_MARGIN

    p = sub.add_parser(
        "trigger",
        help="record a window in a running job now (on every rank, the same steps)",
        description="Ask a job started with `python -m distprof.launch` to profile N steps soon, on every rank: rank 0 "
                    "picks the steps and answers; the shards land in RUN_DIR like the schedule's windows "
                    "(`distprof report RUN_DIR` reads them). Works with --schedule none (only triggered windows).",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", nargs="?",
                   help="the job's <out>/<run-id> folder (or give --job)")
    p.add_argument("--job", metavar="ID", help="the run id (Slurm: the job id): RUN_DIR is OUT/ID, or the latest "
                                                  "OUT/ID.N a later job with that id took")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="the job's --out, with --job [DISTPROF_OUT, else distprof]")
    p.add_argument("--steps", metavar="N", type=int, default=None,
                   help=f"steps to record, 1..{MAX_TRIGGER_STEPS} [the job's --active]")
    p.add_argument("--in", dest="margin", metavar="K", type=int, default=None,
                   help="begin no sooner than K steps from when rank 0 sees the request (later when the ranks need "
                        f"longer to hear of it), 0..{MAX_TRIGGER_MARGIN} [the job's --trigger-margin]")
    p.add_argument("--wait", action="store_true", help="also wait until every rank has written the window")
    p.add_argument("--timeout", metavar="S", type=float, default=120.0,
                   help="give up waiting after S seconds (the request stays and is answered later) [120]")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..capture import trigger_files as tf

    _check_args(args)
    run_dir = _run_dir(args)
    live = _live_job(run_dir)
    request = tf.TriggerRequest(tf.new_request_id(), args.steps, args.margin, live.session, time.time_ns())
    _replace_request(run_dir)
    try:  # a new file renamed over trigger.json: a link or a FIFO there is replaced, never written through
        tf.write_doc(run_dir / tf.REQUEST_NAME, request.to_doc())
    except OSError as e:
        from ..storage.writer import cause

        raise TriggerError(f"{run_dir / tf.REQUEST_NAME}: cannot write the request ({cause(e)}); the job answers "
                           "only requests in its run directory") from None
    answer = _wait(run_dir, request, args.timeout, args.wait)
    return _show(run_dir, answer, args)


def _check_args(args: argparse.Namespace) -> None:
    from ..capture.trigger_files import MAX_TRIGGER_STEPS
    from ..config import MAX_TRIGGER_MARGIN
    from ..errors import ConfigError

    if (args.run_dir is None) == (args.job is None):
        raise ConfigError("give RUN_DIR or --job ID (one of them)")
    if args.out is not None and args.job is None:
        raise ConfigError("--out goes with --job (RUN_DIR already names the folder)")
    if args.steps is not None and not 1 <= args.steps <= MAX_TRIGGER_STEPS:
        raise ConfigError(f"--steps {args.steps}: need 1..{MAX_TRIGGER_STEPS}")
    if args.margin is not None and not 0 <= args.margin <= MAX_TRIGGER_MARGIN:
        raise ConfigError(f"--in {args.margin}: need 0..{MAX_TRIGGER_MARGIN}")
    if not 0 < args.timeout <= 86400:
        raise ConfigError(f"--timeout {args.timeout}: need seconds in (0, 86400]")
    if args.job is not None and (not args.job.strip() or "/" in args.job or args.job in (".", "..")):
        raise ConfigError(f"--job {args.job!r}: a run id, not a path (give RUN_DIR for a folder)")


def _run_dir(args: argparse.Namespace) -> Path:
    if args.job is not None:
        from ..capture.rundir import latest_run_dir

        out = args.out or os.environ.get("DISTPROF_OUT") or "distprof"
        return latest_run_dir(out, args.job)  # a later job step with this id took <id>.2, ... (capture/rundir.py)
    return Path(args.run_dir)


def _live_job(run_dir: Path):
    """The job's live status, when RUN_DIR holds a distprof job that is running now; else a TriggerError saying
    what RUN_DIR holds instead."""
    from ..capture import trigger_files as tf
    from ..storage import schema

    if not run_dir.exists():
        raise TriggerError(f"{run_dir}: no such directory (give the job's <out>/<run-id> folder, or --job ID)")
    if not run_dir.is_dir():
        raise TriggerError(f"{run_dir}: not a directory (give the job's <out>/<run-id> folder)")
    live_path = run_dir / tf.LIVE_NAME
    try:
        live = tf.read_live(live_path)
    except FileNotFoundError:
        has_shards = any(run_dir.glob(schema.SHARD_GLOB))
        has_status = any(run_dir.glob("rank*.status.json"))
        if has_status:
            raise TriggerError(f"{run_dir}: the job has finished (status files, no {tf.LIVE_NAME}: it ran without "
                               "triggers, --no-trigger); nothing to trigger") from None
        if has_shards:
            raise TriggerError(f"{run_dir}: no {tf.LIVE_NAME}: the job runs without triggers (--no-trigger) or has "
                               "ended without closing; nothing to trigger") from None
        raise TriggerError(f"{run_dir}: not a distprof run directory (no {tf.LIVE_NAME}, status or shard files): give "
                           "the <out>/<run-id> folder of a job started with `python -m distprof.launch`; a job "
                           "writes it once its process group is up") from None
    except tf.TriggerFileError as e:
        raise TriggerError(f"{e} (the job rewrites it every few seconds while it runs; if it stays so, the job is "
                           "not running)") from None
    if live.state == "closed":
        raise TriggerError(f"{run_dir}: the job has finished (its profiler closed at step {live.step}, "
                           f"{_ago(live.closed_ns)} ago); nothing to trigger")
    if live.state == "disabled":
        raise TriggerError(f"{run_dir}: the job's profiler stopped after an error at step {live.step} (see the job's "
                           "log and rank00000.status.json); training goes on unprofiled, nothing can be triggered")
    age = time.time() - live_path.stat().st_mtime
    if live.host == socket.gethostname() and not _pid_alive(live.pid):
        raise TriggerError(f"{run_dir}: the job is not running (rank 0, pid {live.pid} on this host, is gone "
                           f"without closing: killed?); nothing to trigger")
    if age > live.stale_after_s:
        raise TriggerError(f"{run_dir}: the job is not running or not responding: rank 0's heartbeat "
                           f"({tf.LIVE_NAME}) is {age:.0f} s old (it is rewritten every {live.heartbeat_s:g} s; "
                           f"last at step {live.step}, pid {live.pid} on {live.host})")
    return live


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True
    return True


def _replace_request(run_dir: Path) -> None:
    """Refuse to overwrite a request the job has not answered yet, unless it is old; say what is replaced."""
    from ..capture import trigger_files as tf

    path = run_dir / tf.REQUEST_NAME
    try:
        old = tf.read_request(path)
    except FileNotFoundError:
        return
    except tf.TriggerFileError as e:
        print(f"distprof: replacing a bad request file ({e})", file=sys.stderr)
        return
    answer = _answer_for(run_dir, old.request_id)
    if answer is not None and answer.state in tf.FINAL_STATES + ("scheduled", "recorded"):
        return
    age = time.time() - path.stat().st_mtime
    if age < 30.0:
        raise TriggerError(f"{path}: request {old.request_id}, written {age:.0f} s ago, still waits for the job's "
                           "answer; wait for it, or remove the file to drop it")
    print(f"distprof: replacing request {old.request_id} ({age:.0f} s old, never answered)", file=sys.stderr)


def _answer_for(run_dir: Path, request_id: str):
    from ..capture import trigger_files as tf

    try:
        answer = tf.read_answer(run_dir / tf.ANSWER_NAME)
    except (FileNotFoundError, tf.TriggerFileError):
        return None
    return answer if answer.request_id == request_id else None


def _wait(run_dir: Path, request, timeout_s: float, until_recorded: bool):
    """The job's answer to `request` (with `until_recorded`: its final one), or None when the time ran out or the job
    ended without answering."""
    from ..capture import trigger_files as tf

    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        answer = _answer_for(run_dir, request.request_id)
        if answer is not None:
            last = answer
            if answer.state in tf.FINAL_STATES or not until_recorded:
                return answer
        try:
            live = tf.read_live(run_dir / tf.LIVE_NAME)
        except (FileNotFoundError, tf.TriggerFileError):
            live = None
        if live is not None and live.state != "running":
            time.sleep(0.5)  # its last answer is written before the live file says closed; read it once more
            return _answer_for(run_dir, request.request_id) or last
        time.sleep(_POLL_S)
    return last


def _show(run_dir: Path, answer, args: argparse.Namespace) -> int:
    from ..capture import trigger_files as tf
    from ..storage import schema

    if answer is None:
        try:
            live = tf.read_live(run_dir / tf.LIVE_NAME)
            where = f"rank 0 was at step {live.step}, state {live.state}"
        except (FileNotFoundError, tf.TriggerFileError):
            where = "no live status"
        print(f"distprof: no answer from the job within {args.timeout:g} s ({where}): a step may take longer than "
              f"that, or rank 0 is stuck before its next step; the request stays in {run_dir / tf.REQUEST_NAME} and "
              "is answered at rank 0's next step boundary", file=sys.stderr)
        return 1
    if answer.state in tf.ACCEPTED_STATES:
        shards = schema.SHARD_TEMPLATE.replace("{rank:05d}", "*").format(window=answer.window or 0)
        if answer.state == "scheduled" or answer.state == "recorded":
            print(f"distprof: scheduled {answer.message}; shards: {run_dir / shards}"
                  + ("" if args.wait else " (`distprof trigger --wait` waits for them)"))
            return 0
        print(f"distprof: {answer.state}: {answer.message}; shards: {run_dir / shards}; "
              f"`distprof report {run_dir}` reads them")
        return 0 if answer.state == "done" else 1
    print(f"distprof: {answer.state}: {answer.message}", file=sys.stderr)
    return 1


def _ago(ns: int) -> str:
    s = max(0.0, time.time() - ns / 1e9)
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"
