"""Ship the exact ``petmodel`` code this client runs to a remote scheduler and its workers.

The scheduler unpickles task graphs that name our functions, and workers run them, so both need
``petmodel`` importable. We zip the package this process imports, write its content hash into
the zip, and register it with Dask's own ``SchedulerUploadFile`` / ``UploadFile`` plugins under
one fixed name: a worker that joins later gets the zip too, and a new upload *replaces* the old
plugin rather than piling up zips. Nothing is shipped when every process already imports code
with the same hash (a local cluster, or a cluster with our package installed).

After an upload, :func:`verify` runs :func:`~petmodel.cluster.probes.code_state` everywhere: it drops
submodules left over from older code (Dask reloads only the top-level package) and reports the
hash each process now imports; a process on other code is refused naming it.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from distributed import Client
from distributed.diagnostics.plugin import SchedulerUploadFile, UploadFile

import petmodel
from petmodel.cluster.client import PetmodelClient
from petmodel.cluster.calls import on_scheduler, require_answers, run_each
from petmodel.cluster.probes import HASH_FILE, PACKAGE, code_state, registered_zip, ship_by_value, tree_files, tree_hash
from petmodel.errors import PetmodelError, SchedulerSilent, WorkerCallFailed, WorkerSilent

PLUGIN_NAME = "petmodel-code"


@dataclass(frozen=True)
class CodeBundle:
    """The zip of this process's ``petmodel`` and the hash of what it contains."""

    path: Path
    code_hash: str


def package_root() -> str:
    """Directory of the ``petmodel`` package this process imports."""
    return os.path.dirname(os.path.abspath(petmodel.__file__))


@functools.lru_cache(maxsize=4)
def _bundle_for(root: str, code_hash: str) -> CodeBundle:
    folder = Path(tempfile.mkdtemp(prefix="petmodel-code-"))
    atexit.register(shutil.rmtree, folder, True)  # the plugins carry the bytes; the file is only for them
    # A name per version: Dask's loader puts each new zip first on sys.path, and code_state can tell
    # submodules loaded from an older zip by their path.
    path = folder / f"{PACKAGE}-{code_hash}.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for rel, full in tree_files(root):
            z.write(full, rel)
        z.writestr(f"{PACKAGE}/{HASH_FILE}", code_hash + "\n")
    return CodeBundle(path, code_hash)


def current_bundle() -> CodeBundle:
    """The zip of the code as it is on disk now (rebuilt when any file changed)."""
    root = package_root()
    return _bundle_for(root, tree_hash(root))


def code_hash() -> str:
    """Content hash of the ``petmodel`` this process imports (what the Cluster page shows)."""
    return tree_hash(package_root())


def _register(client: Client, bundle: CodeBundle, timeout: float) -> None:
    # ``Client.register_plugin`` (public) cannot be bounded: it waits for every worker, so one
    # frozen worker hangs it. Its two coroutines (private: petmodel.compat), awaited under
    # a bound (compat.sync_within), can be.
    from petmodel.compat import register_scheduler_plugin, register_worker_plugin, sync_within

    async def both() -> None:
        await asyncio.gather(
            register_scheduler_plugin(client, SchedulerUploadFile(str(bundle.path)), name=PLUGIN_NAME),
            register_worker_plugin(client, UploadFile(str(bundle.path)), name=PLUGIN_NAME))

    try:
        sync_within(client, both, timeout=timeout)
    except (OSError, asyncio.TimeoutError) as err:
        raise PetmodelError(f"Shipping petmodel to the cluster took longer than {timeout:g} s (a worker may be "
                            "frozen); check the workers on the Cluster page and connect again.") from err


def verify(client: Client, workers: Iterable[str], *, timeout: float, include_scheduler: bool = True,
           expected: str | None = None) -> dict[str, dict]:
    """Each process's code state; PetmodelError naming the first one not on ``expected``'s code."""
    ship_by_value()
    expected = expected or current_bundle().code_hash
    workers = list(workers)
    states: dict[str, dict] = {}
    if include_scheduler:
        states["scheduler"] = on_scheduler(client, code_state, timeout=timeout, expected=expected)
    answers = run_each(client, code_state, workers, timeout=timeout, expected=expected)
    require_answers(answers, timeout, "checking its petmodel code")
    states.update(answers)
    for where, state in states.items():
        if state.get("hash") != expected:
            name = "The scheduler" if where == "scheduler" else f"Worker {where}"
            found = state.get("hash") or state.get("error") or "no petmodel"
            raise PetmodelError(f"{name} on {state.get('host')} runs petmodel {found}, not this client's "
                                f"{expected}; connect again to ship the code.")
    return states


def ship(client: Client, workers: Iterable[str], *, timeout: float) -> str:
    """Make this client's ``petmodel`` the one the scheduler and ``workers`` import; its hash.

    Uploads only when some process imports other code (or none), then verifies every process.
    """
    ship_by_value()
    bundle = current_bundle()
    workers = list(workers)
    try:
        verify(client, workers, timeout=timeout, expected=bundle.code_hash)
        # Everyone runs our code; still upload when workers joining later would get other code.
        later = on_scheduler(client, registered_zip, timeout=timeout, name=PLUGIN_NAME)
        if later in (None, bundle.path.name):
            return bundle.code_hash
    except (WorkerSilent, WorkerCallFailed, SchedulerSilent):
        raise  # a frozen or broken worker (or scheduler): shipping would only hang on it
    except PetmodelError:
        pass  # some process runs other code (or none): ship it
    _register(client, bundle, timeout)
    verify(client, workers, timeout=timeout, expected=bundle.code_hash)
    return bundle.code_hash


def verify_shipped(client: Client, workers: Iterable[str], *, timeout: float) -> None:
    """When code was shipped at connect, check ``workers`` (some may have joined since) run it."""
    shipped = client.petmodel_code_hash if isinstance(client, PetmodelClient) else None
    if shipped:
        verify(client, workers, timeout=timeout, include_scheduler=False, expected=shipped)
