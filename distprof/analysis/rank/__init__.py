"""The per-rank map: one rank's events indexed once (``index.RankIndex``), its step breakdown, measures for the
findings, CPU waits, user annotations, device time, all folded into one compact ``RankSummary``
(``summary.summarize_rank``). Works on one rank at a time, in memory bounded by that rank's events.
"""
