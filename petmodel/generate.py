"""Batched sampling: all N names advance together, each row stopping on its own.

One LSTM step for the whole batch costs about what one step for one name does, so sampling
10,000 names takes a fraction of a second. Rows that have produced their stop token leave the
batch, so a few long names do not keep the finished ones busy.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import torch

from petmodel.checkpoint import Checkpoint
from petmodel.config import GenerateConfig
from petmodel.data import BOUNDARY, Alphabet
from petmodel.model import CharLSTM
from petmodel.precision import check_precision

ATTEMPTS_PER_NAME = 5  # top-up rounds stop after sampling this many names per name asked for

@dataclass
class Generated:
    names: list[str]
    seed: int
    attempts: int  # names sampled in all, including rejected ones


@torch.inference_mode()
def sample_batch(model: CharLSTM, alphabet: Alphabet, n: int, *, temperature: float, top_k: int | None,
                 prefix: str, max_len: int, generator: torch.Generator, species: int | None = None) -> list[str]:
    """Sample ``n`` names in parallel (some may come back cut at ``max_len``); ``species`` is a species id."""
    model.eval()
    device = next(model.parameters()).device
    start = torch.tensor([BOUNDARY, *alphabet.encode(prefix)], device=device).expand(n, -1)
    kind = torch.full((n,), species, dtype=torch.long, device=device) if species is not None else None
    logits, (h, c) = model(start, species=kind)
    logits = logits[:, -1]
    out = torch.zeros(n, max_len - len(prefix), dtype=torch.long, device=device)
    active = torch.arange(n, device=device)
    for t in range(out.shape[1]):
        scaled = logits.float() / temperature
        if top_k is not None and top_k < scaled.shape[-1]:
            kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, -math.inf)
        nxt = torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator).squeeze(1)
        out[active, t] = nxt
        keep = nxt != BOUNDARY
        if not bool(keep.any()):
            break
        if not bool(keep.all()):
            active, nxt, h, c = active[keep], nxt[keep], h[:, keep], c[:, keep]
            kind = kind[keep] if kind is not None else None
        logits, (h, c) = model(nxt.unsqueeze(1), (h, c), species=kind)
        logits = logits[:, -1]
    rows = out.cpu().tolist()
    names = []
    for row in rows:
        end = row.index(BOUNDARY) if BOUNDARY in row else len(row)
        names.append(prefix + alphabet.decode(row[:end]))
    return names


def generate(ckpt: Checkpoint, config: GenerateConfig, *, model: CharLSTM | None = None,
             device: str | torch.device = "cpu") -> Generated:
    """Names from a checkpoint (for ``config.species``); the same seed gives the same names.

    Empty names are dropped, and with ``new_only`` so are names from the training data and
    repeats; the batch is topped up (deterministically, from the same generator) until ``n``
    names are found, 20 rounds have passed or :data:`ATTEMPTS_PER_NAME` × ``n`` names were sampled,
    so a model that only repeats its training names cannot keep the server busy for a minute.
    """
    prefix = config.prefix.lower()
    ckpt.alphabet.check(prefix)
    species = ckpt.species_id(config.species)
    model = model or ckpt.build_model(device)
    seed = config.seed if config.seed is not None else secrets.randbelow(2**31)
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    names: list[str] = []
    seen: set[str] = set()
    attempts = 0
    device_type = next(model.parameters()).device.type
    check_precision(config.precision, device_type)
    for _ in range(20):
        want = config.n - len(names)
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=config.precision == "bf16"):
            batch = sample_batch(model, ckpt.alphabet, max(want, 16) if config.new_only else want,
                                 temperature=config.temperature, top_k=config.top_k, prefix=prefix,
                                 max_len=config.max_len, generator=gen, species=species)
        attempts += len(batch)
        for name in batch:
            name = " ".join(name.split())
            if not name:
                continue
            if config.new_only and (name in ckpt.train_names or name in seen):
                continue
            seen.add(name)
            names.append(name)
            if len(names) == config.n:
                return Generated(names, seed, attempts)
        if attempts >= ATTEMPTS_PER_NAME * config.n + 64:
            break
    return Generated(names, seed, attempts)
