"""The cross-rank step graph (own work, waits, critical path) and the what-if replays on it.
"""
