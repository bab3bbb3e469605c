"""What a BLIP-2 run shows after training: alt text for the held-out photos beside the truth, and how many match."""

from altscale.families.blip2.generation import generate_captions
from altscale.metrics.words import exact_match


def show_captions(model, collator, eval_set, max_new_tokens: int, shown: int) -> dict:
    """Caption the whole eval set, print `shown` of them beside the truth, and count exact matches."""
    truth = list(eval_set["text"])
    written = generate_captions(model, collator, list(eval_set["image"]), max_new_tokens=max_new_tokens)
    right = [exact_match(alt, true) for alt, true in zip(written, truth)]
    print(f"\nalt text for held-out photos ({sum(right)}/{len(truth)} exactly right):")
    for alt, true, ok in list(zip(written, truth, right))[:shown]:
        print(f"  {'ok' if ok else '  '}  written: {alt!r:42} true: {true!r}")
    return {"exact_match": sum(right), "total": len(truth), "samples": list(zip(written, truth))}
