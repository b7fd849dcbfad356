"""Stragglers: who arrives late at collectives, what it costs the step, and how long the others wait for it.

One module per idea, in the order :func:`find_stragglers` (:mod:`.find`) uses them:

* :mod:`.instances` — collective instances: each rank's arrival and its lateness there, against the median of the
  other members (:mod:`.peers`: values against the median of the others, never a member's own);
* :mod:`.lateness` — a rank's lateness in a step: the one lateness the rule and the report use;
* :mod:`.rule` — the naming rule in one paragraph: late by the floor in most steps; the floor;
* :mod:`.clock_free` — the lateness from durations alone, which confirms it on a run over several hosts;
* :mod:`.extra_work` — the rank's own extra work: its lateness with the ranks' waits for a CPU taken out;
* :mod:`.blame` — how long the others waited for a rank, each waiting rank's overlapping waits counted once;
* :mod:`.cost` — what severity follows: its lead over the latest rank not named;
* :mod:`.hosts` — slow hosts, by the same rule; :mod:`.rows` — the report's rows; :mod:`.result` — the typed result;
* :mod:`.inputs` — the part of the run summary the analysis reads, what another MPI process is sent.

:mod:`.student_t` holds Student's t quantile, which the report diff uses.
"""

from __future__ import annotations

from .find import find_stragglers
from .instances import collective_instances
from .result import StragglerCells, StragglerHost, StragglerInfo, StragglerRank, Stragglers
from .rule import StragglerRule
from .student_t import t_quantile

__all__ = ["StragglerCells", "StragglerHost", "StragglerInfo", "StragglerRank", "StragglerRule", "Stragglers",
           "collective_instances", "find_stragglers", "t_quantile"]
