"""What the Streamlit app shares across sessions, and the app's non-UI helpers.

The app keeps one :class:`AppBackend` per store folder for the whole server process
(``st.cache_resource`` in ``pages/_ui.py``): the :class:`~petmodel.store.RunStore`, the
current Dask client (none until the user connects or starts the embedded local cluster,
which also happens on demand when a run is launched without one) and the handles of runs
this process launched. A run's state lives in the store and in its handle here, not in a
browser session, so a run survives page reloads and closed tabs.

Nothing here imports Streamlit; every expected failure is a
:class:`~petmodel.errors.PetmodelError` whose message is one sentence for the user.
"""

from __future__ import annotations

import atexit
import math
import os
import re
import secrets
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from petmodel.data import DEFAULT_ALPHABET
from petmodel.errors import PetmodelError, UsageError
from petmodel.store import FINISHED_STATUSES, RunRecord, RunStore, default_store_dir

if TYPE_CHECKING:
    from distributed import Client

    from petmodel.checkpoint import Checkpoint
    from petmodel.data import NameCorpus
    from petmodel.dist.launch import RunHandle
    from petmodel.generate import Generated
    from petmodel.config import RunSpec

__all__ = [
    "AppBackend",
    "GenerateSettings",
    "N_MAX",
    "RUN_ID_PATTERN",
    "TEMPERATURE_RANGE",
    "default_data_path",
    "is_run_id",
    "parse_generate_params",
    "shutdown_all",
]

RUN_ID_PATTERN = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{4}$")
TEMPERATURE_RANGE = (0.1, 2.0)
N_MAX = 1000  # the app's cap; the library allows far more
PREFIX_MAX = 16
SEED_MAX = 2**31 - 1
SUMMARY_TTL_S = 2.0
SUMMARY_TIMEOUT_S = 3.0

_backends: weakref.WeakSet[AppBackend] = weakref.WeakSet()
_backends_lock = threading.Lock()


def is_run_id(value: Any) -> bool:
    """True for a string shaped like a run id (``YYYYMMDD-HHMMSS-xxxx``) and nothing else."""
    return isinstance(value, str) and RUN_ID_PATTERN.fullmatch(value) is not None


def default_data_path() -> str | None:
    """The app's default training data: ``$PETMODEL_DATA``, else None (download the official export)."""
    value = os.environ.get("PETMODEL_DATA", "").strip()
    return value or None


WARMUP_TIMEOUT_S = 45.0


def _warmup_corpus(n_workers: int) -> NameCorpus:
    """A few hundred made-up names: enough for a throwaway two-step run on ``n_workers`` ranks."""
    from itertools import product

    from petmodel.data import build_corpus

    syllables = ["ba", "bo", "ki", "lu", "ma", "mo", "na", "pi", "ro", "su", "ti", "zu"]
    names = ["".join(p) for p in product(syllables, repeat=3)][: max(400, 40 * n_workers)]
    return build_corpus(names, source="warm-up")


def _warm_worker() -> bool:
    """Runs on each worker: import what a DDP rank needs, so the first run starts quickly."""
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    try:
        import dask_pytorch_ddp.dispatch  # noqa: F401
    except ImportError:
        pass
    import petmodel.dist.launch  # noqa: F401
    import petmodel.train  # noqa: F401

    return True


# --------------------------------------------------------------------------- the shared backend
class AppBackend:
    """The run store, the Dask client and the runs this process drives; safe to share across threads."""

    def __init__(self, store_root: str | os.PathLike[str] | None = None) -> None:
        self.store = RunStore(store_root or default_store_dir())
        try:
            self.store.reconcile_orphans()  # runs whose app process died show as failed, not running
        except PetmodelError:
            pass
        self._lock = threading.RLock()
        self._client: Client | None = None
        self._kind: str | None = None  # "local" (we own the cluster) or "remote"
        self._address: str | None = None
        self._handles: dict[str, RunHandle] = {}
        self._corpora: dict[tuple[str | None, float | None], NameCorpus] = {}
        self._corpus_lock = threading.Lock()
        self._checkpoints: OrderedDict[tuple[str, float], Checkpoint] = OrderedDict()
        self._summary: tuple[float, dict[str, Any]] | None = None
        self._warm_thread: threading.Thread | None = None
        with _backends_lock:
            _backends.add(self)

    def __repr__(self) -> str:
        return f"AppBackend(store={str(self.store.root)!r}, cluster={self._kind or 'none'})"

    # ---- cluster -------------------------------------------------------------------------------
    @property
    def client(self) -> Client | None:
        return self._client

    @property
    def kind(self) -> str | None:
        """"local" for the embedded cluster this app owns, "remote" for a connected scheduler, else None."""
        return self._kind

    @property
    def connected(self) -> bool:
        return self._client is not None

    def start_local(self, n_workers: int | None = None, threads: int | None = None) -> dict[str, Any]:
        """Start the embedded local cluster (worker processes on this machine); returns summary()."""
        from petmodel.dist.cluster import start_local_cluster

        with self._lock:
            if self._client is not None:
                raise PetmodelError(
                    f"Already using {'the local cluster' if self._kind == 'local' else self._address}; "
                    "stop or disconnect it first.")
            client = start_local_cluster(n_workers, threads)
            self._client, self._kind, self._address = client, "local", client.scheduler.address
            self._summary = None
        self._warm_async(client)
        return self.summary()

    def connect(self, address: str, timeout: float = 10.0) -> dict[str, Any]:
        """Connect to a running scheduler (tcp://host:port or a scheduler file); returns summary()."""
        from petmodel.dist.cluster import connect

        if not isinstance(address, str) or not address.strip():
            raise UsageError("Enter a scheduler address such as tcp://10.0.0.5:8786.")
        with self._lock:
            if self._client is not None:
                raise PetmodelError(
                    f"Already using {'the local cluster' if self._kind == 'local' else self._address}; "
                    "stop or disconnect it first.")
            client = connect(address.strip(), timeout=timeout)
            self._client, self._kind, self._address = client, "remote", client.scheduler.address
            self._summary = None
        self._warm_async(client)
        return self.summary()

    def disconnect(self, *, wait_s: float = 20.0) -> None:
        """Cancel this process's active runs, then close the client (and the local cluster it owns)."""
        from petmodel.dist.cluster import shutdown

        with self._lock:
            client, self._client, self._kind, self._address = self._client, None, None, None
            self._summary = None
        if client is None:
            return
        self.wait_warm(wait_s)
        active = [h for h in self._all_handles() if not h.done() and h.client is client]
        for handle in active:
            handle.cancel(reason="Cancelled: the cluster was stopped or disconnected.")
        deadline = time.monotonic() + wait_s
        for handle in active:
            try:
                handle.wait(timeout=max(0.1, deadline - time.monotonic()))
            except PetmodelError:
                pass
        shutdown(client)

    def close(self) -> None:
        """Stop everything this backend started (for tests and server shutdown); never raises."""
        try:
            self.disconnect(wait_s=10.0)
        except Exception:  # noqa: BLE001 - teardown must not raise
            pass

    def _warm_async(self, client: Client) -> None:
        """Get the cluster ready for a fast first run, in the background.

        The first DDP run on fresh workers spends about 3 s on one-time work (process-group
        setup, the first collective and backward pass); a throwaway two-step run on every
        worker, into a scratch store, pays it now instead of delaying the user's first loss
        point. The default data is loaded here too. Launching waits for this to finish.
        """

        def warm() -> None:
            try:
                client.run(_warm_worker, on_error="return")
            except Exception:  # a worker without petmodel will fail its run with a clear error later
                pass
            self._warm_ddp(client)
            data = default_data_path()
            if data:
                try:
                    self.corpus(data)
                except PetmodelError:
                    pass

        thread = threading.Thread(target=warm, name="petmodel-app-warm", daemon=True)
        self._warm_thread = thread
        thread.start()

    def _warm_ddp(self, client: Client) -> None:
        import shutil
        import tempfile

        from petmodel.dist.launch import launch_run
        from petmodel.config import RunSpec
        from petmodel.config import TrainConfig

        scratch = tempfile.mkdtemp(prefix="petmodel-warmup-")
        try:
            n = len(client.scheduler_info(n_workers=-1).get("workers", {}))
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

    def wait_warm(self, timeout: float = WARMUP_TIMEOUT_S) -> None:
        """Block until the background warm-up (if any) is over, at most ``timeout`` seconds."""
        thread = self._warm_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def summary(self) -> dict[str, Any]:
        """Cluster status at a glance; never raises (a vanished scheduler gives connected False + error)."""
        blank = {"connected": False, "kind": None, "scheduler": None, "workers": 0, "threads": 0, "gpus": 0,
                 "dashboard": None, "error": None}
        client, kind = self._client, self._kind
        if client is None:
            return blank
        cached = self._summary
        if cached is not None and time.monotonic() - cached[0] < SUMMARY_TTL_S:
            return dict(cached[1])
        from petmodel.dist.cluster import dashboard_link
        from petmodel.dist.workers import describe_workers

        try:
            workers = describe_workers(client, timeout=SUMMARY_TIMEOUT_S)
            out = {"connected": True, "kind": kind, "scheduler": self._address, "workers": len(workers),
                   "threads": sum(w.nthreads for w in workers), "gpus": sum(w.gpu_count for w in workers),
                   "dashboard": dashboard_link(client), "error": None}
        except PetmodelError as err:
            out = {**blank, "kind": kind, "scheduler": self._address, "error": str(err)}
        except Exception as err:  # noqa: BLE001 - the status line must never take a page down
            out = {**blank, "kind": kind, "scheduler": self._address,
                   "error": f"The Dask scheduler at {self._address} stopped answering ({type(err).__name__}); "
                            "reconnect or restart the cluster."}
        self._summary = (time.monotonic(), out)
        return dict(out)

    def workers(self) -> list[dict[str, Any]]:
        """The cluster's workers as table rows (empty when not connected); PetmodelError if unreachable."""
        client = self._client
        if client is None:
            return []
        from petmodel.dist.workers import describe_workers

        try:
            infos = describe_workers(client, timeout=SUMMARY_TIMEOUT_S)
        except PetmodelError:
            raise
        except Exception as err:  # noqa: BLE001
            raise PetmodelError(f"Could not list the workers ({type(err).__name__}); reconnect or restart "
                                "the cluster.") from err
        from petmodel.dist.registry import busy_workers

        busy = busy_workers()
        return [{"address": w.address, "host": w.host, "threads": w.nthreads,
                 "memory_gib": round(w.memory_limit / 2**30, 1) if w.memory_limit else None,
                 "gpu": f"{w.gpu_count} × {w.gpu_name}" if w.gpu_count else "none",
                 "busy": w.address in busy} for w in infos]

    # ---- data and runs -------------------------------------------------------------------------
    def corpus(self, source: str | None) -> NameCorpus:
        """The cleaned, split names of ``source`` (None: the official export), loaded once per file version."""
        from petmodel.data import load_corpus

        mtime = None
        if source:
            try:
                mtime = Path(source).expanduser().stat().st_mtime
            except OSError:
                mtime = None
        key = (source, mtime)
        with self._corpus_lock:
            cached = self._corpora.get(key)
            if cached is None:
                cached = load_corpus(source)
                self._corpora = {key: cached}  # keep one: corpora are a few MB each
            return cached

    def ensure_cluster(self, n_workers: int, threads: int = 1) -> Client:
        """The current client, starting the embedded local cluster with ``n_workers`` if there is none."""
        with self._lock:
            if self._client is None:
                self.start_local(max(1, n_workers), max(1, threads))
            assert self._client is not None
            return self._client

    def launch(self, spec: RunSpec, *, threads_per_worker: int = 1) -> str:
        """Start ``spec`` on ``spec.workers`` workers in the background; returns the run id.

        Starts the embedded local cluster first when none is connected. Raises PetmodelError
        (or UsageError) before anything runs when the request is impossible.
        """
        from petmodel.dist.launch import launch_run

        if spec.workers < 1:
            spec = spec.with_(workers=1)
        corpus = self.corpus(spec.data)  # before the cluster: a bad data path fails fast
        client = self.ensure_cluster(spec.workers, threads_per_worker)
        self.wait_warm()  # the warm-up run holds the workers for a few seconds after a cluster starts
        handle = launch_run(client, spec, self.store, corpus=corpus)
        with self._lock:
            self._handles[handle.run_id] = handle
            self._summary = None
        return handle.run_id

    def wait_for_metrics(self, run_id: str, timeout: float = 1.5) -> bool:
        """Wait (briefly) until ``run_id`` has a training metric in the store; True if it has one."""
        deadline = time.monotonic() + timeout
        while True:
            if self.store.metrics(run_id, kind="train")[:1]:
                return True
            handle = self.handle(run_id)
            if time.monotonic() >= deadline or (handle is not None and handle.done()):
                return False
            time.sleep(0.05)

    def _all_handles(self) -> list[RunHandle]:
        with self._lock:
            return list(self._handles.values())

    def handle(self, run_id: str) -> RunHandle | None:
        """The live handle of a run this process launched (None for other runs)."""
        from petmodel.dist.registry import get_run as get_handle

        with self._lock:
            found = self._handles.get(run_id)
        return found or get_handle(run_id)

    def is_active(self, run_id: str) -> bool:
        handle = self.handle(run_id)
        return handle is not None and not handle.done()

    def active_runs(self) -> list[str]:
        return [h.run_id for h in self._all_handles() if not h.done()]

    def cancel(self, run_id: str) -> bool:
        """Ask a running run to stop; False when this process does not drive it (or it already ended)."""
        handle = self.handle(run_id)
        if handle is None or handle.done():
            return False
        handle.cancel()
        return True

    def rank_states(self, run_id: str) -> dict[int, str]:
        """Each rank's task state as this process sees it: starting/training/done/failed/cancelled."""
        handle = self.handle(run_id)
        if handle is None:
            return {}
        states = {}
        for rank, future in enumerate(list(getattr(handle, "_futures", []))):
            status = getattr(future, "status", "pending")
            states[rank] = {"pending": "training", "finished": "done", "error": "failed",
                            "cancelled": "cancelled", "lost": "lost"}.get(status, str(status))
        return states

    def metrics_frame(self, run_ids: Sequence[str]) -> Any:
        """Metrics of ``run_ids`` as one frame (see :func:`metrics_frame`)."""
        return metrics_frame(self.store, run_ids)

    def run_or_none(self, run_id: Any) -> RunRecord | None:
        """The store's record of ``run_id``, or None when the value is not a run id or unknown."""
        if not is_run_id(run_id):
            return None
        try:
            return self.store.get_run(run_id)
        except PetmodelError:
            return None

    # ---- models and names ----------------------------------------------------------------------
    def models(self) -> list[RunRecord]:
        """Completed runs whose model file exists, best validation NLL first."""
        return available_models(self.store)

    def checkpoint(self, run_id: str) -> Checkpoint:
        """Load (once per file version) the checkpoint of a run in the store; never a path from outside."""
        from petmodel.checkpoint import load_checkpoint

        if not is_run_id(run_id):
            raise UsageError("Pick a model from the list of trained runs.")
        run = self.store.get_run(run_id)
        if run is None:
            raise PetmodelError(f"There is no run {run_id} in the store; pick another model.")
        path = self.store.resolve_model(run_id)
        key = (str(path), path.stat().st_mtime)
        with self._lock:
            ckpt = self._checkpoints.get(key)
            if ckpt is not None:
                self._checkpoints.move_to_end(key)
                return ckpt
        ckpt = load_checkpoint(path)
        with self._lock:
            self._checkpoints[key] = ckpt
            while len(self._checkpoints) > 4:
                self._checkpoints.popitem(last=False)
        return ckpt

    def generate(self, settings: GenerateSettings) -> Generated:
        """Names for ``settings`` (model, temperature, n, prefix, seed, new); same settings, same names."""
        from petmodel.generate import GenerateConfig, generate

        if settings.model is None:
            raise PetmodelError("There is no trained model yet; train one on the Train page.")
        ckpt = self.checkpoint(settings.model)
        config = GenerateConfig(n=settings.n, temperature=settings.temperature, prefix=settings.prefix,
                                seed=settings.seed, new_only=settings.new_only)
        return generate(ckpt, config)


def shutdown_all() -> None:
    """Close every backend of this process (their runs, clusters and clients); for tests and exit."""
    with _backends_lock:
        backends = list(_backends)
    for backend in backends:
        backend.close()


atexit.register(shutdown_all)  # the app server exits: cancel its runs and stop its local cluster


# --------------------------------------------------------------------------- metrics
def metrics_frame(store: RunStore, run_ids: Sequence[str]) -> Any:
    """All metric rows of ``run_ids`` as one pandas frame (``RunStore.metrics_frame``)."""
    return store.metrics_frame(run_ids)


# --------------------------------------------------------------------------- models in the store
def available_models(store: RunStore) -> list[RunRecord]:
    """Completed runs of ``store`` whose model file is still on disk, best validation NLL first."""
    out = []
    for run in store.list_runs(status="completed"):
        if run.model_path and _model_file(store, run.model_path).is_file():
            out.append(run)
    return sorted(out, key=lambda r: (_nll(r), -r.created))


def _nll(run: RunRecord) -> float:
    value = run.best_val_nll if run.best_val_nll is not None else run.val_nll
    return float(value) if value is not None and math.isfinite(value) else math.inf


def _model_file(store: RunStore, model_path: str) -> Path:
    path = Path(model_path).expanduser()
    return path if path.is_absolute() else store.root / path


# --------------------------------------------------------------------------- Generate's URL
@dataclass(frozen=True)
class GenerateSettings:
    """Everything that decides the names on the Generate page (and is mirrored in its URL)."""

    model: str | None = None
    temperature: float = 1.0
    n: int = 20
    prefix: str = ""
    seed: int | None = None
    new_only: bool = False

    def with_seed(self) -> GenerateSettings:
        """These settings with a seed: the given one, else a fresh random one."""
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
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


def _last(value: Any) -> Any:
    """st.query_params gives strings; AppTest and parse_qs give lists for repeated keys: take the last."""
    if isinstance(value, (list, tuple)):
        return value[-1] if value else ""
    return value


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "…"


def parse_generate_params(params: Mapping[str, Any], store: RunStore | None = None, *,
                          models: Sequence[RunRecord] | None = None) -> tuple[GenerateSettings, list[str]]:
    """Settings from URL query parameters, and one notice per value that was bad and replaced.

    Never raises. ``model`` must be the id of a completed run of ``store`` whose model file
    exists (a file path or anything else that is not a run id is ignored); without one the
    best model is used. ``temperature`` is clamped to 0.1–2.0, ``n`` to 1–1000; ``prefix``
    must use the model's alphabet; ``seed`` is a whole number 0–2³¹−1 (left None when absent
    or bad: the page then picks one and writes it into the URL); ``new`` is 1/0 or true/false.
    """
    notices: list[str] = []
    defaults = GenerateSettings()
    params = dict(params or {})

    # model
    if models is None and store is not None:
        try:
            models = available_models(store)
        except PetmodelError as err:
            notices.append(str(err))
            models = []
    ids = [m.id for m in models] if models is not None else None
    fallback = ids[0] if ids else None
    model: str | None = fallback
    raw = _last(params.get("model"))
    if raw not in (None, ""):
        raw = str(raw).strip()
        if not is_run_id(raw):
            notices.append("The model in the link is not a run id, so it was ignored"
                           + ("; showing the best model instead." if fallback else "."))
        elif ids is None or raw in ids:
            model = raw
        else:
            notices.append(_model_notice(store, raw) + (" Showing the best model instead." if fallback else ""))

    # temperature
    temperature = defaults.temperature
    raw = _last(params.get("temperature"))
    if raw not in (None, ""):
        try:
            value = float(str(raw).strip())
            if not math.isfinite(value):
                raise ValueError
        except ValueError:
            notices.append(f"Temperature {_short(raw)!r} is not a number; using {defaults.temperature:g}.")
        else:
            low, high = TEMPERATURE_RANGE
            clamped = min(high, max(low, value))
            if clamped != value:
                notices.append(f"Temperature {value:g} is outside {low:g}–{high:g}; using {clamped:g}.")
            temperature = round(clamped, 2)

    # n
    n = defaults.n
    raw = _last(params.get("n"))
    if raw not in (None, ""):
        text = str(raw).strip()
        if re.fullmatch(r"[+-]?\d{1,12}", text):
            value_n = int(text)
            clamped_n = min(N_MAX, max(1, value_n))
            if clamped_n != value_n:
                notices.append(f"Count {value_n:,} is outside 1–{N_MAX:,}; showing {clamped_n:,} names.")
            n = clamped_n
        else:
            notices.append(f"Count {_short(raw)!r} is not a whole number; showing {defaults.n}.")

    # prefix
    prefix = defaults.prefix
    raw = _last(params.get("prefix"))
    if raw not in (None, ""):
        text = " ".join(str(raw).lower().split())
        if len(text) > PREFIX_MAX:
            notices.append(f"The prefix is longer than {PREFIX_MAX} characters, so it was ignored.")
        elif any(ch not in DEFAULT_ALPHABET for ch in text):
            notices.append("The prefix may only use letters a–z, space, '.' and '-', so it was ignored.")
        else:
            prefix = text

    # seed
    seed: int | None = None
    raw = _last(params.get("seed"))
    if raw not in (None, ""):
        text = str(raw).strip()
        if re.fullmatch(r"\d{1,10}", text) and int(text) <= SEED_MAX:
            seed = int(text)
        else:
            notices.append(f"Seed {_short(raw)!r} is not a whole number from 0 to {SEED_MAX:,}; picked a new one.")

    # new
    new_only = defaults.new_only
    raw = _last(params.get("new"))
    if raw is not None:
        text = str(raw).strip().lower()
        if text in _TRUE:
            new_only = True
        elif text in _FALSE:
            new_only = False
        else:
            notices.append(f"'new' must be 1 or 0, not {_short(raw)!r}; showing all names.")

    return GenerateSettings(model=model, temperature=temperature, n=n, prefix=prefix, seed=seed,
                            new_only=new_only), notices


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
    if run.status != "completed" or not run.model_path:
        return f"Run {run_id} has no saved model (it {_status_phrase(run.status)})."
    return f"The model file of run {run_id} was deleted."


def _status_phrase(status: str) -> str:
    return {"failed": "failed", "cancelled": "was cancelled", "pruned": "was pruned", "running": "is still running",
            "queued": "has not started"}.get(status, f"is {status}")


# --------------------------------------------------------------------------- runs for the pages
TRAIN_FORM_DEFAULTS: dict[str, Any] = {
    "workers": 2, "batch_size": 128, "lr": 0.005, "epochs": 0, "max_seconds": 60.0, "embed": 32, "hidden": 256,
    "layers": 1, "dropout": 0.3, "seed": 0, "precision": "fp32", "wandb_mode": "disabled",
    "wandb_project": "petnames", "name": "", "data": "", "eval_every_seconds": 5.0,
}


def spec_from_form(values: Mapping[str, Any]) -> RunSpec:
    """The RunSpec of the Train form's values (UsageError, one sentence, when a value is impossible).

    Same meaning as ``python -m petmodel train``: ``epochs`` / ``max_seconds`` of 0 mean "no
    limit" (at least one is needed), an empty ``data`` means the app's default data
    ($PETMODEL_DATA, else the official export), an empty ``name`` no name.
    """
    from petmodel.config import RunSpec
    from petmodel.config import TrainConfig

    v = {**TRAIN_FORM_DEFAULTS, **dict(values)}

    def whole(name: str, label: str, low: int = 1) -> int:
        value = v[name]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UsageError(f"{label} must be a whole number of at least {low}, not {value!r}.")
        return value

    def number(name: str, label: str) -> float:
        try:
            value = float(v[name])
        except (TypeError, ValueError):
            raise UsageError(f"{label} must be a number, not {v[name]!r}.") from None
        if not math.isfinite(value):
            raise UsageError(f"{label} must be a finite number, not {v[name]!r}.")
        return value

    workers = whole("workers", "Workers")
    epochs = whole("epochs", "Epochs", low=0) or None
    max_seconds = number("max_seconds", "The time budget") or None
    if max_seconds is not None and max_seconds < 0:
        raise UsageError(f"The time budget must be a positive number of seconds, not {max_seconds:g}.")
    lr = number("lr", "Learning rate")
    if lr <= 0:
        raise UsageError(f"Learning rate must be a positive number up to 10, not {lr:g}.")
    dropout = number("dropout", "Dropout")
    if not 0 <= dropout < 1:
        raise UsageError(f"Dropout must be at least 0 and below 1, not {dropout:g}.")
    eval_every = number("eval_every_seconds", "The validation interval") or None
    if eval_every is not None and eval_every < 0:
        raise UsageError(f"The validation interval must be positive, not {eval_every:g}.")
    if v["precision"] not in ("fp32", "bf16"):
        raise UsageError(f"Precision must be fp32 or bf16, not {v['precision']!r}.")
    project = str(v["wandb_project"] or "").strip()
    if v["wandb_mode"] != "disabled" and not project:
        raise UsageError("Give a W&B project name, or set W&B to disabled.")
    train = TrainConfig(epochs=epochs, max_seconds=max_seconds, batch_size=whole("batch_size", "Batch per worker"),
                        lr=lr, seed=whole("seed", "Seed", low=0), precision=v["precision"],
                        eval_every_seconds=eval_every)
    data = str(v["data"] or "").strip() or default_data_path()
    if data and "://" not in data and not Path(data).expanduser().is_file():
        raise UsageError(f"There is no data file at {data}; give the path of a CSV or text file of names, "
                         "or leave it empty for the official data.")
    return RunSpec(train=train, embed=whole("embed", "Embedding size"), hidden=whole("hidden", "Hidden size"),
                   layers=whole("layers", "Layers"), dropout=dropout, data=data, workers=workers,
                   name=str(v["name"] or "").strip() or None, wandb_mode=v["wandb_mode"],
                   wandb_project=project or "petnames")


def rank_table(run: RunRecord, last_rows: Mapping[int, Mapping[str, Any]],
               states: Mapping[int, str] | None = None) -> list[dict[str, Any]]:
    """One row per rank: worker, state, last step, samples, last seen (s since start), loss.

    ``last_rows`` maps rank → its latest train metric row; ``states`` the task states the
    backend sees for runs this process drives (others are inferred from the run's status).
    """
    states = dict(states or {})
    n = max(len(run.workers), (max(last_rows) + 1) if last_rows else 0, 1)
    rows = []
    for rank in range(n):
        worker = run.workers[rank] if rank < len(run.workers) else None
        state = states.get(rank)
        if state is None:
            if run.status in FINISHED_STATUSES:
                state = {"completed": "done", "cancelled": "cancelled", "pruned": "stopped"}.get(run.status)
                if run.status == "failed":
                    state = "failed" if worker and worker == run.failed_worker else "stopped"
            else:
                state = "training"
        last = last_rows.get(rank) or {}
        if state == "training" and not last:
            state = "starting"
        rows.append({"rank": rank, "worker": worker or "—", "state": state, "step": last.get("step"),
                     "samples": last.get("samples"), "last_seen_s": last.get("elapsed"),
                     "loss": last.get("loss")})
    return rows
