"""The character model: embedding → multi-layer LSTM → linear, as in the original write-up
but fed token ids (an embedding) instead of one-hot vectors and trained on whole names.

A species-conditioned model (``config.species`` > 0) adds a learned species vector to every
input embedding: the species then steers every step, not only the first, and a model without
species keeps exactly today's layers (and, made last, the same seeded initial weights).
"""

from __future__ import annotations

import torch
from torch import nn

from petmodel.config import ModelConfig


class CharLSTM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.embed)
        self.lstm = nn.LSTM(
            config.embed, config.hidden, num_layers=config.layers, batch_first=True,
            dropout=config.dropout if config.layers > 1 else 0.0,
        )
        self.drop = nn.Dropout(config.dropout)
        self.head = nn.Linear(config.hidden, config.vocab_size)
        # Default N(0, 1) init, like the characters'. A small or zero init kept the overall validation NLL
        # at the unconditioned model's level but learned the species too slowly to tell a dog name from
        # a cat name after a short run; this one pays a little overall NLL for a clear species effect.
        self.species = nn.Embedding(config.species, config.embed) if config.species else None

    def gradient_bytes(self) -> int:
        """The size of one step's gradient, what DDP all-reduces every step (the sweep's forecast times it)."""
        return sum(p.numel() * p.element_size() for p in self.parameters() if p.requires_grad)

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None,
                species: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Logits for the next token at every position of ``x`` (B, T), and the LSTM state.

        ``species`` (B,) holds species ids (see ``config.SPECIES``); None means "any" (id 0). An
        unconditioned model ignores it.
        """
        inputs = self.embed(x)
        if self.species is not None:
            if species is None:
                species = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
            inputs = inputs + self.species(species).unsqueeze(1)
        out, state = self.lstm(inputs, state)
        return self.head(self.drop(out)), state
