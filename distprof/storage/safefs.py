"""Files in a run directory, opened so that nobody sharing the directory can turn them against the job or a reader.

A run directory may sit on a shared file system where other users can create names. Everything distprof writes or
reads there goes through this module:

* **writes** (:func:`write_file`): the directory is opened once (``O_DIRECTORY|O_NOFOLLOW``: a link in its place is
  refused), a temporary file with a unique name is created in it with ``O_CREAT|O_EXCL|O_NOFOLLOW`` and mode 0600
  (so a planted link or file at that name is never opened, and nobody else can open it while it is written),
  written, made durable when asked, given its final mode, and renamed over the final name — relative to the
  directory's descriptor. The final name is never opened: whatever was there (a symlink, a FIFO, another file) is
  replaced, never written through.
* **reads** (:func:`read_file`): opened with ``O_NONBLOCK`` (a FIFO never blocks the reader) and, for the files
  distprof itself writes, ``O_NOFOLLOW``; ``fstat`` must say a regular file, and no more than a stated number of
  bytes is ever read. Anything else is a :class:`FileRefused` naming the file and what it is, in one line.
* **HDF5 files** (:func:`open_regular`): the same checks on a descriptor, which a reader then opens through
  ``/proc/self/fd`` (Linux), so the file checked is the file read.

:func:`load_json` decodes bounded JSON and refuses nesting deeper than :data:`MAX_JSON_DEPTH`, catching every
exception the decoder raises.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import orjson

__all__ = ["FileRefused", "BadJSON", "write_file", "atomic_file", "read_file", "read_json", "load_json", "open_dir",
           "open_regular", "fd_path", "kind_of", "default_mode", "MAX_JSON_DEPTH", "TMP_SUFFIX"]

TMP_SUFFIX = ".tmp"
#: JSON nested deeper than this is refused (distprof writes at most 4 levels).
MAX_JSON_DEPTH = 64
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_WRITE_STEP = 8 << 20


class FileRefused(OSError):
    """A file that is not read or written: not a regular file, a link where none may be, larger than allowed, or
    JSON that cannot be decoded. ``path`` and ``reason`` (words, without the path)."""

    def __init__(self, path: os.PathLike | str, reason: str, err: int = errno.EINVAL) -> None:
        super().__init__(err, f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def kind_of(mode: int) -> str:
    """What a file of `mode` is, in words ('a FIFO', 'a directory', ...)."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _umask() -> int:
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)  # not thread-safe, hence only where /proc says nothing
    os.umask(old)
    return old


_UMASK: int | None = None


def default_mode(base: int = 0o644) -> int:
    """`base` less the process's umask: what a file created with `base` would get."""
    global _UMASK
    if _UMASK is None:
        _UMASK = _umask()
    return base & ~_UMASK


# ---- directories ---------------------------------------------------------------------------------------------------
def open_dir(path: os.PathLike | str, *, dir_fd: int | None = None, follow: bool = False) -> int:
    """A descriptor of directory `path` (relative to `dir_fd` when given). Unless `follow`, a symbolic link as its
    last component is refused (FileRefused); parents are resolved as usual (they are the user's choice)."""
    flags = os.O_RDONLY | _DIRECTORY | _CLOEXEC | (0 if follow else _NOFOLLOW)
    try:
        return os.open(path, flags, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK) or (e.errno == errno.ENOTDIR and _is_link(path, dir_fd)):
            raise FileRefused(path, "is a symbolic link, not a directory; distprof does not write through links in "
                                    "a run directory (remove it)", errno.ELOOP) from None
        raise


def _is_link(path, dir_fd) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


# ---- writing -------------------------------------------------------------------------------------------------------
def write_file(directory: os.PathLike | str, name: str, data: bytes | memoryview, *, fsync: bool = False,
               mode: int | None = None, dir_fd: int | None = None, replace: bool = True) -> int:
    """Store `data` as `name` in `directory`, atomically and without following any link (module docstring).

    `mode`: the final permission bits (default 0644 less the umask); `fsync`: the file and the directory are made
    durable. `dir_fd`: an open descriptor of `directory` to use instead of opening it. `replace=False`: a regular file
    already at `name` is never replaced (FileExistsError; a link or FIFO there is, as always). Returns the size.
    Raises OSError (FileRefused when `directory` is a link); a file already at `name` is then untouched.
    """
    _check_name(directory, name)
    own = dir_fd is None
    dfd = open_dir(directory) if own else dir_fd
    try:
        with _temporary(dfd, name, fsync, mode, replace) as fd:
            _write_all(fd, data)
        return len(data)
    finally:
        if own:
            os.close(dfd)


@contextmanager
def atomic_file(directory: os.PathLike | str, name: str, *, fsync: bool = False,
                mode: int | None = None) -> Iterator[BinaryIO]:
    """:func:`write_file` for a writer that streams: a binary file object on the temporary file, renamed over `name`
    when the block ends without an exception (removed otherwise)."""
    _check_name(directory, name)
    dfd = open_dir(directory)
    try:
        with _temporary(dfd, name, fsync, mode) as fd, os.fdopen(fd, "wb", closefd=False) as fh:
            yield fh
    finally:
        os.close(dfd)


@contextmanager
def _temporary(dfd: int, name: str, fsync: bool, mode: int | None, replace: bool = True) -> Iterator[int]:
    """A new temporary beside `name` (relative to `dfd`), written by the block through the descriptor it yields; then
    flushed, given its final mode and renamed over `name` (`replace=False`: :func:`_publish_new`).
    Removed when anything fails; `name` is then untouched."""
    tmp, fd = _create_tmp(dfd, name)
    try:
        try:
            yield fd
            if fsync:
                os.fsync(fd)
            os.fchmod(fd, default_mode() if mode is None else mode)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        else:
            _publish_new(tmp, name, dfd)
    except BaseException:
        _unlink_quietly(tmp, dfd)
        raise
    if fsync:
        try:
            os.fsync(dfd)
        except OSError:
            pass


#: link(2) refused by the file system itself (some FUSE and object-store mounts): the name is then checked and renamed
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK, errno.EXDEV}


def _publish_new(tmp: str, name: str, dfd: int) -> None:
    """The finished temporary `tmp` becomes `name` unless a regular file is there (FileExistsError: it stays). A hard
    link, atomic against every other writer (link(2) fails on any existing name), then the temporary's name goes;
    something at `name` that holds no data (a planted link or FIFO) is renamed over, as every other write does.
    Where the file system has no hard links, the name is checked, then renamed onto: atomic against everything but
    a writer racing for the same name in the same instant."""
    try:
        os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
    except FileExistsError:
        _replace_unless_regular(tmp, name, dfd)
        return
    except OSError as e:
        if e.errno not in _NO_HARD_LINKS:
            raise
        _replace_unless_regular(tmp, name, dfd)
        return
    _unlink_quietly(tmp, dfd)


def _replace_unless_regular(tmp: str, name: str, dfd: int) -> None:
    try:
        there = os.lstat(name, dir_fd=dfd)
    except FileNotFoundError:
        there = None
    if there is not None and stat.S_ISREG(there.st_mode):
        raise FileExistsError(errno.EEXIST, "a file of that name is already there (kept)", name)
    os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)


def _check_name(directory: os.PathLike | str, name: str) -> None:
    """`name` is one file name in `directory` (no separator, no NUL, not . or ..), else FileRefused."""
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise FileRefused(Path(directory) / name, "not a file name")


def _create_tmp(dfd: int, name: str) -> tuple[str, int]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    for _ in range(16):
        tmp = f"{name}.{secrets.token_hex(4)}{TMP_SUFFIX}"
        try:
            return tmp, os.open(tmp, flags, 0o600, dir_fd=dfd)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name beside {name}")  # pragma: no cover


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    size = len(view)
    done = 0
    while done < size:
        n = os.write(fd, view[done:done + _WRITE_STEP])
        if n <= 0:
            raise OSError(errno.EIO, "write returned 0")
        done += n
    if size and os.fstat(fd).st_size != size:
        raise OSError(errno.EIO, f"{os.fstat(fd).st_size} of {size} bytes on disk after the write")


def _unlink_quietly(name: str, dfd: int) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except OSError:
        pass


# ---- reading -------------------------------------------------------------------------------------------------------
def open_regular(path: os.PathLike | str, *, follow: bool = True, dir_fd: int | None = None) -> int:
    """A read-only descriptor of `path` once ``fstat`` says it is a regular file; opened non-blocking (a FIFO
    never hangs the caller). Without `follow` a symbolic link is refused. FileNotFoundError passes through."""
    flags = os.O_RDONLY | _NONBLOCK | _CLOEXEC | (0 if follow else _NOFOLLOW)
    try:
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)  # refuse devices before opening them at all
    except FileNotFoundError:
        raise
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(path, _not_regular(st.st_mode, follow))
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK):
            raise FileRefused(path, _not_regular(stat.S_IFLNK, follow), errno.ELOOP) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped between the stat and the open
            raise FileRefused(path, _not_regular(st.st_mode, follow))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _not_regular(mode: int, follow: bool) -> str:
    what = kind_of(mode)
    if stat.S_ISLNK(mode) and not follow:
        return "is a symbolic link; distprof does not follow links to its own files in a run directory (remove it)"
    return f"is {what}, not a regular file; move it out of the run directory"


def read_file(path: os.PathLike | str, max_bytes: int, *, follow: bool = False, dir_fd: int | None = None,
              what: str = "file") -> bytes:
    """The bytes of regular file `path`, at most `max_bytes` (more: FileRefused, nothing beyond read); see
    :func:`open_regular`. `what` names the kind of file in the message. FileNotFoundError passes through."""
    fd = open_regular(path, follow=follow, dir_fd=dir_fd)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise FileRefused(path, f"{size:,} bytes, more than a {what}'s {max_bytes:,}; not distprof's (remove "
                                    "it)", errno.EFBIG)
        chunks = []
        got = 0
        while got <= max_bytes:
            b = os.read(fd, min(1 << 20, max_bytes + 1 - got))
            if not b:
                break
            chunks.append(b)
            got += len(b)
        if got > max_bytes:
            raise FileRefused(path, f"more than a {what}'s {max_bytes:,} bytes; not distprof's (remove it)",
                              errno.EFBIG)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_json(path: os.PathLike | str, max_bytes: int, *, follow: bool = False, what: str = "file") -> Any:
    """:func:`read_file` then :func:`load_json`."""
    return load_json(read_file(path, max_bytes, follow=follow, what=what), path)


class BadJSON(FileRefused):
    """JSON that is not decoded: ``detail`` is what is wrong with it (the decoder's message, or its depth)."""

    def __init__(self, path: os.PathLike | str, detail: str) -> None:
        super().__init__(path, f"not JSON ({detail})")
        self.detail = detail


def load_json(data: bytes | str, path: os.PathLike | str = "<json>", max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Decode JSON text; BadJSON (a FileRefused) for anything the decoder raises, or nesting deeper than
    `max_depth`."""
    try:
        doc = _decode(data)
    except RecursionError:
        raise BadJSON(path, f"nested deeper than {max_depth} levels") from None
    except (ValueError, TypeError, MemoryError, OverflowError) as e:
        text = str(e) or type(e).__name__
        raise BadJSON(path, text[:77] + "..." if len(text) > 80 else text) from None
    if _openers(data) > max_depth and json_depth(doc, max_depth) > max_depth:
        raise BadJSON(path, f"nested deeper than {max_depth} levels")
    return doc


def _decode(data: bytes | str) -> Any:
    """orjson's decoder first (a 16,384-rank shard's process groups, 117 KB of JSON: 0.25 ms against json's 0.94 ms,
    read for every shard of a run); what it refuses goes to the standard decoder, which accepts what distprof writes
    (NaN included) and raises for the rest."""
    try:
        return orjson.loads(data)
    except Exception:  # noqa: BLE001 -- NaN, huge integers, deep nesting, bad text: the standard decoder decides
        return json.loads(data)


def _openers(data: bytes | str) -> int:
    """How many '[' and '{' the text holds (in strings too): no document nests deeper, so at most `max_depth` of them
    needs no walk (a 16,384-rank process-group list is one list, walked element by element in every shard)."""
    return data.count(b"[") + data.count(b"{") if isinstance(data, bytes) else data.count("[") + data.count("{")


def json_depth(doc: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep `doc` nests (a scalar 0, [] 1, ...), counted without recursion; stops counting past `limit`."""
    deepest = 0
    stack = [(doc, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            items = v.values()
        elif isinstance(v, list):
            items = v
        else:
            continue
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        stack.extend((x, d + 1) for x in items if isinstance(x, (dict, list)))
    return deepest


_PROC_FD = os.path.isdir("/proc/self/fd")


def fd_path(fd: int, path: os.PathLike | str) -> str:
    """A name that opens exactly the file behind `fd` (``/proc/self/fd/N`` on Linux), else `path`."""
    return f"/proc/self/fd/{fd}" if _PROC_FD else os.fspath(path)
