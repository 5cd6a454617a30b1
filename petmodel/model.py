"""The character model: embedding → multi-layer LSTM → linear, as in the original write-up
but fed token ids (an embedding) instead of one-hot vectors and trained on whole names."""

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

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Logits for the next token at every position of ``x`` (B, T), and the LSTM state."""
        out, state = self.lstm(self.embed(x), state)
        return self.head(self.drop(out)), state

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
