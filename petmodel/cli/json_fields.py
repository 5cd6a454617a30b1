"""The two shapes every ``--json`` contract is written in: a :class:`Field` and a :class:`Command`.

Their own module so the contract can be split by subject (:mod:`petmodel.cli.json_schema` for runs and the
commands, :mod:`petmodel.cli.json_study_schema` for the studies' rows) without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Command", "Field"]


@dataclass(frozen=True)
class Field:
    """One field of a JSON object: its name, type (see the module docstring), meaning and units."""

    name: str
    type: str
    meaning: str
    nullable: bool = False  # may be null
    optional: bool = False  # may be absent (a field some code path does not produce yet)
    fields: tuple[Field, ...] = ()  # an ``object`` or ``array of object``: the fields of each object


@dataclass(frozen=True)
class Command:
    """The object one command prints as its last line with ``--json``."""

    name: str  # as typed after ``python -m petmodel``
    summary: str
    fields: tuple[Field, ...]
