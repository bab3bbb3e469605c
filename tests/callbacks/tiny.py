"""A tiny model and data set for the callback tests: a tied embedding, a frozen layer, a trainable one."""

import torch
from torch import nn
from torch.utils.data import Dataset

VOCAB, WIDTH = 16, 8
# fp32 bytes: embedding 16·8 (tied with the head, so once) + frozen 8·8+8 + hidden 8·8+8 = 272 elements.
PARAM_BYTES = (VOCAB * WIDTH + 2 * (WIDTH * WIDTH + WIDTH)) * 4  # 1088
TRAINABLE = VOCAB * WIDTH + WIDTH * WIDTH + WIDTH  # 200: embedding (tied head) and hidden
FROZEN = WIDTH * WIDTH + WIDTH  # 72
GRAD_BYTES = TRAINABLE * 4  # 800
# AdamW: exp_avg and exp_avg_sq in fp32 per trainable element, plus one fp32 scalar `step` tensor
# for each of the 3 trainable tensors (embedding weight, hidden weight, hidden bias).
ADAMW_BYTES = 2 * TRAINABLE * 4 + 3 * 4  # 1612


class TinyModel(nn.Module):
    def __init__(self, oom_on_call: int | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.frozen = nn.Linear(WIDTH, WIDTH)
        self.hidden = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight
        self.frozen.requires_grad_(False)
        self.oom_on_call = oom_on_call
        self.calls = 0

    def forward(self, input_ids, attention_mask=None, labels=None):
        if self.training:
            self.calls += 1
            if self.calls == self.oom_on_call:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        logits = self.head(self.hidden(self.frozen(self.embed(input_ids)).relu()))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return {"loss": loss, "logits": logits}


class TinyData(Dataset):
    """Rows of 6 token ids with the last 2 as padding (attention_mask 0): 4 real tokens per sample."""

    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, 6), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        mask = torch.tensor([1, 1, 1, 1, 0, 0])
        return {"input_ids": self.ids[i], "attention_mask": mask, "labels": self.ids[i]}
