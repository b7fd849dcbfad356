"""Cross-rank analyses, each a pure function of a ``RunSummary``: the comm table, imbalance, MFU, overlap,
parallelism, pipelines, root cause, stragglers, annotations and device time across ranks.
"""
