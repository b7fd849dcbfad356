"""HDF5 shards: schema, atomic writer, torch-free reader."""

from .reader import Shard, find_shards, read_shard, read_status
from .schema import SCHEMA_VERSION

__all__ = ["Shard", "find_shards", "read_shard", "read_status", "SCHEMA_VERSION"]
