"""Download the official Seattle Pet Licenses export into a user cache, on request only.

Training never downloads: it uses the packaged snapshot unless the user has refreshed (see
:mod:`petmodel.sources`). The file is written to a temporary name beside the target and renamed
into place, so an interrupted or failed download never replaces a good export with a bad one.
"""

from __future__ import annotations

import os
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from petmodel.errors import PetmodelError

SEATTLE_URL = "https://data.seattle.gov/api/views/jguv-t9rb/rows.csv?accessType=DOWNLOAD"
CACHE_ENV = "PETMODEL_CACHE"
URL_ENV = "PETMODEL_EXPORT_URL"  # a mirror of the export, for machines that cannot reach the City's site
EXPORT_NAME = "seattle_pet_licenses.csv"
REFRESH_TIMEOUT_S = 15.0
MAX_DOWNLOAD_BYTES = 100_000_000  # the export is ~3 MB; anything far larger is not it


def cache_dir() -> Path:
    """``$PETMODEL_CACHE`` if set, else the platform's user cache folder for petmodel."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("petmodel"))


def cached_export() -> Path | None:
    """The export a refresh left in the cache, or ``None`` when there is none."""
    path = cache_dir() / EXPORT_NAME
    try:
        return path if path.is_file() and path.stat().st_size > 0 else None
    except OSError:
        return None


def export_url() -> str:
    """Where the export is downloaded from: ``$PETMODEL_EXPORT_URL`` or the City's own address."""
    return os.environ.get(URL_ENV, "").strip() or SEATTLE_URL


def refresh_export(*, url: str | None = None, timeout: float = REFRESH_TIMEOUT_S, progress: bool = False) -> Path:
    """Download the latest export into the cache (replacing an older one only on success).

    The whole download is bounded by ``timeout`` seconds, so an offline machine gets its one
    sentence quickly; whatever data was in use before stays in use.
    """
    url = url or export_url()
    target = cache_dir() / EXPORT_NAME
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".download-", suffix=".part")
    except OSError as err:
        raise PetmodelError(f"Cannot write to the cache folder {target.parent} ({err.strerror or err}); "
                            f"set ${CACHE_ENV} to a folder you can write to.") from None
    deadline = time.monotonic() + timeout
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
            total = int(resp.headers.get("Content-Length") or 0) or None
            bar = None
            if progress:
                from tqdm import tqdm

                bar = tqdm(total=total, unit="B", unit_scale=True, desc="Seattle pet licenses")
            size = 0
            while chunk := resp.read(1 << 16):
                size += len(chunk)
                if size > MAX_DOWNLOAD_BYTES:
                    raise PetmodelError(f"The download from {url} is over {MAX_DOWNLOAD_BYTES // 1_000_000} MB, "
                                        "which is not the pet licence export; nothing was changed.")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"timed out after {timeout:g} s")
                out.write(chunk)
                if bar is not None:
                    bar.update(len(chunk))
            if bar is not None:
                bar.close()
        if size == 0:
            raise PetmodelError("The download of the Seattle Pet Licenses export was empty; nothing was changed.")
        os.replace(tmp, target)
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        Path(tmp).unlink(missing_ok=True)
        reason = getattr(err, "reason", err)
        raise PetmodelError(f"Could not download the Seattle Pet Licenses export ({reason}); the data in use "
                            "is unchanged — try again when online.") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
