"""How an invented pet name is shown to people: the same in the app and on the command line.

The model works on cleaned, lower-case names (``data`` keeps only ``a-z``, space, ``.`` and ``-``),
so what it samples reads as ``mr. whiskers``; people write ``Mr. Whiskers``. The Generate page and
``python -m petmodel generate`` both print names through :func:`display_name`, so a name looks the
same wherever it is read, while ``--json`` and the store keep the model's own spelling. Torch-free:
the CLI's parser and the pages import it cheaply.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["display_name", "display_names"]


def display_name(name: str) -> str:
    """``name`` in title case: every word, and every part after a hyphen or a dot, capitalised."""
    return name.title()


def display_names(names: Iterable[str]) -> list[str]:
    """:func:`display_name` of each of ``names``, in order."""
    return [display_name(name) for name in names]
