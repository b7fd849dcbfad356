"""Map over ranks, then reduce: ``engine.summarize`` reads and summarises each rank in turn (or spread over MPI
processes) and reduces the summaries into a ``RunSummary``; ``merged.load_run`` merges every event instead (small
runs, timeline, export).
"""
