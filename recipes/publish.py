"""Publish a trained model to the Hub: stage exactly the files to upload, with a model card, then upload the folder.

    python recipes/publish.py --output_dir outputs/opt27-lora --hub_model_id me/blip2-opt27-alt-text [--scores scores.json]
    python recipes/publish.py --output_dir outputs/opt27-lora --hub_model_id me/x --dry_run true   # stage only

For a LoRA/QLoRA run only the adapter (adapter_config.json, adapter_model.safetensors) and README.md
go up: the base model stays where it is on the Hub, named in the adapter's config and the card. A
full fine-tune uploads the model and its processor. The card's memory and time numbers come from the
run's record in the results file (see callbacks/results.py); its scores from recipes/score.py --output.
"""

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import altscale.patches.bitsandbytes  # noqa: F401  (first: it quiets a bitsandbytes import-time warning)
from altscale.artifacts.publish import build_model_card, find_record, push_staged, stage_for_hub
from altscale.config.errors import ConfigError, DataError, run_cli


@dataclass
class PublishArguments:
    output_dir: str = field(default=None, metadata={"help": "The trained run's output_dir (a model folder, or an adapter folder)."})
    hub_model_id: str = field(default=None, metadata={"help": "The Hub repository to push to, owner/name."})
    results_file: str = field(default="runs/results.jsonl", metadata={"help": "Where the run's record is; the newest one for output_dir is used."})
    scores: str | None = field(default=None, metadata={"help": "A JSON file written by recipes/score.py --output, for the card's results."})
    staging_dir: str | None = field(default=None, metadata={"help": "Where to stage the upload; default: <output_dir>/hub-staging."})
    hub_private_repo: bool = field(default=False, metadata={"help": "Create the repository as private."})
    dry_run: bool = field(default=False, metadata={"help": "Stage and print the files, upload nothing."})


def main(argv: list[str] | None = None) -> dict:
    from altscale.families.blip2.captioner import load_captioner
    from altscale.config.arguments import Parser

    (args,) = Parser(PublishArguments).parse_args_into_dataclasses(args=argv)
    problems = [f"--{name}: required" for name in ("output_dir", "hub_model_id") if not getattr(args, name)]
    if args.hub_model_id and args.hub_model_id.count("/") != 1:
        problems.append(f"--hub_model_id {args.hub_model_id!r}: use owner/name")
    if problems:
        raise ConfigError("\n".join(problems))
    out = Path(args.output_dir)
    if not out.is_dir():
        raise ConfigError(f"--output_dir {out}: no such folder; give the output_dir of a finished training run")
    is_adapter = (out / "adapter_config.json").is_file()
    model, processor, _ = load_captioner(None if is_adapter else str(out), adapter=str(out) if is_adapter else None)
    scores = None
    if args.scores:
        if not Path(args.scores).is_file():
            raise DataError(f"--scores {args.scores}: no such file; write it with recipes/score.py ... --output {args.scores}")
        scores = json.loads(Path(args.scores).read_text())
    record = find_record(args.results_file, out)
    if record is None:
        print(f"note: no record of {out} in {args.results_file}; the card leaves out memory and time", file=sys.stderr)
    staging = Path(args.staging_dir or out / "hub-staging")
    if args.staging_dir is None and staging.is_dir():
        shutil.rmtree(staging)  # the default staging folder is ours; a previous publish left it
    files = stage_for_hub(model, processor, staging, build_model_card(model, args.hub_model_id, record, scores))
    print(f"staged in {staging}: {', '.join(files)}")
    url = None if args.dry_run else push_staged(staging, args.hub_model_id, private=args.hub_private_repo)
    print(f"pushed to {url}" if url else "dry run: nothing uploaded")
    return {"staging_dir": str(staging), "files": files, "url": url}


def run(argv: list[str] | None = None) -> int:
    return run_cli(main, argv)


if __name__ == "__main__":
    sys.exit(run())
