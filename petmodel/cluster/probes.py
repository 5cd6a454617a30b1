"""Probes run on the scheduler and the workers *before* they are known to have our code.

This module imports only the standard library and is registered with cloudpickle to travel by
value (:func:`ship_by_value`), so a scheduler or worker without ``petmodel`` can still run it:
it reports package versions (:func:`probe_versions`) and which ``petmodel`` it would import
(:func:`code_state`). The content hash (:func:`tree_hash`) is computed the same way on both sides.
"""

from __future__ import annotations

import hashlib
import os
import platform
import socket
import sys
import zipfile
from importlib import metadata
from typing import Any

PACKAGE = "petmodel"
HASH_FILE = "CODE_HASH"  # written into the shipped zip: the hash of the tree it was built from
VERSIONED = ("torch", "dask", "distributed", "dask-pytorch-ddp")


def ship_by_value() -> None:
    """Make Dask send this module's functions by value (cloudpickle), not as an import by name."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def tree_files(root: str) -> list[tuple[str, str]]:
    """``(path relative to the package's parent, absolute path)`` of every file of the package at
    ``root``, sorted; byte-code caches are left out (they differ per interpreter, not per code)."""
    parent = os.path.dirname(root.rstrip(os.sep))
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in filenames:
            if name.endswith((".pyc", ".pyo")) or name == HASH_FILE:
                continue
            full = os.path.join(dirpath, name)
            out.append((os.path.relpath(full, parent).replace(os.sep, "/"), full))
    return sorted(out)


def tree_hash(root: str) -> str:
    """Content hash of the package directory ``root``: names and bytes of every file."""
    digest = hashlib.sha256()
    for rel, full in tree_files(root):
        with open(full, "rb") as f:
            data = f.read()
        digest.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return digest.hexdigest()[:16]


def _origin_hash(origin: str) -> str | None:
    """Hash of the package whose ``__init__.py`` is ``origin``: from a shipped zip or a directory."""
    marker = f"{os.sep}{PACKAGE}{os.sep}__init__.py"
    if ".zip" in origin:
        archive = origin[: origin.index(".zip") + 4]
        try:
            with zipfile.ZipFile(archive) as z:
                return z.read(f"{PACKAGE}/{HASH_FILE}").decode().strip()
        except (OSError, KeyError, zipfile.BadZipFile):
            return None
    if origin.endswith(marker) or origin.endswith(f"{PACKAGE}/__init__.py"):
        return tree_hash(os.path.dirname(origin))
    return None


def code_state(expected: str | None = None) -> dict[str, Any]:
    """Which ``petmodel`` this process imports, and its hash; drops stale submodules first.

    A re-uploaded zip makes Dask reload the top-level package only; submodules imported from
    the old code would stay in ``sys.modules``. Any ``petmodel.*`` module not loaded from where
    ``petmodel`` now comes from is dropped, so the next import takes the new code.
    """
    import importlib

    importlib.invalidate_caches()
    if expected:  # a zip shipped earlier and shipped again stays behind newer ones on sys.path: move it up
        wanted = [p for p in sys.path if os.path.basename(p) == f"{PACKAGE}-{expected}.zip"]
        if wanted:
            sys.path.remove(wanted[0])
            sys.path.insert(0, wanted[0])
            loaded = sys.modules.get(PACKAGE)
            if loaded is not None and _origin_hash(getattr(loaded, "__file__", "") or "") != expected:
                importlib.reload(loaded)
    try:
        pkg = importlib.import_module(PACKAGE)
    except Exception as err:  # noqa: BLE001 - reported, not raised: the client words the error
        return {"host": socket.gethostname(), "hash": None, "origin": None, "error": repr(err), "dropped": 0}
    origin = getattr(pkg, "__file__", None) or ""
    root = os.path.dirname(origin)
    dropped = 0
    for name, mod in list(sys.modules.items()):
        if name.startswith(PACKAGE + ".") and mod is not None:
            where = getattr(mod, "__file__", None) or ""
            if where and not where.startswith(root + os.sep):
                del sys.modules[name]
                dropped += 1
    found = _origin_hash(origin)
    return {"host": socket.gethostname(), "hash": found, "origin": origin, "error": None, "dropped": dropped,
            "matches": expected is None or found == expected}


def registered_zip(name: str, dask_scheduler: Any = None) -> str | None:
    """Runs on the scheduler: the file name of the zip its worker plugin ``name`` hands to new workers."""
    import pickle

    blob = (dask_scheduler.worker_plugins if dask_scheduler is not None else {}).get(name)
    if blob is None:
        return None
    try:
        return getattr(pickle.loads(blob), "filename", None)
    except Exception:  # noqa: BLE001 - not ours, or not readable: treat as someone else's
        return "?"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def probe_versions() -> dict[str, Any]:
    """Python and the packages a run needs, as installed in this process's environment."""
    out: dict[str, Any] = {"host": socket.gethostname(), "python": platform.python_version()}
    for dist in VERSIONED:
        out[dist] = _version(dist)
    return out
