"""The training script end to end on CPU: tiny BLIP-2, tiny synthetic data."""

import json

import pytest
import torch
from transformers import Blip2ForConditionalGeneration, Blip2Processor

from altscale.families.blip2.collate import CaptionCollator
from altscale.families.blip2.generation import generate_captions
from recipes import train
from altscale.config.arguments import parse_args

TINY_RUN = ["--dataloader_num_workers", "0", "--disable_tqdm", "true", "--per_device_train_batch_size", "16",
            "--learning_rate", "1e-3", "--warmup_steps", "10", "--weight_decay", "0", "--num_sample_captions", "4"]


@pytest.fixture(scope="module")
def photos(synthetic_photos):
    return synthetic_photos(num_train=320, num_test=32, seed=1, size=64)


def run_args(tmp_path, photos, *extra):
    return ["--dataset_path", photos, "--output_dir", str(tmp_path / "out"),
            "--results_file", str(tmp_path / "results.jsonl"), *TINY_RUN, *extra]


@pytest.mark.parametrize("preset", ["blip2-tiny-opt", "blip2-tiny-t5"])
def test_held_out_loss_falls_far_below_the_untrained_models(tmp_path, photos, preset):
    result = train.main(run_args(tmp_path, photos, "--model_name_or_path", preset, "--max_steps", "100",
                                 "--eval_strategy", "steps", "--eval_steps", "100", "--eval_on_start", "true"))
    evals = [entry["eval_loss"] for entry in result["log_history"] if "eval_loss" in entry]
    assert len(evals) == 2
    untrained, trained = evals
    assert trained < 0.5 * untrained, evals  # untrained: about ln(vocab) = 6.9
    record = json.loads((tmp_path / "results.jsonl").read_text())
    assert record["status"] == "ok" and record["summary"]["optimizer_steps"] == 100


def test_saved_model_reloads_and_writes_the_same_captions(tmp_path, photos):
    argv = run_args(tmp_path, photos, "--max_steps", "20")
    result = train.main(argv)
    out = result["output_dir"]
    model = Blip2ForConditionalGeneration.from_pretrained(out)
    processor = Blip2Processor.from_pretrained(out)
    collator = CaptionCollator(processor, decoder_only=True)
    _, eval_set = train.build_datasets(parse_args(argv))
    written = generate_captions(model, collator, list(eval_set["image"]))
    assert [alt for alt, _ in result["captions"]["samples"]] == written
    assert all(alt.strip() for alt in written)  # alt text is never empty


def test_bf16_mixed_and_bf16_true_run_on_cpu(tmp_path, photos):
    for precision in ("bf16-mixed", "bf16-true"):
        result = train.main(run_args(tmp_path / precision, photos, "--max_steps", "3", "--precision", precision,
                                     "--use_cpu", "true", "--num_sample_captions", "0"))
        effective = result["record"]["effective_config"]
        expected = "torch.bfloat16" if precision == "bf16-true" else "torch.float32"
        assert list(effective["param_dtypes"]) == [expected]
        assert effective["bf16"] is (precision == "bf16-mixed")


def test_user_errors_end_in_one_message_and_exit_code_2(tmp_path, capsys):
    code = train.run(["--dataset_path", str(tmp_path / "missing"), "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == train.EXIT_USER_ERROR
    assert err.startswith("error: ") and "Traceback" not in err and str(tmp_path / "missing") in err


def test_out_of_memory_is_recorded_and_exits_with_its_own_code(tmp_path, photos, capsys, monkeypatch):
    def no_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (injected)")

    monkeypatch.setattr(train.Trainer, "training_step", no_memory)
    code = train.run(run_args(tmp_path, photos, "--max_steps", "5"))
    err = capsys.readouterr().err
    assert code == train.EXIT_OOM
    assert "OOM at step 0 before_fwd" in err and "advice:" in err and "Traceback" not in err
    record = json.loads((tmp_path / "results.jsonl").read_text())
    assert record["status"] == "oom" and record["error"].startswith("OutOfMemoryError")
