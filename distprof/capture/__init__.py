"""Capture side (imports torch): schedule, optimizer-step hook, clock sync, extraction, RankProfiler."""
