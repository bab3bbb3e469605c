"""Publishing a trained model to the Hub: stage exactly the files to upload, with a model card, then upload.

Used after training by recipes/train.py (push_to_hub) and by recipes/publish.py for a finished run. For a LoRA/QLoRA run only the adapter (adapter_config.json, adapter_model.safetensors) and README.md
go up: the base model stays where it is on the Hub, named in the adapter's config and the card. A
full fine-tune uploads the model and its processor. The card's memory and time numbers come from the
run's record in the results file (see callbacks/results.py); its scores from recipes/score.py --output.
"""

import shutil
from pathlib import Path

from peft import PeftModel

from altscale.callbacks.results import read_records
from altscale.config.errors import ConfigError

GIB = 1024**3
CARD_METRICS = ("bleu", "rougeL", "cider", "meteor", "exact_match", "token_f1")  # score.py's headline numbers



def describe_strategy(model, record: dict | None = None) -> str:
    """lora, qlora or full, plus the adapter's shape."""
    if not isinstance(model, PeftModel):
        return "full fine-tune"
    config = model.peft_config[model.active_adapter]
    base = model.get_base_model()
    quantized = getattr(base, "is_loaded_in_4bit", False) or getattr(base, "is_loaded_in_8bit", False)
    if record and isinstance(record.get("strategy"), str):
        quantized = quantized or "qlora" in record["strategy"].lower()
    name = "QLoRA (4-bit base)" if quantized else "LoRA"
    targets = ", ".join(sorted(config.target_modules)) if config.target_modules else "default"
    return f"{name}: r={config.r}, alpha={config.lora_alpha}, dropout={config.lora_dropout}, target modules {targets}"


def base_model_name(model, record: dict | None = None) -> str:
    if isinstance(model, PeftModel):
        name = model.peft_config[model.active_adapter].base_model_name_or_path
        if name:
            return name
    return ((record or {}).get("config", {}).get("model") or {}).get("model_name_or_path") or model.config.name_or_path or "unknown"


def _row(label: str, value) -> str:
    return f"| {label} | {value} |"


def build_model_card(model, repo_id: str, record: dict | None = None, scores: dict | None = None) -> str:
    """README.md for the Hub: metadata header, what was trained on what, scores, and the run's memory and time."""
    is_adapter = isinstance(model, PeftModel)
    base = base_model_name(model, record)
    record = record or {}
    data = record.get("config", {}).get("data") or {}
    summary = record.get("summary") or {}
    header = ["---", f"library_name: {'peft' if is_adapter else 'transformers'}", f"base_model: {base}",
              "pipeline_tag: image-to-text", "tags:", "- altscale", "- alt-text", "- blip-2"]
    header += ["- lora"] if is_adapter else []
    lines = header + ["---", "", f"# {repo_id}", "",
                      f"Writes alt text for food photos. {'An adapter for' if is_adapter else 'A fine-tune of'} "
                      f"`{base}`, trained with altscale's recipes.", "", "## Training", "", "| | |", "| --- | --- |",
                      _row("base model", f"`{base}`"), _row("strategy", describe_strategy(model, record))]
    if record.get("recipe"):
        lines.append(_row("recipe", f"`{record['recipe']}`"))
    if data:
        lines.append(_row("data", f"`{data.get('dataset_path')}`, split `{data.get('train_split')}`"
                          + (f", prompt {data['prompt']!r}" if data.get("prompt") else "")))
    if scores:
        lines += ["", "## Results", "", f"On `{scores.get('dataset_path')}`, split `{scores.get('split')}` "
                  f"({len(scores.get('captions', []))} captions), by `recipes/score.py`:", "", "| metric | score |", "| --- | --- |"]
        lines += [_row(key, f"{scores['scores'][key]:.4f}") for key in CARD_METRICS if key in scores.get("scores", {})]
    if summary:
        peak = summary.get("peak_allocated_bytes")
        lines += ["", "## Memory and time", "", "| | |", "| --- | --- |",
                  _row("device", f"{record.get('world_size', 1)} × {record.get('device_name', 'unknown')}"),
                  _row("training time", f"{summary.get('train_time_s', 0):.0f} s, {summary.get('optimizer_steps')} optimizer steps"),
                  _row("throughput", f"{summary.get('samples_per_s') or 0:.1f} samples/s"),
                  _row("peak GPU memory", f"{peak / GIB:.2f} GiB" if peak else "n/a (CPU run)"),
                  _row("final training loss", f"{summary['final_loss']:.4f}" if summary.get("final_loss") is not None else "n/a")]
    usage = f"--adapter {repo_id}" if is_adapter else f"--model_name_or_path {repo_id}"
    lines += ["", "## Use", "", "```bash", f"python recipes/generate.py {usage} --images photo.jpg", "```", ""]
    return "\n".join(lines)


def stage_for_hub(model, processor, staging_dir: str | Path, card: str) -> list[str]:
    """Write exactly what will be uploaded to staging_dir (missing or empty); returns the file names."""
    staging = Path(staging_dir)
    if staging.exists() and any(staging.iterdir()):
        raise ConfigError(f"staging_dir {staging} is not empty; everything in it would be uploaded, so remove it or choose another")
    staging.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(staging)  # a PeftModel saves its adapter only
    if not isinstance(model, PeftModel):
        processor.save_pretrained(staging)  # a full model carries its own processor; an adapter uses its base's
    (staging / "README.md").write_text(card)  # replaces the card peft writes
    return sorted(str(path.relative_to(staging)) for path in staging.rglob("*") if path.is_file())


def push_staged(staging_dir: str | Path, repo_id: str, private: bool = False, token: str | None = None) -> str:
    """Upload the staged folder as one commit; returns the commit URL."""
    from huggingface_hub import create_repo, upload_folder

    try:
        create_repo(repo_id, private=private, exist_ok=True, token=token)
        commit = upload_folder(repo_id=repo_id, folder_path=str(staging_dir), token=token,
                               commit_message="Upload alt-text model from altscale")
    except Exception as err:  # network, auth and permission errors all end the same way: the files wait in staging
        raise ConfigError(
            f"push to {repo_id} failed ({err.__class__.__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
            f"the files are staged in {staging_dir}: log in (`hf auth login`) and run "
            f"`python recipes/publish.py --output_dir <run> --hub_model_id {repo_id}`"
        ) from None
    return str(commit.commit_url)


def publish_run(args, model, processor, record: dict | None, scores: dict | None = None) -> dict:
    """After training with push_to_hub: stage <output_dir>/hub-staging and upload it to hub_model_id."""
    training = args.training
    repo_id = training.hub_model_id or Path(training.output_dir).name  # the Trainer's default repository name
    staging = Path(training.output_dir) / "hub-staging"
    if staging.is_dir():
        shutil.rmtree(staging)  # ours, from an earlier run into the same output_dir
    files = stage_for_hub(model, processor, staging, build_model_card(model, repo_id, record, scores))
    url = push_staged(staging, repo_id, private=bool(training.hub_private_repo), token=training.hub_token)
    print(f"pushed {', '.join(files)} to {url}")
    return {"repo_id": repo_id, "staging_dir": str(staging), "files": files, "url": url}


def find_record(results_file: str | Path, output_dir: str | Path) -> dict | None:
    """The newest successful record of the run that wrote output_dir."""
    wanted = Path(output_dir).resolve()
    for record in reversed(read_records(results_file)):
        run_dir = record.get("config", {}).get("training_args", {}).get("output_dir")
        if record.get("status") == "ok" and run_dir and Path(run_dir).resolve() == wanted:
            return record
    return None

