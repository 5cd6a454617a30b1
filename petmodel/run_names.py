"""A readable name for every run, and the search over runs' ids, names and notes.

Run ids are timestamps (``20261206-202251-6fb8``): unique, but they do not say which run is which.
So the store names every run when it records it: the name given at launch (``train --name``, the
Train form's "Run name", a study's "sweep … · …"), else one made from the settings that tell this
project's runs apart, :func:`settings_name`:

* ``2w-b256-lr0.005``: DDP on 2 workers, a global batch of 256 names, Adam learning rate 0.005;
* ``inproc-b128-lr0.005``: trained in the CLI's or the app's own process (``workers`` 0);
* a model shape other than the default adds ``-h512`` (hidden units) and ``-l2`` (layers), bf16 adds ``-bf16``.

A name that another run of the store already has, case aside (``--model NAME`` compares names that
way), gets ``-2``, ``-3``, … (:func:`unique_name`), so a name picks one run and ``--model NAME``
keeps working; a resumed run that keeps its run's name reads ``baseline-2``. Pure: no store, no I/O.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from petmodel.config import MAX_RUN_NAME_CHARS, ModelConfig

IN_PROCESS = "inproc"  # a run trained in the CLI's or app's own process, where a DDP run says "2w"

__all__ = ["IN_PROCESS", "matches", "run_name", "settings_name", "taken_names", "unique_name"]


def settings_name(config: Mapping[str, Any]) -> str:
    """The name a run's settings (a :meth:`RunSpec.to_dict`, as the store keeps it) make.

    Settings a config lacks (one written by an older petmodel, a test's ``{}``) are left out
    rather than guessed, so a name never claims what the run did not record.
    """
    train = config.get("train") or {}
    workers = _whole(config.get("workers")) or 0
    batch = _whole(train.get("batch_size"))
    global_batch = _whole(config.get("global_batch")) or (batch * max(1, workers) if batch else None)
    parts = [f"{workers}w" if workers else IN_PROCESS]
    if global_batch:
        parts.append(f"b{global_batch}")
    if (lr := _number(train.get("lr"))) is not None:
        parts.append(f"lr{lr:.3g}")
    for key, letter, default in (("hidden", "h", ModelConfig.hidden), ("layers", "l", ModelConfig.layers)):
        if (value := _whole(config.get(key))) is not None and value != default:
            parts.append(f"{letter}{value}")
    if train.get("precision") == "bf16":
        parts.append("bf16")
    return "-".join(parts)


def taken_names(names: Iterable[str | None]) -> set[str]:
    """The store's names as :func:`unique_name` compares them (trimmed, case folded), blanks dropped."""
    return {key for name in names if name and (key := _key(name))}


def unique_name(base: str, taken: Collection[str]) -> str:
    """``base``, or ``base-2``, ``base-3``, … : the first that no name in ``taken`` (:func:`taken_names`) is.

    A suffix never takes the name past :data:`MAX_RUN_NAME_CHARS`: the end of ``base`` gives way.
    """
    if _key(base) not in taken:
        return base
    for n in itertools.count(2):
        suffix = f"-{n}"
        candidate = base[: MAX_RUN_NAME_CHARS - len(suffix)].rstrip() + suffix
        if _key(candidate) not in taken:
            return candidate
    raise AssertionError("unreachable")  # pragma: no cover - count() never ends


def run_name(config: Mapping[str, Any], given: str | None, taken: Collection[str]) -> str:
    """A new run's name: ``given`` (trimmed) or its :func:`settings_name`, made unique among ``taken``."""
    base = (given or "").strip() or settings_name(config)
    return unique_name(base, taken)


def matches(query: str, *texts: str | None) -> bool:
    """Whether ``query`` occurs in any of ``texts`` (a run's id, name, note), case aside; a blank query
    matches every run, as an empty search box shows them all."""
    wanted = _key(query)
    return not wanted or any(wanted in _key(text) for text in texts if text)


def _key(text: str) -> str:
    """A name as ``--model NAME`` compares it (:mod:`petmodel.store.lookup`): trimmed, case folded."""
    return text.strip().casefold()


def _whole(value: Any) -> int | None:
    """An int the config holds (JSON keeps ints as ints); None for anything else, a bool included."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)
