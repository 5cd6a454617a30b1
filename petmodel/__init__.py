"""petmodel: train a character-level LSTM that invents pet names, on one machine or a Dask cluster."""

from petmodel.errors import PetmodelError, UsageError

__all__ = ["PetmodelError", "UsageError"]
__version__ = "0.1.0"
