"""Write an output file so that nobody ever sees half of it, whatever the path names.

    with atomic_write(path) as fh:          # a binary file object
        fh.write(data)
    # here `path` holds all of it; on an exception a regular file at `path` is untouched

What `path` is decides how (:func:`output_target`):

* a regular file, or nothing yet: written into a temporary file beside it (``<name>.<random>.tmp``, created with
  O_EXCL|O_NOFOLLOW and mode 0600 relative to the folder's descriptor), then one rename over the name; an existing
  file keeps its permission bits, a new one gets 0666 less the umask. Through a **symlink** the user named, the
  link's target is written (atomically, beside the target) and the link stays a link.
* the same file as this process's **stdout or stderr** (``/dev/stdout``, ``/proc/self/fd/1``, a shell redirection):
  written through that stream, after what it already holds, in order.
* a **character device or a FIFO** (``/dev/null``, ``/dev/full``, a named pipe, a terminal): written in place; a
  write error (ENOSPC on ``/dev/full``) is an error, never a silent success.
* a **directory**, a block device or a socket: refused (OutputError), nothing written.

Every failure is an OutputError naming the path: one line for the user, no traceback. ``gzip=True`` wraps the
stream in gzip (closed before the rename); ``fsync=True`` makes a regular file durable before the rename (files
written while a job runs).
"""

from __future__ import annotations

import gzip as gzip_mod
import os
import stat
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from .errors import OutputError
from .storage import safefs
from .storage.schema import TMP_SUFFIX

__all__ = ["atomic_write", "output_target", "OutputTarget", "TMP_SUFFIX"]


@dataclass(frozen=True)
class OutputTarget:
    """How a path is written: ``kind`` "file" (atomically at ``path``, the resolved target), "stream" (through
    ``sys.stdout``/``sys.stderr``, ``stream`` 1 or 2) or "in_place" (opened and written as it is)."""

    kind: str
    path: Path
    stream: int = 0
    mode: int | None = None  # permission bits of the file replaced


def output_target(path: str | os.PathLike) -> OutputTarget:
    """Decide how `path` is written (module docstring). Raises OutputError for what must not be written."""
    p = Path(path)
    try:
        st = os.stat(p)  # follows symlinks
    except FileNotFoundError:
        real = Path(os.path.realpath(p))  # a dangling link names where the file goes
        if not real.parent.is_dir():
            raise OutputError(f"{p}: folder {real.parent} does not exist; create it or choose another path") from None
        return OutputTarget("file", real)
    except OSError as e:
        raise OutputError(f"{p}: cannot write there ({e.strerror})") from None
    for fd in (1, 2):
        try:
            if os.path.samestat(st, os.fstat(fd)):
                return OutputTarget("stream", p, stream=fd)
        except OSError:
            continue
    if stat.S_ISREG(st.st_mode):
        return OutputTarget("file", Path(os.path.realpath(p)), mode=stat.S_IMODE(st.st_mode))
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return OutputTarget("in_place", p)
    if stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{p}: is a directory; name a file in it")
    what = "a block device" if stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a file"
    raise OutputError(f"{p}: is {what}; refusing to write over it, name a file")


@contextmanager
def atomic_write(path: str | os.PathLike, *, gzip: bool = False, compresslevel: int = 6, fsync: bool = False,
                 gzip_name: str = "") -> Iterator[BinaryIO]:
    target = output_target(path)
    try:
        if target.kind == "file":
            with _replace(target, fsync) as raw, _maybe_gzip(raw, gzip, compresslevel, gzip_name) as fh:
                yield fh
        elif target.kind == "stream":
            with _stream(target.stream) as raw, _maybe_gzip(raw, gzip, compresslevel, gzip_name) as fh:
                yield fh
        else:
            _flush_std()
            with open(target.path, "wb") as raw, _maybe_gzip(raw, gzip, compresslevel, gzip_name) as fh:
                yield fh
    except OutputError:
        raise
    except OSError as e:
        raise OutputError(f"{path}: cannot write ({e.strerror or e})") from None


@contextmanager
def _maybe_gzip(raw: BinaryIO, gzip: bool, compresslevel: int, name: str) -> Iterator[BinaryIO]:
    if not gzip:
        yield raw
        return
    with gzip_mod.GzipFile(filename=name, mode="wb", fileobj=raw, compresslevel=compresslevel, mtime=0) as fh:
        yield fh  # type: ignore[misc]


@contextmanager
def _replace(target: OutputTarget, fsync: bool) -> Iterator[BinaryIO]:
    """A new file beside ``target.path``; renamed over it when the block ends without an exception.

    ``storage.safefs.atomic_file``: the temporary is created relative to the folder's descriptor with
    O_CREAT|O_EXCL|O_NOFOLLOW and mode 0600 (a name planted there is never opened, nobody else can open it while it is
    written), given the final mode, and renamed relative to the same descriptor."""
    final = target.path
    mode = target.mode if target.mode is not None else safefs.default_mode(0o666)
    entered = False
    try:
        with safefs.atomic_file(final.parent, final.name, fsync=fsync, mode=mode) as raw:
            entered = True
            yield raw
    except OSError as e:
        if entered:
            raise
        raise OutputError(f"{final}: cannot create a file in {final.parent} ({e.strerror or e})") from None


def _flush_std() -> None:
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except (OSError, ValueError):
            pass


@contextmanager
def _stream(fd: int) -> Iterator[BinaryIO]:
    """Write through this process's stdout (1) or stderr (2), after what it holds: its binary buffer when it has
    one, else the file descriptor itself. Never closed."""
    _flush_std()
    text = sys.stdout if fd == 1 else sys.stderr
    buf = getattr(text, "buffer", None)
    try:
        same = buf is not None and text.fileno() == fd
    except (OSError, ValueError, AttributeError):
        same = False
    if same:
        yield buf
        buf.flush()
        return
    with open(os.dup(fd), "wb") as raw:
        yield raw
