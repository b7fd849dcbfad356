"""One module per ``distprof`` subcommand; each has ``register(subparsers)`` which adds its parser and sets ``func``.

Add a command by writing ``distprof/commands/<name>.py`` and listing it in ``COMMANDS`` (the order of ``--help``).
Modules import their heavy dependencies inside the command function so ``distprof --help`` stays fast.
"""

from __future__ import annotations

import importlib

COMMANDS = ("report", "diff", "timeline", "import_", "export", "trigger")


def register_all(sub) -> None:
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub)
