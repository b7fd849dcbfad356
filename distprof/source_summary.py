"""The per-rank summary each shard carries, computed where its events are born (docs/shard-format.md, /summary).

Capture and analysis never import each other (tests/test_layers.py): the entry points (``distprof.launch``,
``distprof.profile``) hand this function to the capture's writer thread, which calls it with each window's shard
bytes before storing them; ``distprof import`` calls it too. It runs the report's own per-rank map
(``analysis.rank.stored.summarize_image``), so a report that takes the stored summary gets what it would compute.
"""

from __future__ import annotations

from pathlib import Path

from .storage.summary_group import StoredSummary

__all__ = ["summarize_shard"]


def summarize_shard(image: bytes, path: Path) -> StoredSummary | None:
    """The summary of the shard whose bytes are `image`, to be stored at `path` (None: the report summarises this
    shard itself, see ``summarize_image``)."""
    from .analysis.rank.stored import summarize_image

    return summarize_image(image, path)
