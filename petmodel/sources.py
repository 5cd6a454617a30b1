"""Which data a run trains on, and whether a file is safe to read.

Precedence, highest first: a file the user names (``--data``, the app's field or an uploaded
file), ``$PETMODEL_DATA``, the official export cached by ``python -m petmodel data refresh``,
then the snapshot packaged with petmodel. The last one always exists, so training never needs
the network; the network is only used when the user asks for a refresh.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from petmodel.download import cached_export
from petmodel.errors import PetmodelError
from petmodel.settings import env_number

DATA_ENV = "PETMODEL_DATA"
MAX_MB_ENV = "PETMODEL_MAX_DATA_MB"
DEFAULT_MAX_MB = 100.0  # the official export is ~3 MB; far larger files are mistakes, not data
MAX_ROWS_ENV = "PETMODEL_MAX_DATA_ROWS"
# The official export has ~44,000 rows and the largest city licence lists under a million; a file of
# millions of short lines (a small .gz can hold 16 million) is a mistake or an attack, not data.
DEFAULT_MAX_ROWS = 1_000_000
MAX_LINE_BYTES = 65_536  # a row of the export is ~100 bytes; a longer line is not a row of names
MAX_PATH_CHARS = 1024
SNAPSHOT = Path(__file__).resolve().parent / "dataset" / "seattle_pet_names.csv.gz"
SNAPSHOT_LABEL = "packaged snapshot of Seattle Pet Licenses (43,908 licences, 2015–2023)"


@dataclass(frozen=True)
class DataSource:
    """A data file and what to call it when showing a user which data a run used."""

    path: Path
    kind: str  # "file" | "env" | "cache" | "snapshot"
    label: str


def default_source() -> DataSource:
    """The data used when the user names none: ``$PETMODEL_DATA``, the cached export, the snapshot."""
    env = os.environ.get(DATA_ENV, "").strip()
    if env:
        path = Path(env).expanduser()
        return DataSource(path, "env", f"{path.name} (from ${DATA_ENV})")
    cached = cached_export()
    if cached is not None:
        return DataSource(cached, "cache", "official Seattle export (downloaded by data refresh)")
    return DataSource(SNAPSHOT, "snapshot", SNAPSHOT_LABEL)


def resolve_source(source: str | os.PathLike | None) -> DataSource:
    """The file a run reads: ``source`` if given, else :func:`default_source`."""
    if source is None or not str(source).strip():
        return default_source()
    path = Path(os.fspath(source)).expanduser()
    if path.resolve() == SNAPSHOT:
        return DataSource(SNAPSHOT, "snapshot", SNAPSHOT_LABEL)
    return DataSource(path, "file", path.name)


def describe_source(source: str | None) -> str:
    """A short, path-free label for a run's recorded data source (shown wherever a run is shown)."""
    if not source:
        return "—"
    path = Path(source)
    if path.resolve() == SNAPSHOT:
        return SNAPSHOT_LABEL
    cached = cached_export()
    if cached is not None and path.resolve() == cached.resolve():
        return "official Seattle export (downloaded by data refresh)"
    return path.name


def max_data_bytes() -> int:
    """The largest data file accepted: ``$PETMODEL_MAX_DATA_MB`` megabytes (default 100)."""
    return int(env_number(MAX_MB_ENV, DEFAULT_MAX_MB, above=0, unit="megabytes") * 1e6)


def max_data_rows() -> int:
    """The most rows a data file may hold: ``$PETMODEL_MAX_DATA_ROWS`` (default 1,000,000).

    The byte limit alone does not bound the work: 100 MB of "rex" lines is 25 million rows.
    """
    return int(env_number(MAX_ROWS_ENV, DEFAULT_MAX_ROWS, kind=int, minimum=1, unit="rows"))


def shown(path: Path | str) -> str:
    """A path as the user gave it, cut short so a 5,000-character path cannot flood a message."""
    text = str(path)
    return text if len(text) <= 80 else text[:38] + "…" + text[-38:]


def check_data_file(path: Path) -> int:
    """Refuse what must not be read (devices, pipes, folders, huge files); returns the file's size.

    ``/dev/zero`` or a FIFO would read forever or hang, and a multi-GB file would exhaust memory,
    so only regular files up to :func:`max_data_bytes` are read.
    """
    if len(str(path)) > MAX_PATH_CHARS:
        raise PetmodelError(f"The data path {shown(path)} is {len(str(path)):,} characters long; give a path under "
                            f"{MAX_PATH_CHARS:,} characters.")
    try:
        info = path.stat()
    except FileNotFoundError:
        raise PetmodelError(f"The data file {shown(path)} does not exist; check the path.") from None
    except OSError as err:
        raise PetmodelError(f"Cannot read the data file {shown(path)} ({err.strerror or err}); check the path.") from None
    if stat.S_ISDIR(info.st_mode):
        raise PetmodelError(f"{shown(path)} is a folder; give a CSV or text file of names.")
    if not stat.S_ISREG(info.st_mode):
        raise PetmodelError(f"{shown(path)} is not a regular file (a device or a pipe); give a CSV or text file "
                            "of names.")
    limit = max_data_bytes()
    if info.st_size > limit:
        raise PetmodelError(f"The data file {shown(path)} is {info.st_size / 1e6:,.0f} MB, over the "
                            f"{limit / 1e6:g} MB limit; give a smaller file or raise ${MAX_MB_ENV}.")
    return info.st_size
