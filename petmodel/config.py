"""Everything that defines a training run, and every default, in one torch-free module.

The CLI, the app's forms and the studies all build a :class:`RunSpec` and read their defaults
from the dataclass fields here, so a default is written once. Validation lives in
``__post_init__``: a form or a flag never re-checks what a config checks. Importing this
module does not import torch, so the app and the CLI can parse and validate input cheaply.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from petmodel.errors import UsageError
from petmodel.settings import env_number, require_whole

PRECISIONS = ("fp32", "bf16")
WANDB_MODES = ("disabled", "offline", "online")
DEFAULT_WANDB_PROJECT = "petnames"
MAX_MODEL_GB_ENV = "PETMODEL_MAX_MODEL_GB"
DEFAULT_MAX_MODEL_GB = 16.0
ESTIMATE_NAME_LEN = 50  # names in the data run up to ~50 characters; activations scale with it
# Species a model can be conditioned on; index 0, "any", is what training sometimes puts in place of the
# real species, so one model generates for a species or for all. The order is part of the checkpoint.
SPECIES = ("any", "dog", "cat", "other")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the character LSTM (see :class:`petmodel.model.CharLSTM`)."""

    vocab_size: int = 30
    embed: int = 32
    hidden: int = 256
    layers: int = 1
    dropout: float = 0.3
    species: int = 0  # species tokens the model is conditioned on (len(SPECIES)); 0: unconditioned, as before

    def __post_init__(self) -> None:
        require_whole("Model species", self.species, minimum=0)
        for name in ("vocab_size", "embed", "hidden", "layers"):
            require_whole(f"Model {name}", getattr(self, name))
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise UsageError(f"Dropout must be in [0, 1), not {self.dropout!r}.")

    def for_data(self, has_species: bool) -> ModelConfig:
        """This shape for data with or without species: conditioning needs species to learn from.

        The one rule every trainer and the checkpoint writer apply, so weights and config agree.
        """
        return self if has_species or not self.species else replace(self, species=0)

    def parameter_count(self) -> int:
        """The weights of :class:`petmodel.model.CharLSTM` of this shape, counted without building it (torch-free:
        memory checks run before torch loads); ``tests/test_model.py`` holds it to the built model's count.

        Characters' (and species') embeddings, each LSTM layer's four gates (input and recurrent weights, two
        biases), and the output layer.
        """
        e, h, v = self.embed, self.hidden, self.vocab_size
        lstm = 4 * h * (e + h + 2) + (self.layers - 1) * 4 * h * (2 * h + 2)
        return v * e + self.species * e + lstm + h * v + v

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings. ``batch_size`` is per worker; the global batch is batch × workers."""

    epochs: int | None = None
    max_seconds: float | None = 60.0
    batch_size: int = 128
    lr: float = 0.005
    clip: float = 1.0
    seed: int = 0
    precision: str = "fp32"
    eval_every_steps: int = 0  # 0: validate once per epoch (and at the end)
    eval_every_seconds: float | None = None  # also validate this often (rank 0): finer time-to-target curves
    sortish: bool = True
    max_steps: int | None = None  # mostly for tests: stop after exactly this many optimiser steps
    # Seconds between snapshots of the training state (0: only when the run stops). A lost worker
    # costs up to this much training plus re-forming the group; a snapshot costs milliseconds.
    checkpoint_every_s: float = 5.0

    def __post_init__(self) -> None:
        if self.epochs is None and self.max_seconds is None and self.max_steps is None:
            raise UsageError("Give an epoch count or a time budget (max seconds), or both.")
        if self.epochs is not None:
            require_whole("Epochs", self.epochs)
        if self.max_seconds is not None and not (_is_number(self.max_seconds) and self.max_seconds > 0
                                                 and math.isfinite(self.max_seconds)):
            raise UsageError(f"The time budget must be a positive number of seconds, not {self.max_seconds!r}.")
        require_whole("Batch size", self.batch_size)
        if not (_is_number(self.lr) and self.lr > 0 and math.isfinite(self.lr)) or self.lr > 10:
            raise UsageError(f"Learning rate must be a positive number up to 10, not {self.lr!r}.")
        if not (_is_number(self.clip) and self.clip > 0):
            raise UsageError(f"Gradient clipping must be positive, not {self.clip!r}.")
        require_whole("The seed", self.seed, minimum=0, maximum=2**63 - 1, rule="a whole number from 0 to 2^63 - 1")
        if self.precision not in PRECISIONS:
            raise UsageError(f"Precision must be one of {', '.join(PRECISIONS)}, not {self.precision!r}.")
        if self.max_steps is not None:
            require_whole("max_steps", self.max_steps)
        if not (_is_number(self.checkpoint_every_s) and self.checkpoint_every_s >= 0
                and math.isfinite(self.checkpoint_every_s)):
            raise UsageError(f"The checkpoint interval must be a number of seconds ≥ 0 (0: only at the end), "
                             f"not {self.checkpoint_every_s!r}.")
        if self.eval_every_seconds is not None and not (_is_number(self.eval_every_seconds)
                                                        and self.eval_every_seconds > 0):
            raise UsageError(f"The validation interval must be a positive number of seconds, "
                             f"not {self.eval_every_seconds!r}.")
        require_whole("eval_every_steps", self.eval_every_steps, minimum=0)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RunSpec:
    """A training run: model shape, optimisation, where it runs and how it is tracked.

    ``workers`` 0 trains in this process; N ≥ 1 trains with DDP on N Dask workers.
    """

    train: TrainConfig = field(default_factory=TrainConfig)
    embed: int = ModelConfig.embed
    hidden: int = ModelConfig.hidden
    layers: int = ModelConfig.layers
    dropout: float = ModelConfig.dropout
    data: str | None = None
    workers: int = 0
    name: str | None = None  # the store names a run without one from its settings (petmodel.run_names)
    note: str | None = None  # a line on what the run is for; the store's copy is the one `runs note` edits
    wandb_mode: str = "disabled"
    wandb_project: str = DEFAULT_WANDB_PROJECT
    species: bool = True  # condition on species when the data has them (False: the unconditioned model)
    # A DDP run that loses a worker re-forms on the others from its latest snapshot, this many times at most.
    max_restarts: int = 2

    def __post_init__(self) -> None:
        require_whole("max_restarts", self.max_restarts, minimum=0)
        if not isinstance(self.species, bool):
            raise UsageError(f"species must be true or false, not {self.species!r}.")
        require_whole("Workers", self.workers, minimum=0, rule="a whole number ≥ 0 (0 trains here)")
        check_label("The run name", self.name)
        check_label("The note", self.note, limit=MAX_RUN_NOTE_CHARS)
        if self.wandb_mode not in WANDB_MODES:
            raise UsageError(f"W&B mode must be one of {', '.join(WANDB_MODES)}, not {self.wandb_mode!r}.")
        if self.wandb_mode != "disabled" and not str(self.wandb_project or "").strip():
            raise UsageError("Give a W&B project name, or set W&B to disabled.")
        self.model_config(30)  # validates the model fields
        if _BUILDING_DEFAULTS.get():
            return
        need, limit = estimated_memory_bytes(self), max_model_bytes()
        if need > limit:
            raise UsageError(f"This model and batch need about {need / 1e9:,.1f} GB per worker (hidden {self.hidden}, "
                             f"{self.layers} layer(s), batch {self.train.batch_size}), over the {limit / 1e9:g} GB "
                             f"limit; make it smaller or raise ${MAX_MODEL_GB_ENV}.")

    def model_config(self, vocab_size: int) -> ModelConfig:
        return ModelConfig(vocab_size=vocab_size, embed=self.embed, hidden=self.hidden, layers=self.layers,
                           dropout=self.dropout, species=len(SPECIES) if self.species else 0)

    @property
    def global_batch(self) -> int:
        return self.train.batch_size * max(1, self.workers)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["global_batch"] = self.global_batch
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunSpec:
        d = dict(d)
        d.pop("global_batch", None)
        train_fields = {f.name for f in fields(TrainConfig)}
        train = TrainConfig(**{k: v for k, v in d.pop("train", {}).items() if k in train_fields})
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(train=train, **known)

    def with_(self, **changes: Any) -> RunSpec:
        """A copy with top-level or training fields changed (``lr=…`` goes to ``train``)."""
        train_fields = {k: changes.pop(k) for k in list(changes) if k in TrainConfig.__dataclass_fields__}
        spec = replace(self, **changes)
        return replace(spec, train=replace(spec.train, **train_fields)) if train_fields else spec


def estimated_memory_bytes(spec: RunSpec, vocab_size: int = 30) -> int:
    """A generous estimate of the memory one worker needs to train ``spec``, before allocating any.

    Weights, gradients, Adam's two moments and DDP's gradient buckets (5 copies of the parameters),
    plus one step's activations kept for the backward pass (LSTM gates and states per layer, the
    embedding and the logits) for a batch of names of :data:`ESTIMATE_NAME_LEN` characters.
    """
    h, e, n = spec.hidden, spec.embed, spec.layers
    params = spec.model_config(vocab_size).parameter_count()
    activations = spec.train.batch_size * ESTIMATE_NAME_LEN * (n * h * 14 + 2 * e + 4 * vocab_size)
    return 4 * (5 * params + activations)


def max_model_bytes() -> int:
    """The most memory one worker may be asked for: ``$PETMODEL_MAX_MODEL_GB`` gigabytes (default 16)."""
    return int(env_number(MAX_MODEL_GB_ENV, DEFAULT_MAX_MODEL_GB, above=0, unit="gigabytes") * 1e9)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# 10,000 names take under a second (README's benchmark); more is a mistake or an attack on the app's server.
MAX_NAMES = 10_000
MAX_NAME_CHARS = 64  # the longest name generated, scored or trained on (the longest real one has 50)
MAX_RUN_NAME_CHARS = 100  # a run's or study's label: one line in a table, not a page
MAX_RUN_NOTE_CHARS = 300  # a run's note: a sentence or two, still one line


def quoted(text: str, limit: int = 40) -> str:
    """``text`` as a message quotes it: ``repr``, cut to ``limit`` characters, so a 10,000-character
    value never floods one sentence."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"… ({len(text):,} characters)"


def check_label(what: str, value: Any, *, limit: int = MAX_RUN_NAME_CHARS) -> None:
    """A run's or study's name (or a run's note): text of at most ``limit`` characters, no control characters.

    One rule for the CLI, the app's forms and the studies. Control and bidirectional-override characters
    would break the one-line tables or make a name read differently from what it is (U+202E turns text
    around); a 10,000-character name made the Home page 4,000 px tall.
    """
    if value is None:
        return
    if not isinstance(value, str):
        raise UsageError(f"{what} must be text, not {value!r}.")
    if len(value) > limit:
        raise UsageError(f"{what} is {len(value):,} characters long; give at most {limit}.")
    bad = next((c for c in value if unicodedata.category(c) == "Cc" or c in _BIDI_CONTROLS), None)
    if bad is not None:
        raise UsageError(f"{what} {quoted(value)} holds the control character U+{ord(bad):04X}; use letters, "
                         "digits, spaces and punctuation only.")


_BIDI_CONTROLS = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u061c")


TEMPERATURE_RANGE = (0.1, 2.0)  # one set of bounds for the CLI, the app's slider and a link: colder repeats the
# same few names, hotter reads as noise


@dataclass(frozen=True)
class GenerateConfig:
    """How to sample names from a trained model (see :func:`petmodel.generate.generate`)."""

    n: int = 20
    # The temperature that yields the most *different* real pet names per sample (too cold repeats
    # the same few, too hot invents odd ones), measured on the real data (README's benchmark
    # section); the top of its flat peak keeps a page of 20 names varied.
    temperature: float = 0.65
    top_k: int | None = None
    prefix: str = ""
    max_len: int = 24
    seed: int | None = None
    new_only: bool = False
    precision: str = "fp32"  # "bf16": autocast the LSTM (faster on CPUs with AMX, see README; other samples)
    species: str = "any"  # one of SPECIES; a model trained without species only takes "any"

    def __post_init__(self) -> None:
        if self.species not in SPECIES:
            raise UsageError(f"Species must be one of {', '.join(SPECIES)}, not {self.species!r}.")
        require_whole("The number of names", self.n, maximum=MAX_NAMES)
        low, high = TEMPERATURE_RANGE
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and low <= self.temperature <= high):
            raise UsageError(f"Temperature must be from {low:g} to {high:g}, not {self.temperature!r}.")
        if self.top_k is not None:
            require_whole("top-k", self.top_k)
        require_whole("Maximum length", self.max_len, maximum=MAX_NAME_CHARS,
                      rule=f"from 1 to {MAX_NAME_CHARS} characters")
        if not isinstance(self.prefix, str):
            raise UsageError(f"The prefix must be text, not {self.prefix!r}.")
        if len(self.prefix) >= self.max_len:
            raise UsageError(f"The prefix {quoted(self.prefix)} is as long as the maximum name length "
                             f"({self.max_len}); shorten it.")
        if self.precision not in PRECISIONS:
            raise UsageError(f"Precision must be fp32 or bf16, not {self.precision!r}.")
        if self.seed is not None:
            require_whole("The seed", self.seed, minimum=0, maximum=2**63 - 1, rule="a whole number ≥ 0")


SCALE_MAX_WORKERS_ENV = "PETMODEL_SCALE_MAX_WORKERS"
SCALE_GRACE_ENV = "PETMODEL_SCALE_GRACE_S"


@dataclass(frozen=True)
class ScalingConfig:
    """How launches may grow a cluster that can scale (:mod:`petmodel.cluster.scaling`).

    A launch that needs more free workers than the cluster has asks it for them, up to
    ``max_workers`` in all, and waits up to ``join_timeout_s`` for them to join; a worker that no
    run holds for ``grace_s`` is released again (never below the size the user chose).
    """

    max_workers: int = 8
    grace_s: float = 60.0  # long enough that back-to-back runs (a sweep) keep their workers
    join_timeout_s: float = 180.0  # a cloud worker can take minutes to be scheduled and start

    def __post_init__(self) -> None:
        require_whole("The most workers a launch may grow the cluster to", self.max_workers, maximum=10_000)
        for what, value in (("The scaling grace period", self.grace_s), ("The worker join timeout", self.join_timeout_s)):
            if not (_is_number(value) and value >= 0 and math.isfinite(value)):
                raise UsageError(f"{what} must be a number of seconds ≥ 0, not {value!r}.")

    @classmethod
    def from_env(cls, **changes: Any) -> ScalingConfig:
        """The defaults, with ``$PETMODEL_SCALE_MAX_WORKERS`` and ``$PETMODEL_SCALE_GRACE_S`` on top, then ``changes``."""
        base = cls()
        values = {"max_workers": env_number(SCALE_MAX_WORKERS_ENV, base.max_workers, kind=int, minimum=1,
                                            unit="workers"),
                  "grace_s": env_number(SCALE_GRACE_ENV, base.grace_s, minimum=0, unit="seconds")}
        return cls(**{**values, **{k: v for k, v in changes.items() if v is not None}})


_BUILDING_DEFAULTS = contextvars.ContextVar("petmodel_building_defaults", default=False)


@contextlib.contextmanager
def building_defaults() -> Iterator[None]:
    """Build import-time default specs without reading ``$PETMODEL_MAX_MODEL_GB``.

    Defaults are built when a module is imported. A bad value in that variable must fail the
    command or form that builds a spec, in one sentence, not every ``import petmodel.config``
    with a traceback; the defaults themselves fit any sensible limit.
    """
    token = _BUILDING_DEFAULTS.set(True)
    try:
        yield
    finally:
        _BUILDING_DEFAULTS.reset(token)


with building_defaults():
    DEFAULT_SPEC = RunSpec()
    """The default run: every default of the CLI, the app's Train form and the studies comes from here."""


# --------------------------------------------------------------------------- lists of numbers
def as_number_list(values: Any, what: str, kind: type) -> list:
    """``values`` (one number or an iterable) as a list of unique ``kind`` numbers, order kept.

    Whole numbers must be ≥ 1, other numbers finite; each config checks its own range.
    """
    if values is None:
        return []
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        values = [values]
    out = []
    for v in values:
        if kind is int:
            if isinstance(v, bool) or not isinstance(v, int) and not (isinstance(v, float) and v.is_integer()):
                raise UsageError(f"{what} must be whole numbers, not {v!r}.")
            v = int(v)
            if v < 1:
                raise UsageError(f"{what} must be ≥ 1, not {v}.")
        else:
            try:
                v = float(v)
            except (TypeError, ValueError):
                raise UsageError(f"{what} must be numbers, not {v!r}.") from None
            if not math.isfinite(v):
                raise UsageError(f"{what} must be finite numbers, not {v!r}.")
        out.append(v)
    return list(dict.fromkeys(out))


def parse_list(text: str, what: str, kind: type) -> list:
    """Numbers a user typed separated by commas (a CLI flag, a form field), checked like a config's lists.

    Whole numbers must be ≥ 1; other numbers finite and not negative (each config checks its own range).
    """
    parts = [p for p in str(text).replace(" ", "").split(",") if p]
    if not parts:
        raise UsageError(f"Give at least one value for {what.lower()}.")
    try:
        values = [kind(p) for p in parts]
    except ValueError:
        plural = "whole numbers" if kind is int else "numbers"
        raise UsageError(f"{what} must be {plural} separated by commas, not {text!r}.") from None
    if kind is float and any(v < 0 for v in values):
        raise UsageError(f"{what} must not be negative, not {text!r}.")
    return as_number_list(values, what, kind)


def format_list(values: Iterable[Any]) -> str:
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: "1 worker", "2 workers", "3 idle workers".

    How every message and label counts workers (and hosts), so none says "1 workers"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
