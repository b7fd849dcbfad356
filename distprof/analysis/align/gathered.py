"""A table whose copied columns are not held: :class:`GatheredTable` keeps some columns and reads the others from
another table through an index, on each read.

The matched collectives' members (``matching.Collectives.members``, one row per collective and rank) are the
collective rows sorted by instance: six of their ten columns (rank, window, group, sequence, op, size) are the rows'
own values, gathered. Held as copies they were 39 MB of the 83 MB of members at 1,024 LLM-shaped ranks, alive for the
whole report beside the rows they copy. Read through the index instead, a reader gets the same array each time (a
fresh copy: writing into it changes nothing held) and lets it go when done.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

__all__ = ["GatheredTable"]


class GatheredTable(Mapping[str, np.ndarray]):
    """Columns: those held (``own``), and those read as ``source[name][at]`` in a given dtype (``gathered``), in the
    order `order`. Setting a column holds it (and stops gathering it)."""

    def __init__(self, own: dict[str, np.ndarray], source: Mapping[str, np.ndarray], at: np.ndarray,
                 gathered: Mapping[str, np.dtype], order: tuple[str, ...]) -> None:
        self._own = dict(own)
        self._source = source
        self._at = at
        self._gathered = {k: np.dtype(v) for k, v in gathered.items() if k not in self._own}
        self._order = tuple(order) + tuple(k for k in list(self._own) + list(self._gathered) if k not in order)

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._own:
            return self._own[name]
        if name in self._gathered:
            return np.asarray(self._source[name])[self._at].astype(self._gathered[name], copy=False)
        raise KeyError(name)

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self._own[name] = value
        self._gathered.pop(name, None)
        if name not in self._order:
            self._order += (name,)

    def __contains__(self, name: object) -> bool:
        return name in self._own or name in self._gathered

    def __iter__(self) -> Iterator[str]:
        return (k for k in self._order if k in self)

    def __len__(self) -> int:
        return len(self._own) + len(self._gathered)

    def with_columns(self, **cols: np.ndarray) -> "GatheredTable":
        """A table sharing this one's source and index, with `cols` held in place of (or beside) its columns."""
        return GatheredTable({**self._own, **cols}, self._source, self._at, self._gathered, self._order)

    def held_nbytes(self) -> int:
        """Bytes of the columns held and of the index (the gathered columns' source is another table's)."""
        return sum(a.nbytes for a in self._own.values()) + self._at.nbytes
