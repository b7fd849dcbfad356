"""The cross-rank reduce: every rank's collective rows joined into one table as the ranks are summarised (``rows``),
the collectives matched per process group and window (``matching``), point-to-point transfers paired (``p2p``), the
hosts' clocks modelled (``clock``), and everything joined on one clock into the ``RunSummary``
(``reduce.reduce_run``).
"""
