"""SIGTERM and SIGINT while a profiler runs: what is finished reaches the disk, then the signal does what it would have.

torchrun tears the surviving ranks of a failed job down with SIGTERM and kills them 30 s later (Slurm's KillWait and
Kubernetes' grace period are 30 s by default too); without a handler SIGTERM ends a Python process at once, losing the
windows still queued for the writer and the status file. :class:`SignalGuard` installs a handler for each signal whose
disposition is Python's own (``SIG_DFL``, ``default_int_handler``) or a user's handler (chained); ignored signals
are left alone. What it does, on the training (main) thread where Python runs handlers:

* ``SIGTERM`` with the default action: the profiler closes within :data:`FLUSH_S` — the window in flight is stopped
  and saved as cut short (``complete`` false), the queued windows are written, the status file says which signal
  ended the job — and then the default action runs (the process dies by the same signal: the exit status torchrun and
  the shell see is unchanged).
* ``SIGINT`` with Python's ``default_int_handler``: it raises KeyboardInterrupt as always; the close that follows
  (the launcher's ``finally``) is bounded by the same deadline.
* a user's own handler: the queued windows are written and the status file updated first, then the user's handler
  runs; profiling goes on if the process does.

A signal arriving while the training thread is inside distprof (a profiler step, the close) is acted on when it
leaves. Python runs handlers only between bytecodes, so a training thread blocked in a C call (a collective waiting
for a peer that died) would not run it before the launcher's SIGKILL: a watcher thread, woken through
``signal.set_wakeup_fd``, notices the signal anyway; if the main thread has not taken it within :data:`MAIN_WAIT_S`,
the watcher writes the queued windows and the status file itself (the window in flight is then discarded: only the
training thread can stop torch's profiler), and for a ``SIGTERM`` with the default action ends the process by that
signal, as it would have ended without distprof.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

#: Seconds from the signal within which everything distprof does for it is done (inside a 30 s grace period).
FLUSH_S = 20.0
#: Seconds the watcher gives the main thread to take a signal before acting without it.
MAIN_WAIT_S = 1.0
SIGNALS = (signal.SIGTERM, signal.SIGINT)

_current: "SignalGuard | None" = None  # the guard of this process, for the fork hook
_fork_hooked = False


class SignalGuard:
    """The handlers of one profiler. `owner` provides ``note_signal(sig)``, ``close_on_signal(sig)``,
    ``flush_on_signal(sig, blocked)`` and ``in_distprof`` (the training thread is inside profiler code)."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self.pending: tuple[int, Any] | None = None
        self._orig: dict[int, Any] = {}
        self._pid = os.getpid()
        self._taken = threading.Event()  # the main thread's handler ran for the signal
        self._pipe: tuple[int, int] | None = None
        self._watcher: threading.Thread | None = None

    # -- installing -------------------------------------------------------------------------------------------------
    def install(self) -> bool:
        """Handlers and the watcher; only from the main thread (where Python lets one set handlers)."""
        global _current, _fork_hooked
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in SIGNALS:
            cur = signal.getsignal(sig)
            if cur is signal.SIG_IGN or cur is None:  # ignored, or set outside Python: not ours to change
                continue
            self._orig[sig] = cur
            signal.signal(sig, self._handler)
        if self._orig:
            self._start_watcher()
        _current = self
        if not _fork_hooked and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hooked = True
        return bool(self._orig)

    def uninstall(self) -> None:
        """Put back the handlers that are still ours (main thread only) and stop the watcher."""
        global _current
        if threading.current_thread() is threading.main_thread() and os.getpid() == self._pid:
            for sig, orig in self._orig.items():
                if signal.getsignal(sig) == self._handler:
                    signal.signal(sig, orig)
            self._stop_watcher()
        if _current is self:
            _current = None

    def _start_watcher(self) -> None:
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            old = None
        if old != -1:  # someone (asyncio) already watches signals this way: keep theirs, handlers only
            if old is not None:
                signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
            return
        self._pipe = (r, w)
        self._watcher = threading.Thread(target=self._watch, name="distprof-signals", daemon=True)
        self._watcher.start()

    def _stop_watcher(self) -> None:
        if self._pipe is None:
            return
        r, w = self._pipe
        try:
            old = signal.set_wakeup_fd(-1)
            if old != w:  # not ours any more: leave the new owner's in place
                signal.set_wakeup_fd(old)
        except (ValueError, OSError):
            pass
        try:
            os.write(w, b"\0")  # byte 0: the watcher ends
        except OSError:
            pass
        if self._watcher is not None:
            self._watcher.join(2.0)
        if self._watcher is None or not self._watcher.is_alive():
            for fd in (r, w):
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._pipe = None

    # -- the main thread --------------------------------------------------------------------------------------------
    def _handler(self, sig: int, frame) -> None:
        if os.getpid() != self._pid:  # a forked child (DataLoader worker): nothing of ours to save
            return self._chain(sig, frame)
        self._taken.set()
        self.owner.note_signal(sig)
        if self.owner.in_distprof:
            self.pending = (sig, frame)  # acted on when the training thread leaves distprof (resume)
            return None
        return self._act(sig, frame)

    def resume(self) -> None:
        """The training thread left distprof: act on a signal that came meanwhile."""
        if self.pending is not None:
            sig, frame = self.pending
            self.pending = None
            self._act(sig, frame)

    def _act(self, sig: int, frame) -> None:
        orig = self._orig.get(sig, signal.SIG_DFL)
        if orig is signal.SIG_DFL:
            self.owner.close_on_signal(sig)
            self._die(sig)
        elif orig is signal.default_int_handler:
            orig(sig, frame)  # KeyboardInterrupt; the close that follows is bounded by the deadline
        else:
            self.owner.flush_on_signal(sig, blocked=False)
            orig(sig, frame)

    def _chain(self, sig: int, frame) -> None:
        orig = self._orig.get(sig, signal.SIG_DFL)
        if orig is signal.SIG_DFL:
            self._die(sig)
        elif callable(orig):
            orig(sig, frame)

    def _die(self, sig: int) -> None:
        """The default action of `sig`, now: the process ends by the signal, as it would have without distprof."""
        self.uninstall()
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(5.0)  # delivered at once in practice
        os._exit(128 + sig)

    # -- the watcher ------------------------------------------------------------------------------------------------
    def _watch(self) -> None:
        r = self._pipe[0]
        while True:
            try:
                data = os.read(r, 64)
            except InterruptedError:
                continue
            except OSError:
                return
            if not data or 0 in data:
                return
            for sig in set(data) & set(SIGNALS):
                if os.getpid() != self._pid:
                    return
                if signal.getsignal(sig) != self._handler:  # the script put its own handler in: its business
                    continue
                self.owner.note_signal(sig)
                if self._taken.wait(MAIN_WAIT_S):
                    continue  # the training thread has it
                log.info("distprof: signal %d while the training thread is outside Python; saving what is finished "
                         "from a side thread", sig)
                self.owner.flush_on_signal(sig, blocked=True)
                ours = signal.getsignal(sig) == self._handler
                if ours and self._orig.get(sig) is signal.SIG_DFL and not self._taken.is_set():
                    _die_from_thread(sig)


def _die_from_thread(sig: int) -> None:
    """The default action of `sig` from a thread other than the main one (Python's signal.signal refuses there):
    reset the disposition in libc and send the signal again."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal(sig, None)  # SIG_DFL
        os.kill(os.getpid(), sig)
        time.sleep(5.0)
    except Exception:  # noqa: BLE001 -- no libc through ctypes: the shell's convention for death by a signal
        pass
    os._exit(128 + sig)


def _after_fork_in_child() -> None:
    """A forked child keeps the parent's handlers and wakeup fd: give it back what it had, it profiles nothing."""
    g = _current
    if g is None:
        return
    try:
        if g._pipe is not None:
            signal.set_wakeup_fd(-1)
        for sig, orig in g._orig.items():
            if signal.getsignal(sig) == g._handler:
                signal.signal(sig, orig)
    except (ValueError, OSError):  # forked from a thread other than the main one: the pid check still holds
        pass


def flush_deadline(noted_at: float | None) -> float | None:
    """The monotonic time by which distprof's work for a signal seen at `noted_at` must be done."""
    return None if noted_at is None else noted_at + FLUSH_S


Handler = Callable[[int, Any], None]
