"""Run ids: one safe path component, the name of the run's directory under ``--out``.

A run id becomes a directory name (``OUT/<run-id>``, and ``<run-id>.2``, ... for later jobs that reuse it), so it is
checked before anything is created with it: 1 to :data:`MAX_RUN_ID_CHARS` characters of letters, digits and
``. _ - + = @``, beginning with a letter, a digit or ``_`` — never ``/``, ``..``, a NUL, a space or a control
character. ``--run-id``, ``DISTPROF_RUN_ID`` and ``ProfileConfig(run_id=...)`` are refused with one line
(:func:`check_run_id`); a launcher's id (``SLURM_JOB_ID``, ``TORCHELASTIC_RUN_ID``) that is not safe is not used as a
run id (:func:`is_safe_run_id`), and the run gets an id of its own.
"""

from __future__ import annotations

import re

from .errors import ConfigError

__all__ = ["check_run_id", "is_safe_run_id", "MAX_RUN_ID_CHARS"]

#: Longest run id: with ``.<n>`` appended it stays well inside a file name's 255 bytes.
MAX_RUN_ID_CHARS = 128
_SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+=@-]*")


def is_safe_run_id(value: object) -> bool:
    """Whether `value` is a run id distprof uses as a directory name (see the module docstring)."""
    return (isinstance(value, str) and 0 < len(value) <= MAX_RUN_ID_CHARS and _SAFE.fullmatch(value) is not None
            and ".." not in value)


def check_run_id(value: object, what: str = "run_id") -> str:
    """`value` when it is a safe run id; else ConfigError naming `what`, the value (shown safely) and the fix."""
    if is_safe_run_id(value):
        return value  # type: ignore[return-value]
    if not isinstance(value, str):
        raise ConfigError(f"{what}={value!r}: a run id is a string (letters, digits, '.', '_', '-', '+', '=', '@')")
    shown = ascii(value if len(value) <= 60 else value[:57] + "...")
    if not value:
        why = "is empty"
    elif len(value) > MAX_RUN_ID_CHARS:
        why = f"is {len(value)} characters long, more than {MAX_RUN_ID_CHARS}"
    elif "/" in value or "\\" in value or ".." in value:
        why = "is a path, not a name (it holds '/', '\\' or '..')"
    elif "\0" in value:
        why = "holds a NUL character"
    elif not (value[0].isascii() and (value[0].isalnum() or value[0] == "_")):
        why = "must begin with a letter, a digit or '_'"
    else:
        why = "holds characters other than letters, digits, '.', '_', '-', '+', '=', '@'"
    raise ConfigError(f"{what}={shown} {why}: a run id names one directory under --out; use e.g. "
                      "'exp-42' or 'lr0.1_bs256'")
