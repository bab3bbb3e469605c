"""Optional caption metrics at each evaluation: BLEU, ROUGE-L, CIDEr-D, METEOR, exact match on a small eval subset.

Off by default (caption_metrics_samples: 0): generating captions costs far more than the eval loss.
"""

from transformers import TrainerCallback

from altscale.metrics import compute_scores
from altscale.families.blip2.generation import generate_captions


def caption_scores(model, collator, images: list, references: list[str], max_new_tokens: int = 30) -> dict:
    """Greedy captions for `images`, scored against `references` (one each)."""
    written = generate_captions(model, collator, images, max_new_tokens=max_new_tokens)
    return compute_scores(written, references)


class CaptionMetricsCallback(TrainerCallback):
    """After each evaluation, scores the first `num_samples` eval examples and records them as eval_caption_*."""

    def __init__(self, collator, eval_set, num_samples: int, max_new_tokens: int = 30):
        subset = eval_set.select(range(min(num_samples, len(eval_set))))
        self.collator, self.max_new_tokens = collator, max_new_tokens
        self.images, self.references = list(subset["image"]), list(subset["text"])
        self.rows: list[dict] = []

    def on_evaluate(self, args, state, control, model=None, **kwargs):
        if not state.is_world_process_zero:
            return
        scores = caption_scores(model, self.collator, self.images, self.references, self.max_new_tokens)
        row = {f"eval_caption_{key}": value for key, value in scores.items() if isinstance(value, (int, float))}
        self.rows.append({"step": state.global_step, **row})
        # The Trainer has already logged this evaluation; an entry of our own keeps the scores in log_history.
        state.log_history.append({"epoch": state.epoch, "step": state.global_step, **row})
        print(" ".join(f"{key}={value:.4f}" for key, value in row.items()))


def build_caption_metrics_callbacks(num_samples: int, collator, eval_set, max_new_tokens: int = 30) -> list:
    """[] unless asked for and there is an eval set."""
    if not num_samples or eval_set is None:
        return []
    return [CaptionMetricsCallback(collator, eval_set, num_samples, max_new_tokens)]
