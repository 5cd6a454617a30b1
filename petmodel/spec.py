"""What defines a training run, validated in one place for the CLI, the app and the studies."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from petmodel.errors import UsageError
from petmodel.model import ModelConfig
from petmodel.train import TrainConfig

WANDB_MODES = ("disabled", "offline", "online")


@dataclass(frozen=True)
class RunSpec:
    """A training run: model shape, optimisation, where it runs and how it is tracked.

    ``workers`` 0 trains in this process; N ≥ 1 trains with DDP on N Dask workers.
    """

    train: TrainConfig = field(default_factory=TrainConfig)
    embed: int = 32
    hidden: int = 256
    layers: int = 1
    dropout: float = 0.3
    data: str | None = None
    workers: int = 0
    name: str | None = None
    wandb_mode: str = "disabled"
    wandb_project: str = "petnames"

    def __post_init__(self) -> None:
        if not isinstance(self.workers, int) or self.workers < 0:
            raise UsageError(f"Workers must be a whole number ≥ 1, not {self.workers!r}.")
        if self.wandb_mode not in WANDB_MODES:
            raise UsageError(f"W&B mode must be one of {', '.join(WANDB_MODES)}, not {self.wandb_mode!r}.")
        self.model_config(30)  # validates the model fields

    def model_config(self, vocab_size: int) -> ModelConfig:
        return ModelConfig(vocab_size=vocab_size, embed=self.embed, hidden=self.hidden,
                           layers=self.layers, dropout=self.dropout)

    @property
    def global_batch(self) -> int:
        return self.train.batch_size * max(1, self.workers)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["global_batch"] = self.global_batch
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunSpec":
        d = dict(d)
        d.pop("global_batch", None)
        train = TrainConfig(**d.pop("train", {}))
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(train=train, **known)

    def with_(self, **changes: Any) -> "RunSpec":
        """A copy with top-level or training fields changed (``lr=…`` goes to ``train``)."""
        train_fields = {k: changes.pop(k) for k in list(changes) if k in TrainConfig.__dataclass_fields__}
        spec = replace(self, **changes)
        return replace(spec, train=replace(spec.train, **train_fields)) if train_fields else spec
