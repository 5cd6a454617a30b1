"""The Generate page's shareable state: settings in, URL query out, and back, safely.

Every setting that decides the names on the Generate page lives in the page's URL, so a
link reproduces its names. A link can hold anything, so :func:`parse_generate_params`
never raises: a bad value is replaced and explained in one sentence.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from petmodel.config import SPECIES, GenerateConfig
from petmodel.config import TEMPERATURE_RANGE as CONFIG_TEMPERATURE_RANGE
from petmodel.data import DEFAULT_ALPHABET
from petmodel.errors import PetmodelError
from petmodel.status import RunStatus
from petmodel.store import RunRecord, RunStore

RUN_ID_PATTERN = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{4}$")
TEMPERATURE_RANGE = CONFIG_TEMPERATURE_RANGE  # the run configuration's, so a link and the CLI agree
N_MAX = 1000  # the app's cap; the library allows far more
PREFIX_MAX = 16
SEED_MAX = 2**31 - 1

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


def is_run_id(value: Any) -> bool:
    """True for a string shaped like a run id (``YYYYMMDD-HHMMSS-xxxx``) and nothing else.

    Links and forms only ever name runs by id, never by path, so anything else is refused early.
    """
    return isinstance(value, str) and RUN_ID_PATTERN.fullmatch(value) is not None


@dataclass(frozen=True)
class GenerateSettings:
    """Everything that decides the names on the Generate page (and is mirrored in its URL)."""

    model: str | None = None
    temperature: float = GenerateConfig.temperature
    n: int = 20
    prefix: str = ""
    seed: int | None = None
    new_only: bool = False
    species: str = "any"

    def with_seed(self) -> GenerateSettings:
        """These settings with a seed: the given one, else a fresh random one (so the URL can pin it)."""
        return self if self.seed is not None else replace(self, seed=secrets.randbelow(SEED_MAX + 1))

    def to_query(self) -> dict[str, str]:
        """The URL query parameters that reproduce exactly these settings."""
        out = {"temperature": f"{self.temperature:g}", "n": str(self.n), "new": "1" if self.new_only else "0"}
        if self.model:
            out = {"model": self.model, **out}
        if self.prefix:
            out["prefix"] = self.prefix
        if self.seed is not None:
            out["seed"] = str(self.seed)
        if self.species != "any":  # links from before species keep their exact form
            out["species"] = self.species
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _last(value: Any) -> Any:
    """st.query_params gives strings; AppTest and parse_qs give lists for repeated keys: take the last."""
    if isinstance(value, (list, tuple)):
        return value[-1] if value else ""
    return value


def _short(value: Any) -> str:
    """A value for a notice, cut short: a link can hold kilobytes."""
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "…"


def _given(params: Mapping[str, Any], key: str) -> str | None:
    raw = _last(params.get(key))
    return None if raw in (None, "") else str(raw)


def parse_generate_params(params: Mapping[str, Any], store: RunStore | None = None, *,
                          models: Sequence[RunRecord] | None = None) -> tuple[GenerateSettings, list[str]]:
    """Settings from URL query parameters, and one notice per value that was bad and replaced.

    Never raises. ``models`` are the usable models, best first (see
    :func:`petmodel.app.models.available_models`): ``model`` must be one of them, else the
    best is used; with ``models`` None any run id is taken. A file path or anything else that
    is not a run id is ignored. ``store`` only words the notice about an unusable model.
    ``temperature`` is clamped to 0.1–2.0, ``n`` to 1–1000; ``prefix`` must use the model's
    alphabet; ``seed`` is a whole number 0–2³¹−1 (left None when absent or bad: the page then
    picks one and writes it into the URL); ``new`` is 1/0 or true/false; ``species`` is one of
    :data:`petmodel.config.SPECIES` (whether the chosen model knows species is the page's check).
    """
    params = dict(params or {})
    notices: list[str] = []
    model = _parse_model(_given(params, "model"), store, models, notices)
    temperature = _parse_temperature(_given(params, "temperature"), notices)
    n = _parse_count(_given(params, "n"), notices)
    prefix = _parse_prefix(_given(params, "prefix"), notices)
    seed = _parse_seed(_given(params, "seed"), notices)
    new_only = _parse_new(_last(params.get("new")), notices)
    species = _parse_species(_given(params, "species"), notices)
    return GenerateSettings(model=model, temperature=temperature, n=n, prefix=prefix, seed=seed,
                            new_only=new_only, species=species), notices


def _parse_model(raw: str | None, store: RunStore | None, models: Sequence[RunRecord] | None,
                 notices: list[str]) -> str | None:
    ids = [m.id for m in models] if models is not None else None
    fallback = ids[0] if ids else None
    if raw is None:
        return fallback
    raw = raw.strip()
    if not is_run_id(raw):
        notices.append("The model in the link is not a run id, so it was ignored"
                       + ("; showing the best model instead." if fallback else "."))
        return fallback
    if ids is None or raw in ids:
        return raw
    notices.append(_model_notice(store, raw) + (" Showing the best model instead." if fallback else ""))
    return fallback


def _parse_temperature(raw: str | None, notices: list[str]) -> float:
    default = GenerateSettings.temperature
    if raw is None:
        return default
    try:
        value = float(raw.strip())
        if not math.isfinite(value):
            raise ValueError
    except ValueError:
        notices.append(f"Temperature {_short(raw)!r} is not a number; using {default:g}.")
        return default
    low, high = TEMPERATURE_RANGE
    clamped = min(high, max(low, value))
    if clamped != value:
        notices.append(f"Temperature {value:g} is outside {low:g}–{high:g}; using {clamped:g}.")
    return round(clamped, 2)


def _parse_count(raw: str | None, notices: list[str]) -> int:
    default = GenerateSettings.n
    if raw is None:
        return default
    text = raw.strip()
    if not re.fullmatch(r"[+-]?\d{1,12}", text):
        notices.append(f"Count {_short(raw)!r} is not a whole number; showing {default}.")
        return default
    value = int(text)
    clamped = min(N_MAX, max(1, value))
    if clamped != value:
        notices.append(f"Count {value:,} is outside 1–{N_MAX:,}; showing {clamped:,} name{'' if clamped == 1 else 's'}.")
    return clamped


def _parse_prefix(raw: str | None, notices: list[str]) -> str:
    if raw is None:
        return GenerateSettings.prefix
    text = " ".join(raw.lower().split())
    if len(text) > PREFIX_MAX:
        notices.append(f"The prefix is longer than {PREFIX_MAX} characters, so it was ignored.")
    elif any(ch not in DEFAULT_ALPHABET for ch in text):
        notices.append("The prefix may only use letters a–z, space, '.' and '-', so it was ignored.")
    else:
        return text
    return GenerateSettings.prefix


def _parse_seed(raw: str | None, notices: list[str]) -> int | None:
    if raw is None:
        return None
    text = raw.strip()
    if re.fullmatch(r"\d{1,10}", text) and int(text) <= SEED_MAX:
        return int(text)
    notices.append(f"Seed {_short(raw)!r} is not a whole number from 0 to {SEED_MAX:,}; picked a new one.")
    return None


def _parse_new(raw: Any, notices: list[str]) -> bool:
    if raw is None:  # absent; an empty value means "no"
        return GenerateSettings.new_only
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    notices.append(f"'new' must be 1 or 0, not {_short(raw)!r}; showing all names.")
    return GenerateSettings.new_only


def _parse_species(raw: str | None, notices: list[str]) -> str:
    if raw is None:
        return GenerateSettings.species
    text = raw.strip().lower()
    if text in SPECIES:
        return text
    notices.append(f"Species {_short(raw)!r} is not one of {', '.join(SPECIES)}; showing names for any species.")
    return GenerateSettings.species


def _model_notice(store: RunStore | None, run_id: str) -> str:
    """Why ``run_id`` (shaped like a run id) cannot be used as a model, in one sentence."""
    run = None
    if store is not None:
        try:
            run = store.get_run(run_id)
        except PetmodelError:
            run = None
    if run is None:
        return f"There is no run {run_id} in the store."
    if run.status != RunStatus.COMPLETED or not run.model_path:
        return f"Run {run_id} has no saved model (it {_status_phrase(run.status)})."
    return f"The model file of run {run_id} was deleted."


_STATUS_PHRASES = {RunStatus.FAILED: "failed", RunStatus.CANCELLED: "was cancelled", RunStatus.PRUNED: "was pruned",
                   RunStatus.RUNNING: "is still running", RunStatus.QUEUED: "has not started"}


def _status_phrase(status: str) -> str:
    """What a run without a model did, as the end of "it …" ("was cancelled", "is still running")."""
    return _STATUS_PHRASES.get(status, f"is {status}")
