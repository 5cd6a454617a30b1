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

from petmodel.config import DEFAULT_SPEC
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
        try:
            records = read_records(tmp)  # refuses what training could not read, in one sentence
        except PetmodelError as err:  # it names the server's temporary file: name the visitor's instead (issue 53)
            raise PetmodelError(str(err).replace(tmp, name).replace(Path(tmp).name, name)) from None
        if not records.names:
            raise PetmodelError(f"{name} holds no names; upload a CSV with a name column or one name per line.")
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def too_few_names(label: str, train_names: int, val_names: int, batch: int | None = None) -> str | None:
    """A warning, at the upload, when runs on this file would be refused or barely train; None when fine.

    Training needs validation names to hold out (a distinct name is held out when its crc32 ends in
    0, about one in ten) and at least one global batch of training names: the default one unless
    ``batch`` says which.
    """
    batch = DEFAULT_SPEC.train.batch_size if batch is None else batch
    if not val_names:
        return (f"{label} has too few distinct names to hold any out for validation ({train_names:,} in all), "
                "so runs on it will be refused; upload a file with more names (a few dozen at least).")
    if train_names < batch:
        return (f"{label} has only {train_names:,} training names, fewer than one default batch of {batch}; "
                f"set the batch per worker to {train_names} or less on Train, or upload more names.")
    return None
