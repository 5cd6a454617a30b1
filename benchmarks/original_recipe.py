"""The original write-up's recipe, re-implemented as the baseline for ``bench_core``.

What the write-up did (Saturn Cloud's "pet names" PyTorch example):
- characters ``*+abcdefghijklmnopqrstuvwxyz-. `` where ``*`` is the blank (padding) and ``+`` the stop;
- every prefix of every name becomes its own example: the previous up-to-8 characters, left-padded
  with blanks, one-hot encoded; the target is the next character, or stop after the last one;
- a 4-layer LSTM (hidden 128, dropout 0.1 between layers) and a Linear head, read at the last
  time step; cross-entropy; Adam (lr 0.004); batches of 1024 windows, reshuffled every epoch.

Validation uses the project's metric: over the distinct validation names, the mean NLL (nats) of
every predicted character including the stop, each predicted from its own 8-character window
(the same positions the project scores, so the counts match exactly).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

CHARS = "*+abcdefghijklmnopqrstuvwxyz-. "  # "*" blank, "+" stop: the original's list
BLANK, STOP = 0, 1
WINDOW = 8
HIDDEN, LAYERS, DROPOUT = 128, 4, 0.1
LR, BATCH = 0.004, 1024


def make_windows(names: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every prefix of every name as (window of the previous ≤8 char ids, blank-padded on the left; next id or stop)."""
    index = {c: i for i, c in enumerate(CHARS)}
    lengths = [len(n) for n in names]
    longest = max(lengths)
    padded = torch.full((len(names), WINDOW + longest + 1), BLANK, dtype=torch.long)
    for row, name in enumerate(names):
        ids = [index[c] for c in name] + [STOP]
        padded[row, WINDOW:WINDOW + len(ids)] = torch.tensor(ids)
    # Position i of a name (0 ≤ i ≤ len) reads columns i..i+7 and predicts column i+8.
    slides = padded.unfold(1, WINDOW + 1, 1)  # (N, longest + 1, 9)
    valid = torch.arange(longest + 1)[None, :] <= torch.tensor(lengths)[:, None]
    picked = slides[valid]
    return picked[:, :WINDOW].contiguous(), picked[:, WINDOW].contiguous()


class OriginalLSTM(nn.Module):
    def __init__(self, vocab: int = len(CHARS), hidden: int = HIDDEN, layers: int = LAYERS,
                 dropout: float = DROPOUT) -> None:
        super().__init__()
        self.vocab = vocab
        self.lstm = nn.LSTM(vocab, hidden, num_layers=layers, batch_first=True, dropout=dropout)
        self.fc = nn.Linear(hidden, vocab)

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        """Logits of the next character for a (B, 8) batch of window ids (one-hot encoded here)."""
        out, _ = self.lstm(F.one_hot(windows, self.vocab).float())
        return self.fc(out[:, -1])


@torch.no_grad()
def evaluate(model: OriginalLSTM, x: torch.Tensor, y: torch.Tensor, batch: int = 4096) -> float:
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    total = 0.0
    for i in range(0, len(x), batch):
        logits = model(x[i:i + batch].to(device))
        total += float(F.cross_entropy(logits.float(), y[i:i + batch].to(device), reduction="sum"))
    model.train(was)
    return total / len(x)


@dataclass
class BaselineResult:
    points: list[dict[str, Any]] = field(default_factory=list)  # train_s, val_nll, step, samples
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    steps: int = 0
    samples: int = 0  # windows = predicted characters
    epochs: float = 0.0
    reached: bool = False
    prep_seconds: float = 0.0
    train_windows: int = 0
    val_windows: int = 0


def train_baseline(train_names: Sequence[str], val_names: Sequence[str], *, budget_s: float, target: float,
                   eval_every_s: float, device: str | torch.device = "cpu", seed: int = 0,
                   log: Callable[[str], None] | None = None) -> BaselineResult:
    """Train until validation NLL ≤ ``target`` or ``budget_s`` seconds of training (evaluation excluded)."""
    t0 = time.perf_counter()
    xtr, ytr = make_windows(train_names)
    xva, yva = make_windows(val_names)
    device = torch.device(device)
    xtr, ytr = xtr.to(device), ytr.to(device)
    res = BaselineResult(prep_seconds=time.perf_counter() - t0, train_windows=len(xtr), val_windows=len(xva))
    torch.manual_seed(seed)
    model = OriginalLSTM().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    start = time.perf_counter()
    eval_total = 0.0
    next_eval = eval_every_s
    steps_per_epoch = math.ceil(len(xtr) / BATCH)

    def train_time() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start - eval_total

    done = False
    while not done:
        perm = torch.randperm(len(xtr), generator=gen).to(device)
        for i in range(0, len(perm), BATCH):
            idx = perm[i:i + BATCH]
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            res.steps += 1
            res.samples += len(idx)
            now = train_time()
            if now >= next_eval or now >= budget_s:
                e0 = time.perf_counter()
                val = evaluate(model, xva, yva)
                eval_total += time.perf_counter() - e0
                res.points.append({"train_s": now, "val_nll": val, "step": res.steps, "samples": res.samples})
                if log:
                    log(f"  original recipe: {now:6.1f} s  step {res.steps:5d}  val NLL {val:.4f}")
                next_eval = now + eval_every_s
                if val <= target:
                    res.reached = True
                if res.reached or now >= budget_s:
                    res.train_seconds = now
                    done = True
                    break
    res.eval_seconds = eval_total
    res.epochs = res.steps / steps_per_epoch
    return res
