"""Optional Weights & Biases tracking: disabled (default), offline or online.

Rank 0's metrics reach the client anyway (they stream there for the store and the app), so
the client logs them: credentials and the offline run folder live where the user is, not on
every worker. ``online`` without credentials fails *before* training starts.
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any

from petmodel.errors import PetmodelError
from petmodel.config import RunSpec


def has_wandb_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def check_tracking(spec: RunSpec) -> None:
    """Raise before any training when the chosen W&B mode cannot work."""
    if spec.wandb_mode == "disabled":
        return
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise PetmodelError("W&B tracking needs the wandb package; pip install wandb or use --wandb disabled.") from None
    if spec.wandb_mode == "online" and not has_wandb_credentials():
        raise PetmodelError(
            "W&B online mode needs credentials; run `wandb login` or set WANDB_API_KEY, or use --wandb offline."
        )


class Tracker:
    """Context manager around one W&B run; every method is a no-op when tracking is disabled."""

    def __init__(self, spec: RunSpec, run_id: str, store_root: str | os.PathLike) -> None:
        check_tracking(spec)
        self.spec, self.run_id, self.dir = spec, run_id, Path(store_root)
        self.run: Any = None

    def __enter__(self) -> "Tracker":
        if self.spec.wandb_mode != "disabled":
            import wandb

            self.dir.mkdir(parents=True, exist_ok=True)
            self.run = wandb.init(mode=self.spec.wandb_mode, project=self.spec.wandb_project, name=self.run_id,
                                  id=self.run_id, dir=str(self.dir), config=self.spec.to_dict(), reinit="create_new")
        return self

    def log(self, row: dict[str, Any]) -> None:
        if self.run is None or row.get("rank", 0) != 0:
            return
        data = {k: row[k] for k in ("loss", "samples_per_s", "val_nll", "epoch", "elapsed", "global_samples")
                if row.get(k) is not None}
        self.run.log(data, step=int(row.get("step", 0)))

    def finish(self, result: dict[str, Any], model_path: str | os.PathLike | None) -> None:
        if self.run is None:
            return
        import wandb

        self.run.summary.update({k: v for k, v in result.items() if isinstance(v, (int, float, str))})
        if model_path and Path(model_path).exists():
            art = wandb.Artifact(f"petnames-{self.run_id}", type="model", metadata=result)
            art.add_file(str(model_path), name="model.pt")
            self.run.log_artifact(art)

    @property
    def url(self) -> str | None:
        return getattr(self.run, "url", None) if self.run is not None else None

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if exc_type is None else 1)
            self.run = None
