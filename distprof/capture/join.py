"""DDP's and ZeroRedundancyOptimizer's ``Join``: what a rank does after it ran out of inputs is no training step.

``torch.distributed.algorithms.join.Join`` lets ranks with fewer batches end their loop first: in the context
manager's ``__exit__`` a rank that has run out shadows the others' collectives, round after round, until every rank
has joined — and ZeroRedundancyOptimizer's join hook runs a whole optimizer step each round. Counted as steps, those
rounds made a rank with nothing left to do look like the fastest rank and named the ranks still training its
stragglers. While a Join's shadow loop runs (:func:`shadowing`), the stepper and the watch let optimizer steps pass
uncounted: the rank's loop ended with its last batch, and the report sees a loop shorter than the others'.

:func:`install` wraps ``Join.__exit__`` once however many users ask (the stepper, the watch); :func:`remove` puts it
back when the last one is done. The wrapper only counts: the shadow loop itself runs unchanged.
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)

__all__ = ["install", "remove", "shadowing"]

_depth = 0  # Join shadow loops running on this process (the training thread's)
_users = 0
_orig = None


def shadowing() -> bool:
    """Whether a Join's shadow loop is running: this rank has run out of inputs and waits for the others."""
    return _depth > 0


def install() -> None:
    global _users, _orig
    _users += 1
    if _orig is not None:
        return
    try:
        from torch.distributed.algorithms.join import Join
    except (ImportError, AttributeError) as e:  # torch without distributed
        log.debug("distprof: Join not watched: %s", e)
        return
    orig = Join.__exit__

    @functools.wraps(orig)
    def __exit__(self, exc_type, exc, tb):
        global _depth
        _depth += 1
        try:
            return orig(self, exc_type, exc, tb)
        finally:
            _depth -= 1

    __exit__.__distprof_join__ = orig  # type: ignore[attr-defined]
    Join.__exit__ = __exit__
    _orig = orig


def remove() -> None:
    global _users, _orig
    _users = max(0, _users - 1)
    if _users or _orig is None:
        return
    from torch.distributed.algorithms.join import Join

    if getattr(Join.__exit__, "__distprof_join__", None) is _orig:
        Join.__exit__ = _orig
    _orig = None
