"""Exceptions raised by distprof. User mistakes get one clear line that names the fix."""


class DistprofError(Exception):
    """Base class for every error distprof raises on purpose."""


class ConfigError(DistprofError, ValueError):
    """An option or environment variable has a value distprof cannot use."""


class ShardFormatError(DistprofError):
    """A shard file is missing, unreadable, or written by an incompatible distprof."""


class BadShardError(ShardFormatError):
    """One shard fails a check: ``path`` and ``reason`` (the message without the path), for lists of what was
    skipped."""

    def __init__(self, path, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class IncompleteRunError(DistprofError):
    """A run directory lacks the shards an operation needs."""


class OutputError(DistprofError, OSError):
    """An output path cannot be written (a directory, a full device, no permission, ...)."""
