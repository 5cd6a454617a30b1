"""Where the store lives and what its folder allows: the default location, read-only mounts, a full disk."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def default_store_dir() -> Path:
    """Where the store lives unless told otherwise: ``$PETMODEL_STORE`` or the user data dir.

    The environment variable exists so the app, the CLI and tests can agree on one store
    without passing a path through every layer.
    """
    env = os.environ.get("PETMODEL_STORE")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("petmodel")) / "store"


def read_only_folder(path: Path) -> bool:
    """True on a read-only mount (even for root, whom permissions do not stop) or a folder we may not write."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY) or not os.access(path, os.W_OK)
    except OSError:
        return False


def nearly_full(path: Path) -> bool:
    """SQLite reports a write that ran out of space in its WAL as a plain "disk I/O error"."""
    try:
        return shutil.disk_usage(path).free < 1_000_000
    except OSError:
        return False
