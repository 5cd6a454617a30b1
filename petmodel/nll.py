"""Scoring names: the summed next-character NLL the loop trains on and the validation figure every
quality number in this project is (mean nats per predicted character, letters and the stop).

Validation batches are length-sorted and small: an LSTM pays for the longest name in its batch, so a
large batch pads every name to the longest of many.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from petmodel.data import EncodedNames
from petmodel.model import CharLSTM

EVAL_BATCH = 128  # validation batch: larger ones pad every name to the longest of many


def token_nll(model: CharLSTM, x: torch.Tensor, y: torch.Tensor, precision: str = "fp32",
              species: torch.Tensor | None = None) -> torch.Tensor:
    """Summed next-token NLL over the scored (non-padding) positions."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits, _ = model(x, species=species) if species is not None else model(x)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                           ignore_index=-1, reduction="sum")


@torch.no_grad()
def nll_sum(model: torch.nn.Module, data: EncodedNames, *, indices: torch.Tensor | None = None,
            batch_size: int = EVAL_BATCH, precision: str = "fp32") -> float:
    """Summed NLL (nats) over the names ``indices`` of ``data`` (all by default), in length-sorted batches."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    idx_all = torch.arange(len(data)) if indices is None else indices
    order = idx_all[torch.argsort(data.lengths[idx_all], stable=True)]  # similar lengths together: less padding
    total = 0.0
    for i in range(0, len(order), batch_size):
        idx = order[i:i + batch_size]
        t = int(data.lengths[idx].max())
        species = data.species[idx].to(device) if data.species is not None else None
        total += float(token_nll(model, data.x[idx, :t].to(device), data.y[idx, :t].to(device), precision, species))
    model.train(was_training)
    return total


def evaluate_nll(model: torch.nn.Module, data: EncodedNames, *, batch_size: int = EVAL_BATCH,
                 precision: str = "fp32") -> float:
    """Mean NLL in nats per predicted character (letters and the stop) over ``data``."""
    return nll_sum(model, data, batch_size=batch_size, precision=precision) / data.tokens


def sharded_evaluate_nll(model: torch.nn.Module, data: EncodedNames, rank: int, world: int, *,
                         precision: str = "fp32") -> float:
    """:func:`evaluate_nll` computed by all ``world`` ranks together, each scoring every world-th name.

    Strided over the length-sorted names, so every rank gets the same mix of lengths. A collective:
    every rank must call it at the same point.
    """
    if world == 1:
        return evaluate_nll(model, data, precision=precision)
    sorted_idx = torch.argsort(data.lengths, stable=True)
    part = torch.tensor([nll_sum(model, data, indices=sorted_idx[rank::world], precision=precision)],
                        dtype=torch.float64, device=next(model.parameters()).device)
    torch.distributed.all_reduce(part)
    return float(part) / data.tokens
