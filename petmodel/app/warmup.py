"""Getting a fresh cluster ready for a fast first run, in the background.

The first DDP run on fresh workers pays one-time costs (imports, process-group set-up, the
first collective and backward pass). A throwaway two-step run on every worker, into a scratch
store, pays them right after the cluster starts instead of delaying the user's first loss
point. Tests switch it off (``PETMODEL_WARMUP=0``): it holds the workers for seconds.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING

from petmodel.settings import env_flag

if TYPE_CHECKING:
    from distributed import Client

    from petmodel.data import NameCorpus

WARMUP_ENV = "PETMODEL_WARMUP"
WARMUP_TIMEOUT_S = 45.0


def warmup_enabled() -> bool:
    """Whether a new cluster is warmed up: yes unless ``$PETMODEL_WARMUP`` is 0/false/no/off
    (:func:`~petmodel.settings.env_flag`: other text is a UsageError, not silently "on")."""
    return env_flag(WARMUP_ENV, True)


def warm_cluster(client: Client, then: Callable[[], None] | None = None) -> None:
    """Import what a rank needs on every worker, run a tiny DDP run, then call ``then``; never raises."""
    try:
        client.run(_warm_worker, on_error="return")
    except Exception:  # noqa: BLE001 - a worker without petmodel fails its run with a clear error later
        pass
    _warm_ddp(client)
    if then is not None:
        try:
            then()
        except Exception:  # noqa: BLE001 - warming is best effort
            pass


def _warm_worker() -> bool:
    """Runs on each worker: import what a DDP rank needs, so the first run starts quickly."""
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    try:
        import dask_pytorch_ddp.dispatch  # noqa: F401
    except ImportError:
        pass
    import petmodel.cluster.launch  # noqa: F401
    import petmodel.train  # noqa: F401

    return True


def _warmup_corpus(n_workers: int) -> NameCorpus:
    """A few hundred made-up names: enough for a throwaway two-step run on ``n_workers`` ranks."""
    from itertools import product

    from petmodel.data import build_corpus

    syllables = ["ba", "bo", "ki", "lu", "ma", "mo", "na", "pi", "ro", "su", "ti", "zu"]
    names = ["".join(p) for p in product(syllables, repeat=3)][: max(400, 40 * n_workers)]
    return build_corpus(names, source="warm-up")


def _warm_ddp(client: Client) -> None:
    """A two-step run of a tiny model on every worker, into a scratch store that is then deleted."""
    from petmodel.config import RunSpec, TrainConfig
    from petmodel.cluster.launch import launch_run
    from petmodel.cluster.workers import describe_workers
    from petmodel.store import RunStore

    scratch = tempfile.mkdtemp(prefix="petmodel-warmup-")
    try:
        n = len(describe_workers(client, probe_gpus=False))
        if n < 1:
            return
        corpus = _warmup_corpus(n)
        batch = max(1, min(8, len(corpus.train_names) // n))
        spec = RunSpec(train=TrainConfig(max_seconds=None, max_steps=2, batch_size=batch), embed=4, hidden=8,
                       dropout=0.0, workers=n, name="warm-up")
        handle = launch_run(client, spec, RunStore(scratch), corpus=corpus, kind="warmup")
        handle.wait(timeout=WARMUP_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - warming is best effort; a real run reports real problems
        pass
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
