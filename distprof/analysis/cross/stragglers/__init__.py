"""Stragglers: who arrives late at collectives, and how much waiting it causes the others.

One module per idea, in the order :func:`find_stragglers` (:mod:`.find`) uses them:

* :mod:`.instances` — collective instances: each rank's arrival, its lateness against the median of the others,
  the last arriver's blame and lead;
* :mod:`.peers` — values against the median of the other members (never a member's own);
* :mod:`.cells` — (step, rank) cells: a rank's lateness in a step, and its excess over the other ranks';
* :mod:`.cpu_wait` — the CPU-wait correction: the share of the lateness the host's scheduler caused ("held back");
* :mod:`.floor` — the lateness floor (clock residual, step time) and the ranks' arrival jitter;
* :mod:`.consistency` — whether the excess is consistent across steps (steadily late, or often far out), with
  :mod:`.student_t` for its confidence bound;
* :mod:`.own_work` — the rank's own work before each step's first collective, with :mod:`.sign_test`;
* :mod:`.clock_free` — the clock-free cross-check from durations;
* :mod:`.rule` — the naming rule as a whole (:class:`StragglerRule`);
* :mod:`.measures` — the per-rank figures and who is named; :mod:`.cost` — what severity follows;
* :mod:`.hosts` — slow hosts; :mod:`.rank_means` — CPU time and page faults beside the lateness;
* :mod:`.rows` — the report's rank rows and per-step stragglers; :mod:`.result` — the typed result.
"""

from __future__ import annotations

from .find import find_stragglers
from .floor import arrival_jitter_ms, threshold_ms
from .instances import collective_instances
from .result import StragglerHost, StragglerInfo, StragglerRank, Stragglers
from .rule import StragglerRule
from .student_t import t_quantile

__all__ = ["StragglerHost", "StragglerInfo", "StragglerRank", "StragglerRule", "Stragglers", "arrival_jitter_ms",
           "collective_instances", "find_stragglers", "t_quantile", "threshold_ms"]
