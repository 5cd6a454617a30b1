"""Numbers, switches and name lists from the environment, and whole-number checks: one way each, one sentence
when they are wrong.

Configs, the embedded cluster, the studies and the scheduler-facing helpers all check "is this a whole
number in range", and several settings come from environment variables. Each used to do it its own way
(one accepted ``True`` as 1, one silently ignored a bad variable, one raised a different error class).
Here a bad value is always one :class:`~petmodel.errors.UsageError` sentence that names the setting, the
value and what is expected, so the CLI prints it (exit 2) and the app shows it, with no traceback.

Torch-free and importing nothing of petmodel but its errors, so :mod:`petmodel.config` can use it.
"""

from __future__ import annotations

import math
import os
from typing import Any

from petmodel.errors import UsageError

__all__ = ["env_flag", "env_names", "env_number", "require_whole", "whole_number_rule"]

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def whole_number_rule(minimum: int = 1, maximum: int | None = None) -> str:
    """How a message states the range: "a whole number ≥ 1", "a whole number from 1 to 100,000"."""
    if maximum is None:
        return f"a whole number ≥ {minimum}"
    return f"a whole number from {minimum:,} to {maximum:,}"


def require_whole(what: str, value: Any, *, minimum: int = 1, maximum: int | None = None,
                  rule: str | None = None) -> int:
    """``value`` if it is a whole number from ``minimum`` to ``maximum`` (inclusive), else a UsageError.

    The sentence reads "{what} must be {rule}, not {value!r}." with ``rule`` defaulting to
    :func:`whole_number_rule`; pass ``rule`` where a setting says more ("a whole number ≥ 0 (0 trains
    here)"). ``bool`` is refused although it is an ``int`` subclass: ``True`` workers is a mistake, not 1.
    """
    if (isinstance(value, bool) or not isinstance(value, int) or value < minimum
            or (maximum is not None and value > maximum)):
        raise UsageError(f"{what} must be {rule or whole_number_rule(minimum, maximum)}, not {value!r}.")
    return value


def _expected(kind: type, unit: str | None, minimum: float | None, above: float | None) -> str:
    """What an environment number must be, in words: "a number of gigabytes above 0", "a whole number ≥ 1"."""
    words = "a whole number" if kind is int else "a number"
    if unit:
        words += f" of {unit}"
    if above is not None:
        words += f" above {above:g}"
    elif minimum is not None:
        words += f" ≥ {minimum:g}"
    return words


def env_number(name: str, default: Any, *, kind: type = float, minimum: float | None = None,
               above: float | None = None, unit: str | None = None) -> Any:
    """The number in ``$name``, or ``default`` when it is unset or blank.

    ``kind`` is ``int`` or ``float``; the value must be finite, at least ``minimum`` or strictly
    ``above`` a bound. Anything else (text, "1.5" for a whole number, "0" below the range, "inf")
    is one UsageError sentence naming the variable, the bad text and what is expected: a
    misconfigured limit is never silently replaced by the default, so the operator learns of it.
    """
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or (above is not None and not value > above) or (
            minimum is not None and not value >= minimum):
        raise UsageError(f"${name} must be {_expected(kind, unit, minimum, above)}, not {text!r}; "
                         "fix it, or unset it for the default.")
    return value


def env_flag(name: str, default: bool) -> bool:
    """The switch in ``$name`` (1/true/yes/on or 0/false/no/off, any case), or ``default`` when unset or blank.

    Other text is one UsageError sentence, not the default: a switch that guards access must not be
    read as "on" because of a typo; the caller decides how to fail closed.
    """
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if text.lower() in TRUE_WORDS:
        return True
    if text.lower() in FALSE_WORDS:
        return False
    raise UsageError(f"${name} must be 1 or 0, not {text!r}; fix it, or unset it for the default.")


def env_names(name: str) -> tuple[str, ...]:
    """The comma-separated names in ``$name``, stripped, blanks dropped (none when unset)."""
    return tuple(part.strip() for part in os.environ.get(name, "").split(",") if part.strip())
