"""A worker's log as the Train page shows it under a failed run: what went wrong, not the chatter.

``Client.get_worker_logs`` gives a worker's recent records, INFO lines included (a worker start,
a GPU probe, every plugin it ran), and Dask writes a failed task's traceback as the ``repr`` of a
string, ``\\n`` escaped on one line. :func:`important_lines` keeps the records at WARNING and
above, each with its continuation lines, and unescapes such tracebacks so they read as tracebacks.
"""

from __future__ import annotations

import ast
import logging
import re
from collections.abc import Iterable

# "2026-01-02 10:11:12,345 - distributed.worker - ERROR - Compute Failed" (Dask's default format)
_RECORD = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)? - [^ ]+ - ([A-Z]+) - ")
_LEVELS = {"DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL", "FATAL"}
_QUOTED = re.compile(r"^(\w[\w ]*: )(['\"].*['\"])$")  # "Traceback: '  File …\n …'"


def _unescaped(line: str) -> list[str]:
    """A ``Name: '…\\n…'`` line (a repr'd string) as the lines it stands for; others as they are."""
    match = _QUOTED.match(line)
    if match and "\\n" in match.group(2):
        try:
            text = ast.literal_eval(match.group(2))
        except (ValueError, SyntaxError):
            return [line]
        if isinstance(text, str):
            return [match.group(1).rstrip(), *text.rstrip("\n").splitlines()]
    return [line]


def important_lines(lines: Iterable[str], level: int = logging.WARNING, keep: int = 40) -> list[str]:
    """The last ``keep`` lines of the records at ``level`` or above (continuations kept, tracebacks unescaped).

    Lines before the first record header (a print, say) are kept: their level is unknown.
    """
    out: list[str] = []
    keeping = True
    for line in lines:
        header = _RECORD.match(line)
        if header:
            keeping = logging.getLevelName(header.group(1)) >= level if header.group(1) in _LEVELS else True
        if keeping:
            out.extend(_unescaped(line))
    return out[-keep:]
