"""HDF5 shards: schema, atomic writer, torch-free reader.

The reader (and h5py with it) is imported on first use, so that ``storage.schema`` — the column types every stage
shares — stays light (numpy only): ``import distprof.analysis`` must not pull in h5py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from .reader import find_shards, read_shard, read_status
    from .shard import Shard

__all__ = ["Shard", "find_shards", "read_shard", "read_status", "SCHEMA_VERSION"]

_LAZY = {"Shard": ".shard", "find_shards": ".reader", "read_shard": ".reader", "read_status": ".reader"}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(mod, __name__), name)
