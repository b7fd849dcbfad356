"""Files a side thread rewrites while the job runs (the watch series, the trigger's answer and live files), through
spells when the output cannot take them: a file system remounted read-only for a moment, a disk full then freed.

:class:`WriteSpell` keeps track of one such spell: its first failure is reported once (the profiler's warning and
its status file's errors), the files stay to be written, and the side thread tries again at its next turn; the first
write that succeeds ends the spell with one line saying how long it lasted. Nothing is lost but what a crash during
the spell would lose.
"""

from __future__ import annotations

import errno
import logging
import time
from typing import Callable

from ..storage import safefs
from ..storage.writer import cause

log = logging.getLogger(__name__)

__all__ = ["WriteSpell", "transient"]

#: What no waiting mends: a link or a file where a directory goes.
_LASTING = (errno.ENOTDIR, errno.EISDIR, errno.ELOOP)


def transient(e: OSError) -> bool:
    """Whether a failed write may go through later (a read-only or full output, a quota), rather than never (a link
    or a file where a directory goes)."""
    return not isinstance(e, safefs.FileRefused) and e.errno not in _LASTING


class WriteSpell:
    """Failed writes of `what` (e.g. "watch series"), one spell at a time; `on_error(stage, exc)` hears the first
    failure of each spell."""

    def __init__(self, what: str, on_error: Callable[[str, BaseException], None]) -> None:
        self.what = what
        self._on_error = on_error
        self.failures = 0  # failed writes in all
        self.spells = 0
        self._since: float | None = None

    @property
    def failing(self) -> bool:
        return self._since is not None

    def failed(self, e: OSError) -> None:
        """A write failed: the first of a spell is reported; the caller keeps what was not written and retries."""
        self.failures += 1
        if self._since is None:
            self._since = time.monotonic()
            self.spells += 1
            self._on_error(f"{self.what} write", OSError(f"{cause(e)}; kept and written again as soon as the output "
                                                         "takes it"))

    def succeeded(self) -> None:
        """A write went through: a spell of failures, if any, is over."""
        if self._since is not None:
            log.warning("distprof: %s written again after %.1f s of failed writes", self.what,
                        time.monotonic() - self._since)
            self._since = None
