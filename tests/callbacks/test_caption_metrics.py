"""Caption metrics at each evaluation (callbacks/caption_metrics.py), off by default."""

from altscale.data.synthetic import make_synthetic_dataset
from recipes import train


def test_training_can_score_captions_at_each_evaluation(tmp_path):
    make_synthetic_dataset(tmp_path / "food", num_train=16, num_test=4, size=32)
    result = train.main(["--dataset_path", str(tmp_path / "food"), "--output_dir", str(tmp_path / "out"),
                         "--results_file", str(tmp_path / "r.jsonl"), "--max_steps", "2", "--per_device_train_batch_size", "4",
                         "--dataloader_num_workers", "0", "--num_sample_captions", "0", "--disable_tqdm", "true",
                         "--eval_strategy", "steps", "--eval_steps", "2", "--caption_metrics_samples", "3", "--max_new_tokens", "5"])
    scored = [entry for entry in result["log_history"] if "eval_caption_cider" in entry]
    assert len(scored) == 1 and scored[0]["step"] == 2 and "eval_caption_exact_match" in scored[0]
