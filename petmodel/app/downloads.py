"""A trained model as one download: its checkpoint and its settings and results, in a zip.

The checkpoint (``RUN_ID.pt``) is what ``python -m petmodel generate --model RUN_ID.pt`` and
``evaluate`` read; it already holds the run's spec and validation NLL in its metadata, but only
torch can read that, so ``RUN_ID.json`` beside it says the same in plain text: the run's name,
settings, best validation NLL, training time and data. The app offers the download to visitors
(Generate is open to them), so every server path in the copy is cut to its file name, in the
checkpoint's metadata too; the model file in the store is never changed.
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

from petmodel.app.tables import without_paths
from petmodel.errors import PetmodelError
from petmodel.store import RunStore

USAGE = "python -m petmodel generate --model {file} -n 20"


def model_file_name(run_id: str) -> str:
    """The download's file name."""
    return f"petmodel-{run_id}.zip"


def _scrubbed(value: Any) -> Any:
    """``value`` with every absolute path in its strings cut to the last part (dicts and lists too)."""
    if isinstance(value, str):
        return without_paths(value)
    if isinstance(value, dict):
        return {k: _scrubbed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrubbed(v) for v in value]
    return value


def _checkpoint_copy(path: Any) -> bytes:
    """The checkpoint's bytes, its metadata without server paths (loaded and saved as a checkpoint)."""
    import torch

    from petmodel.checkpoint import FORMAT, safe_load

    payload = safe_load(path, what="The model file of this run", kind="petmodel checkpoint",
                        damaged="The model file of this run is damaged; retrain it.")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise PetmodelError("The model file of this run is not a petmodel checkpoint; retrain it.")
    payload["meta"] = _scrubbed(payload.get("meta") or {})
    out = io.BytesIO()
    torch.save(payload, out)
    return out.getvalue()


def run_settings(store: RunStore, run_id: str) -> dict[str, Any]:
    """What the JSON beside the checkpoint says: the run's settings and results, without server paths."""
    from petmodel.analysis import run_data_label

    run = store.get_run(run_id)
    if run is None:
        raise PetmodelError(f"There is no run {run_id} in the store.")
    return _scrubbed({
        "run_id": run.id, "name": run.name, "status": run.status, "created": run.created, "finished": run.finished,
        "best_val_nll": run.best_val_nll if run.best_val_nll is not None else run.val_nll,
        "nll_unit": "nats per character, on the held-out validation names", "train_seconds": run.train_seconds,
        "samples": run.samples, "workers": len(run.workers), "data": run_data_label(run), "config": run.config,
        "checkpoint": f"{run.id}.pt", "usage": USAGE.format(file=f"{run.id}.pt")})


def model_bundle(store: RunStore, run_id: str) -> bytes:
    """The zip of ``run_id``'s model: ``RUN_ID.pt`` and ``RUN_ID.json``; PetmodelError when it has none."""
    settings = run_settings(store, run_id)
    checkpoint = _checkpoint_copy(store.resolve_model(run_id))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        bundle.writestr(f"{run_id}.pt", checkpoint)
        bundle.writestr(f"{run_id}.json", json.dumps(settings, indent=2, default=str) + "\n")
    return out.getvalue()
