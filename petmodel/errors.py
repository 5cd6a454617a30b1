"""The one exception type users are meant to read.

Every expected failure (bad file, bad hyperparameter, unreachable scheduler, ...) is raised
as :class:`PetmodelError` whose message is one plain sentence saying what is wrong and what
to do. The CLI and the app print that sentence and nothing else; any other exception is a
bug and keeps its traceback.
"""

from __future__ import annotations


class PetmodelError(Exception):
    """A failure the user can fix; ``str(err)`` is one sentence meant for them."""


class UsageError(PetmodelError):
    """Bad input to a command or form (an impossible hyperparameter, say): CLI exit code 2."""
