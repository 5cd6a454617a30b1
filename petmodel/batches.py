"""What each rank trains on at each step, identical on every rank: the global batches of an epoch,
this rank's work-balanced slice of one, the species mask of an epoch and the dropout seed of a step.

Everything here is a function of (seed, epoch, step, rank), never of a random-number state, so N
ranks × batch b see exactly what one rank × batch N·b sees, and a resumed run sees exactly what the
run that never stopped would have.

Names are batched "sortish": a window of global batches is sorted by length, then the batches are
shuffled. An LSTM pays for the longest name in its batch, and names run from 1 to 50 characters, so
this cuts the padded work without changing what each epoch sees (README, benchmarks).
"""

from __future__ import annotations

import torch

OVERHEAD_ROWS = 8  # an LSTM step costs ~ padded length × (rows + this), measured on one CPU thread
# A training example's species is replaced by "any" with this probability, so one model learns both
# "a name for a cat" and "a name for any pet". Drawn per epoch from the run's seed: every rank agrees.
SPECIES_ANY_RATE = 0.2


def epoch_batches(lengths: torch.Tensor, global_batch: int, seed: int, epoch: int, sortish: bool) -> list[torch.Tensor]:
    """The global batches of one epoch, identical on every rank (seeded by seed and epoch).

    The last incomplete global batch is dropped so every rank always has a full local batch.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(len(lengths), generator=g)
    n_batches = len(perm) // global_batch
    perm = perm[: n_batches * global_batch]
    if sortish and n_batches > 1:
        window = 32 * global_batch
        chunks = []
        for i in range(0, len(perm), window):
            chunk = perm[i:i + window]
            chunks.append(chunk[torch.argsort(lengths[chunk], stable=True)])
        perm = torch.cat(chunks)
    batches = list(perm.view(n_batches, global_batch))
    if sortish:
        batches = [batches[i] for i in torch.randperm(n_batches, generator=g).tolist()]
    return batches


def balanced_slices(sorted_lengths: torch.Tensor, world: int, overhead_rows: int = OVERHEAD_ROWS) -> list[int]:
    """Sizes of ``world`` contiguous slices of a length-sorted batch that even out the ranks' work.

    An LSTM step costs about (padded length) × (rows + ``overhead_rows``), and DDP waits for
    the slowest rank. Equal row counts give the last rank the batch's longest names, so every
    step lasts as long as its worst slice (README's benchmark section has the cost);
    here the longer names go to slices with fewer rows instead. Exactness does not suffer: the
    loss is normalised by a constant, not by the rows, so DDP's gradient average is the same
    whatever the split. Minimises the largest slice cost (bisection on the cost; greedy fill
    over runs of equal length, so a step costs microseconds, not a pass over the batch).
    """
    n = len(sorted_lengths)
    if world == 1:
        return [n]
    values, counts = torch.unique_consecutive(sorted_lengths, return_counts=True)
    runs = list(zip(values.tolist(), counts.tolist()))

    def fill(cap: int) -> list[int] | None:
        sizes: list[int] = []
        j, used = 0, 0  # run index, rows of run j already placed
        while j < len(runs):
            if len(sizes) == world:
                return None
            rows = 0
            while j < len(runs):
                length, count = runs[j]
                room = cap // length - overhead_rows - rows
                if room <= 0:
                    break
                take = min(count - used, room)
                rows, used = rows + take, used + take
                if used < count:
                    break
                j, used = j + 1, 0
            if rows == 0:
                return None
            sizes.append(rows)
        return sizes

    lo, hi = 0, (n + overhead_rows) * int(values[-1])  # fill(hi) is one slice
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fill(mid) is not None else (mid, hi)
    sizes = fill(hi) or [n]
    while len(sizes) < world:  # fewer slices than ranks: halving the largest never raises the worst cost
        i = max(range(len(sizes)), key=sizes.__getitem__)
        half = sizes[i] // 2
        sizes[i:i + 1] = [half, sizes[i] - half]
    return sizes


def epoch_species(species: torch.Tensor, seed: int, epoch: int, rate: float = SPECIES_ANY_RATE) -> torch.Tensor:
    """The species every example trains with this epoch: its own, or "any" (id 0) at ``rate``.

    Seeded by seed and epoch only, so every DDP rank draws the same mask for the whole data set
    and N workers × b stays exactly 1 × N·b.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch + 0x5bd1e995)
    return torch.where(torch.rand(len(species), generator=g) < rate, torch.zeros_like(species), species)


def step_seed(seed: int, rank: int, step: int) -> int:
    """The seed of the dropout masks of ``rank`` at ``step``.

    Reseeding each step makes the masks a function of (seed, rank, step), so a run resumed from a
    snapshot draws the same masks as the run that never stopped, with no RNG state to carry.
    """
    return (seed * 1_000_003 + 7919 * rank + 104_729 * step) % (2**63)


def rank_slice(gidx: torch.Tensor, lengths: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's rows of a global batch: contiguous, length-sorted, work-balanced (see :func:`balanced_slices`)."""
    if world == 1:
        return gidx
    batch_lengths = lengths[gidx]
    order = torch.argsort(batch_lengths, stable=True)
    sizes = balanced_slices(batch_lengths[order], world)
    first = sum(sizes[:rank])
    return gidx[order[first:first + sizes[rank]]]
