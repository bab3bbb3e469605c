"""Turn {"image", "text"} examples into BLIP-2 batches, in the DataLoader's worker processes.

The sequence layout is built here rather than by `Blip2Processor.__call__`, because the labels must
match it exactly and the processor's padding lands between the image tokens and the text:
  OPT (decoder-only): [<image> x Q] [bos] [prompt] [caption] [eos]  -- labels only on caption + eos
  T5 (encoder-decoder): encoder [<image> x Q] [prompt] [eos], labels [caption] [eos]
Everything the loss must not see (padding, image tokens, bos, prompt) is labelled -100.
"""

import torch
from transformers import Blip2Processor

from altscale.data.images import to_rgb

IGNORE_INDEX = -100  # the label value the loss skips


class CaptionCollator:
    """Preprocesses images and tokenises captions; also builds generation inputs for the same model."""

    def __init__(self, processor: Blip2Processor, *, decoder_only: bool, prompt: str = "", max_caption_tokens: int = 48,
                 pad_to_multiple_of: int = 1):
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.decoder_only = decoder_only
        self.prompt = prompt
        self.max_caption_tokens = max_caption_tokens
        # Fewer distinct batch widths: each width is one CUDA graph (recipes/cuda_graphs.py) or one kernel-plan set.
        self.pad_to_multiple_of = pad_to_multiple_of
        self.image_token_id = self.tokenizer.convert_tokens_to_ids(processor.image_token.content)
        self.image_tokens = [self.image_token_id] * processor.num_query_tokens

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        pixel_values = self.pixel_values([example["image"] for example in examples])
        captions = [example["text"].strip() for example in examples]
        if self.decoder_only:
            batch = self._decoder_only_batch(captions)
        else:
            batch = self._encoder_decoder_batch(captions)
        return {"pixel_values": pixel_values, **batch}

    def generation_inputs(self, images: list) -> dict[str, torch.Tensor]:
        """Inputs for `model.generate`: image tokens and prompt, left-padded so every row ends where decoding starts."""
        prompt_ids = self.prompt_ids()
        rows = [self.image_tokens + prompt_ids] * len(images)
        input_ids, attention_mask = self._pad(rows, self.tokenizer.pad_token_id, left=self.decoder_only)
        return {"pixel_values": self.pixel_values(images), "input_ids": input_ids, "attention_mask": attention_mask}

    def pixel_values(self, images: list) -> torch.Tensor:
        return self.processor.image_processor([to_rgb(image) for image in images], return_tensors="pt")["pixel_values"]

    def prompt_ids(self) -> list[int]:
        # OPT's tokenizer prepends bos and T5's appends eos: exactly the special tokens each model expects here.
        return self.tokenizer(self.prompt).input_ids

    def caption_ids(self, caption: str) -> list[int]:
        """The label ids of one caption: its tokens, cut to max_caption_tokens, then eos."""
        ids = self.tokenizer(caption, add_special_tokens=False).input_ids[: self.max_caption_tokens]
        return ids + [self.tokenizer.eos_token_id]  # eos teaches the model where alt text ends

    def _decoder_only_batch(self, captions: list[str]) -> dict[str, torch.Tensor]:
        prefix = self.image_tokens + self.prompt_ids()
        rows, label_rows = [], []
        for caption in captions:
            caption_ids = self.caption_ids(caption)
            rows.append(prefix + caption_ids)
            label_rows.append([IGNORE_INDEX] * len(prefix) + caption_ids)
        input_ids, attention_mask = self._pad(rows, self.tokenizer.pad_token_id, multiple=self.pad_to_multiple_of)
        labels, _ = self._pad(label_rows, IGNORE_INDEX, multiple=self.pad_to_multiple_of)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}

    def _encoder_decoder_batch(self, captions: list[str]) -> dict[str, torch.Tensor]:
        encoder_row = self.image_tokens + self.prompt_ids()
        input_ids, attention_mask = self._pad([encoder_row] * len(captions), self.tokenizer.pad_token_id)
        labels, _ = self._pad([self.caption_ids(caption) for caption in captions], IGNORE_INDEX,
                              multiple=self.pad_to_multiple_of)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}

    @staticmethod
    def _pad(rows: list[list[int]], value: int, left: bool = False, multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Pad to the longest row in this batch (dynamic padding), rounded up to `multiple`; returns ids and mask."""
        width = -(-max(len(row) for row in rows) // multiple) * multiple
        ids = torch.full((len(rows), width), value, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            span = slice(width - len(row), width) if left else slice(0, len(row))
            ids[i, span] = torch.tensor(row, dtype=torch.long)
            mask[i, span] = 1
        return ids, mask



#END
