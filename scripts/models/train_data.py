"""Training data: the tokenised corpus stream, random training windows, validation windows."""

from __future__ import annotations

import json

import torch

from train_common import BOS_ID, EOS_ID


def load_stream(path: str, tok) -> torch.Tensor:
    ids: list[int] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            ids.append(BOS_ID)
            ids.extend(tok(text, add_special_tokens=False, verbose=False)["input_ids"])
            ids.append(EOS_ID)
    return torch.tensor(ids, dtype=torch.long)


class WindowSampler:
    """Epochs of non-overlapping (seq_len + 1)-token windows, random phase and order per epoch."""

    def __init__(self, stream: torch.Tensor, seq_len: int, batch_size: int, seed: int):
        self.stream, self.seq_len, self.batch_size, self.seed = stream, seq_len, batch_size, seed
        self.windows_per_epoch = (len(stream) - 1 - seq_len) // seq_len
        self.steps_per_epoch = max(self.windows_per_epoch // batch_size, 1)

    def batches(self):
        epoch = 0
        while True:
            g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            offset = int(torch.randint(0, self.seq_len, (1,), generator=g))
            starts = torch.arange(offset, len(self.stream) - self.seq_len - 1, self.seq_len)
            starts = starts[torch.randperm(len(starts), generator=g)]
            idx = starts[:, None] + torch.arange(self.seq_len + 1)[None, :]
            for i in range(0, len(starts) - self.batch_size + 1, self.batch_size):
                yield epoch, self.stream[idx[i : i + self.batch_size]]
            epoch += 1


def val_windows(stream: torch.Tensor, seq_len: int, max_windows: int | None) -> torch.Tensor:
    n = (len(stream) - 1) // seq_len
    if max_windows:
        n = min(n, max_windows)
    idx = torch.arange(n)[:, None] * seq_len + torch.arange(seq_len + 1)[None, :]
    return stream[idx]
