"""recipes/publish.py: the exact files staged for the Hub, the model card, and that they reload. No upload."""

import json
from pathlib import Path

import pytest
from PIL import Image

from altscale.data.sample_page.draw import PHOTOS
from altscale.families.blip2.captioner import build_collator, load_captioner, write_alt_text
from recipes import publish, train
from altscale.config.errors import ConfigError
from tests.recipes.alt_text_models import save_tiny_model, tiny_lora

IMAGES = [Image.open(Path("data/sample_page/images") / name).convert("RGB") for name in PHOTOS]
RECORD = {
    "recipe": "tiny-opt-lora", "strategy": "lora", "world_size": 1, "device_name": "NVIDIA H100 80GB HBM3",
    "config": {"model": {"model_name_or_path": "Salesforce/blip2-opt-2.7b"}, "data": {"dataset_path": "data/synthetic_food", "train_split": "train"}},
    "summary": {"train_time_s": 123.4, "optimizer_steps": 50, "samples_per_s": 12.5, "peak_allocated_bytes": 3 * 1024**3, "final_loss": 0.25},
}
SCORES = {"dataset_path": "data/synthetic_food", "split": "test", "captions": [{}] * 100, "scores": {"cider": 8.5, "bleu": 0.9}}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("base"))


def test_lora_stages_the_adapter_and_card_only_and_reloads_to_the_same_captions(base, tmp_path):
    model, processor = tiny_lora(base)
    card = publish.build_model_card(model, "me/tiny-alt", RECORD, SCORES)
    files = publish.stage_for_hub(model, processor, tmp_path / "staging", card)
    assert files == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    assert (tmp_path / "staging" / "README.md").read_text() == card
    written = write_alt_text(model, build_collator(model, processor), IMAGES, max_new_tokens=8)
    reloaded, reloaded_processor, described = load_captioner(None, adapter=str(tmp_path / "staging"))
    assert described == f"pretrained {base} + adapter {tmp_path / 'staging'}"  # the base named in adapter_config.json
    assert write_alt_text(reloaded, build_collator(reloaded, reloaded_processor), IMAGES, max_new_tokens=8) == written
    plain, plain_processor, _ = load_captioner(base)
    assert write_alt_text(plain, build_collator(plain, plain_processor), IMAGES, max_new_tokens=8) != written  # the adapter matters


def test_model_card_says_what_how_on_what_and_at_what_cost(base):
    model, _ = tiny_lora(base)
    card = publish.build_model_card(model, "me/tiny-alt", RECORD, SCORES)
    assert card.startswith(f"---\nlibrary_name: peft\nbase_model: {base}\npipeline_tag: image-to-text\n")
    for expected in ["# me/tiny-alt", "| strategy | LoRA: r=4, alpha=8, dropout=0.0, target modules q_proj, v_proj |",
                     "| recipe | `tiny-opt-lora` |", "| data | `data/synthetic_food`, split `train` |",
                     "(100 captions)", "| cider | 8.5000 |", "| device | 1 × NVIDIA H100 80GB HBM3 |",
                     "| training time | 123 s, 50 optimizer steps |", "| peak GPU memory | 3.00 GiB |",
                     "| final training loss | 0.2500 |", "python recipes/generate.py --adapter me/tiny-alt"]:
        assert expected in card
    bare = publish.build_model_card(model, "me/tiny-alt")  # no record, no scores: the sections are left out
    assert "## Memory and time" not in bare and "## Results" not in bare


def test_full_model_stages_weights_and_processor(base, tmp_path):
    model, processor, _ = load_captioner(base)
    files = publish.stage_for_hub(model, processor, tmp_path / "staging", publish.build_model_card(model, "me/full"))
    assert {"README.md", "config.json", "model.safetensors", "processor_config.json", "tokenizer.json"} <= set(files)
    assert "library_name: transformers" in (tmp_path / "staging" / "README.md").read_text()
    with pytest.raises(ConfigError, match="staging_dir .* is not empty; everything in it would be uploaded"):
        publish.stage_for_hub(model, processor, tmp_path / "staging", "card")


def test_cli_dry_run_finds_the_run_record_and_offline_push_says_where_the_files_wait(base, tmp_path, capsys):
    model, _ = tiny_lora(base)
    out = tmp_path / "run"
    model.save_pretrained(out)
    record = {**RECORD, "status": "ok", "config": {**RECORD["config"], "training_args": {"output_dir": str(out)}}}
    (tmp_path / "results.jsonl").write_text(json.dumps(record) + "\n")
    result = publish.main(["--output_dir", str(out), "--hub_model_id", "me/x", "--dry_run", "true",
                           "--results_file", str(tmp_path / "results.jsonl")])
    assert result["files"] == ["README.md", "adapter_config.json", "adapter_model.safetensors"] and result["url"] is None
    assert "123 s, 50 optimizer steps" in (out / "hub-staging" / "README.md").read_text()
    with pytest.raises(ConfigError, match=r"push to me/x failed .*the files are staged in"):
        publish.push_staged(out / "hub-staging", "me/x")  # HF_HUB_OFFLINE=1 (tests/conftest.py): no request is made
    with pytest.raises(ConfigError, match="--hub_model_id 'x': use owner/name"):
        publish.main(["--output_dir", str(out), "--hub_model_id", "x"])
    with pytest.raises(ConfigError, match="--output_dir .*nowhere: no such folder"):
        publish.main(["--output_dir", str(tmp_path / "nowhere"), "--hub_model_id", "me/x"])


def test_a_preset_base_under_an_adapter_is_refused(base, tmp_path):
    model, _ = tiny_lora(base)
    model.save_pretrained(tmp_path / "adapter")
    with pytest.raises(ConfigError, match="is a preset, which has random weights"):
        load_captioner("blip2-tiny-opt", adapter=str(tmp_path / "adapter"))


def test_training_with_push_to_hub_stages_adapter_and_card(tmp_path):
    from altscale.data.synthetic import make_synthetic_dataset

    make_synthetic_dataset(tmp_path / "food", num_train=32, num_test=4, size=32)
    argv = ["--dataset_path", str(tmp_path / "food"), "--output_dir", str(tmp_path / "out"), "--results_file", str(tmp_path / "r.jsonl"),
            "--max_steps", "2", "--per_device_train_batch_size", "4", "--dataloader_num_workers", "0", "--num_sample_captions", "0",
            "--use_peft", "true", "--lora_r", "4", "--push_to_hub", "true", "--hub_model_id", "me/tiny-lora", "--disable_tqdm", "true"]
    with pytest.raises(ConfigError, match="push to me/tiny-lora failed"):  # offline: the Trainer never tried to push itself
        train.main(argv)
    staged = tmp_path / "out" / "hub-staging"
    assert sorted(p.name for p in staged.iterdir()) == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    assert "| training time |" in (staged / "README.md").read_text()


def test_the_trainers_args_do_not_push_and_the_recipes_keep_the_users_value():
    from altscale.config.adjust import adjust_training_args
    from altscale.config.arguments import parse_args
    from altscale.strategies.launch import plan_launch

    args = parse_args(["--output_dir", "x", "--push_to_hub", "true", "--hub_model_id", "me/x"])
    trainer_args, changes = adjust_training_args(args, plan_launch(args, environ={}))
    assert trainer_args.push_to_hub is False and args.training.push_to_hub is True
    assert trainer_args is not args.training and trainer_args.hub_model_id == args.training.hub_model_id == "me/x"
    assert changes["push_to_hub"]["asked"] is True and "publish.py" in changes["push_to_hub"]["used"]
    # Without push_to_hub the Trainer gets the recipe's own arguments, and nothing is recorded
    args = parse_args(["--output_dir", "x"])
    trainer_args, changes = adjust_training_args(args, plan_launch(args, environ={}))
    assert trainer_args is args.training and "push_to_hub" not in changes
