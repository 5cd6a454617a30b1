"""Fetch the official Seattle Pet Licenses export once and keep it in a user cache.

The file is written to a temporary name beside the target and renamed into place, so an
interrupted download never leaves a truncated CSV that later looks valid.
"""

from __future__ import annotations

import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from petmodel.data import SEATTLE_URL
from petmodel.errors import PetmodelError

CACHE_ENV = "PETMODEL_CACHE"


def cache_dir() -> Path:
    """``$PETMODEL_CACHE`` if set, else the platform's user cache folder for petmodel."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("petmodel"))


def fetch_seattle_csv(*, url: str = SEATTLE_URL, progress: bool = False, timeout: float = 30.0) -> Path:
    """Path of the cached export, downloading it first if it is not there yet."""
    target = cache_dir() / "seattle_pet_licenses.csv"
    if target.exists() and target.stat().st_size > 0:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".download-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
            total = int(resp.headers.get("Content-Length") or 0) or None
            bar = None
            if progress:
                from tqdm import tqdm

                bar = tqdm(total=total, unit="B", unit_scale=True, desc="Seattle pet licenses")
            while chunk := resp.read(1 << 16):
                out.write(chunk)
                if bar is not None:
                    bar.update(len(chunk))
            if bar is not None:
                bar.close()
        os.replace(tmp, target)
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        Path(tmp).unlink(missing_ok=True)
        reason = getattr(err, "reason", err)
        raise PetmodelError(
            f"Could not download the Seattle Pet Licenses data ({reason}); pass --data PATH to a local copy."
        ) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
