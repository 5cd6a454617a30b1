"""TLS settings for a ``tls://`` scheduler: a CA file, this client's certificate and its key.

They come from CLI flags, the Cluster page, or the environment (``PETMODEL_TLS_CA_FILE``,
``PETMODEL_TLS_CERT``, ``PETMODEL_TLS_KEY``), in that order of precedence, and become a Dask
``Security`` that requires encryption. Files are checked here so that a typo is one sentence,
not an SSL traceback from the event loop.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from distributed.security import Security

from petmodel.errors import PetmodelError

ENV = {"ca_file": "PETMODEL_TLS_CA_FILE", "cert": "PETMODEL_TLS_CERT", "key": "PETMODEL_TLS_KEY"}


@dataclass(frozen=True)
class TlsFiles:
    """Paths of the CA certificate, this client's certificate and its private key."""

    ca_file: str | None = None
    cert: str | None = None
    key: str | None = None

    @property
    def given(self) -> bool:
        return any((self.ca_file, self.cert, self.key))

    def with_env(self, environ: Mapping[str, str] | None = None) -> TlsFiles:
        """These files, each one not given taken from its ``PETMODEL_TLS_*`` variable."""
        env = os.environ if environ is None else environ
        return TlsFiles(**{f: getattr(self, f) or env.get(var) or None for f, var in ENV.items()})

    def security(self) -> Security | None:
        """A Dask ``Security`` for these files, or ``None`` when none is given (plain TCP)."""
        if not self.given:
            return None
        for label, path in (("CA file", self.ca_file), ("certificate", self.cert), ("key", self.key)):
            if not path:
                raise PetmodelError(f"TLS needs a CA file, a certificate and a key, but the {label} is missing; "
                                    f"give it (or set {ENV[_field(label)]}).")
            if not Path(path).expanduser().is_file():
                raise PetmodelError(f"The TLS {label} {path} does not exist; check the path.")
        return Security(tls_ca_file=str(Path(self.ca_file).expanduser()),  # type: ignore[arg-type]
                        tls_client_cert=str(Path(self.cert).expanduser()),  # type: ignore[arg-type]
                        tls_client_key=str(Path(self.key).expanduser()),  # type: ignore[arg-type]
                        require_encryption=True)


def _field(label: str) -> str:
    return {"CA file": "ca_file", "certificate": "cert", "key": "key"}[label]


def security_from(ca_file: str | None = None, cert: str | None = None, key: str | None = None) -> Security | None:
    """The ``Security`` for these paths, each missing one taken from the environment."""
    return TlsFiles(ca_file or None, cert or None, key or None).with_env().security()
