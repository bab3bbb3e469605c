"""Score alt text against the reference captions of a dataset split: BLEU, ROUGE-L, CIDEr-D, METEOR, exact match.

    python recipes/score.py --model_name_or_path outputs/tiny-opt-demo                 # a fine-tuned model
    python recipes/score.py --model_name_or_path blip2-tiny-opt                        # untrained baseline
    python recipes/score.py --adapter outputs/opt27-lora --dataset_path data/synthetic_food-224
    python recipes/score.py --predictions alt.jsonl                                    # from generate.py's dataset mode

(Not named evaluate.py: a script's folder comes first on sys.path, so it would shadow the `evaluate` library.)
The metrics are `evaluate` modules kept in metrics/, loaded by path, because evaluate.load("bleu")
downloads from the Hub. Prints one table and, with --output, writes the scores as JSON.
"""

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import altscale.patches.bitsandbytes  # noqa: F401  (first: it quiets a bitsandbytes import-time warning)
from altscale.metrics import METRICS, compute_scores
from altscale.config.errors import ConfigError, DataError, run_cli
from altscale.config.arguments import Parser
from altscale.data.loading import load_split
from altscale.families.blip2.captioner import CaptionerArguments, check_captioner

# The one number each module contributes to the table (others stay in the JSON).
HEADLINE = {"bleu": ["bleu"], "rouge_l": ["rougeL"], "cider": ["cider"], "meteor": ["meteor"], "caption_match": ["exact_match", "token_f1"]}


@dataclass
class ScoreArguments:
    dataset_path: str = field(default="data/synthetic_food", metadata={"help": "The dataset whose split holds the reference captions."})
    split: str = field(default="test", metadata={"help": "The split to score on (the held-out one)."})
    num_samples: int | None = field(default=None, metadata={"help": "Only the first N examples."})
    image_column: str = field(default="image", metadata={"help": "The column holding the photo."})
    text_column: str = field(default="text", metadata={"help": "The column holding the reference caption."})
    predictions: str | None = field(
        default=None, metadata={"help": "Score a JSONL file with alt_text and reference per line (generate.py's dataset mode) instead of a model."}
    )
    output: str | None = field(default=None, metadata={"help": "Also write the scores and the captions to this JSON file."})


def read_predictions(path: Path) -> tuple[list[str], list[str]]:
    if not path.is_file():
        raise DataError(f"predictions: {path} does not exist; write it with recipes/generate.py --dataset_path ... --output {path}")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    missing = [i + 1 for i, row in enumerate(rows) if "alt_text" not in row or "reference" not in row]
    if not rows or missing:
        raise DataError(f"predictions: {path} needs lines with alt_text and reference (lines {missing[:5] or 'none found'}); "
                        "generate.py writes them in dataset mode (--dataset_path)")
    return [row["alt_text"] for row in rows], [row["reference"] for row in rows]


def generate_for_split(model_args: CaptionerArguments, data: ScoreArguments) -> tuple[list[str], list[str], str]:
    from transformers import set_seed

    from altscale.families.blip2.captioner import build_collator, load_captioner, resolve_dtype, write_alt_text

    _, images, references = load_split(data.dataset_path, data.split, data.num_samples, image_column=data.image_column,
                                       text_column=data.text_column)  # data mistakes fail before any weight is loaded
    set_seed(model_args.seed)
    model, processor, described = load_captioner(model_args.model_name_or_path, adapter=model_args.adapter,
                                                 processor_name_or_path=model_args.processor_name_or_path,
                                                 dtype=resolve_dtype(model_args.dtype), load_in_4bit=model_args.load_in_4bit)
    written = write_alt_text(model, build_collator(model, processor, model_args.prompt), images, max_chars=model_args.max_alt_chars,
                             max_new_tokens=model_args.max_new_tokens, num_beams=model_args.num_beams, batch_size=model_args.batch_size)
    return written, references, described


def format_scores(scores: dict, what: str, count: int) -> str:
    keys = [key for name in METRICS for key in HEADLINE[name]]
    return f"{what}: {count} captions\n" + "\n".join(f"  {key:12} {scores[key]:.4f}" for key in keys)


def main(argv: list[str] | None = None) -> dict:
    model_args, data = Parser((CaptionerArguments, ScoreArguments)).parse_args_into_dataclasses(args=argv)
    if data.predictions:
        written, references = read_predictions(Path(data.predictions))
        what = f"predictions {data.predictions}"
    else:
        problems = check_captioner(model_args)
        if problems:
            raise ConfigError("\n".join(problems + ["(or score a file of captions with --predictions)"]))
        written, references, what = generate_for_split(model_args, data)
    scores = compute_scores(written, references)
    print(format_scores(scores, what, len(written)))
    result = {"what": what, "dataset_path": data.dataset_path, "split": data.split, "scores": scores,
              "captions": [{"alt_text": a, "reference": r} for a, r in zip(written, references)]}
    if data.output:
        Path(data.output).parent.mkdir(parents=True, exist_ok=True)
        Path(data.output).write_text(json.dumps(result, indent=1) + "\n")
    return result


def run(argv: list[str] | None = None) -> int:
    return run_cli(main, argv)


if __name__ == "__main__":
    sys.exit(run())
