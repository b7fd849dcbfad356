"""Load: a run directory's catalog of shards (which ranks, windows and shards belong to the run) and one rank's
events read alone (``rankdata.read_rank``), with the steps selection.
"""
