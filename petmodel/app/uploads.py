"""Data files uploaded on the Data page: checked, capped and kept in the run store's ``uploads/``.

An upload is written under a name made from its content hash (the same file twice is one file;
two different files never overwrite each other), atomically, and read back with the training
reader at once, so a bad file is refused with one sentence and never kept.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

from petmodel.data import read_records
from petmodel.errors import PetmodelError
from petmodel.sources import max_data_bytes

SUFFIXES = (".csv", ".tsv", ".txt", ".gz")
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def save_upload(store_root: Path, filename: str, data: bytes) -> Path:
    """Keep ``data`` (a file a visitor uploaded as ``filename``) if it is a readable name file."""
    limit = max_data_bytes()
    if len(data) > limit:
        raise PetmodelError(f"The file is {len(data) / 1e6:,.1f} MB, over the {limit / 1e6:g} MB limit; "
                            "upload a smaller file.")
    name = _SAFE.sub("_", Path(filename or "names.csv").name)[-80:] or "names.csv"
    if not name.lower().endswith(SUFFIXES):
        raise PetmodelError(f"{name} is not a CSV, TSV, text or .gz file; upload one of those.")
    folder = store_root / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{hashlib.sha256(data).hexdigest()[:16]}-{name}"
    if target.is_file():
        return target
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".upload-", suffix=name)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        records = read_records(tmp)  # refuses what training could not read, in one sentence
        if not records.names:
            raise PetmodelError(f"{name} holds no names; upload a CSV with a name column or one name per line.")
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target
