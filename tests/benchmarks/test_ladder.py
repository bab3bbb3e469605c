"""The ladder runner: every step in its own process, OOMs recorded and passed, one table at the end."""

import sys

from altscale.benchmarks import ladder


def test_every_ladder_step_has_a_recipe():
    for name in ladder.ladder_names():
        assert (ladder.ROOT / "recipes" / "blip2" / f"{name}.yaml").is_file(), name
    assert len(ladder.ladder_names()) == 15


def test_bench_mode_stops_early_and_keeps_a_recipes_own_max_steps():
    command = ladder.step_command("opt27-bf16", results_file="r.jsonl", bench=True, launcher=["python"])
    assert command[-4:] == ["--max_steps", "3", "--save_model", "false"]
    command = ladder.step_command("xxl-bf16-zero2-offload", results_file="r.jsonl", bench=True, launcher=["python"])
    assert "--max_steps" not in command


def test_an_oom_step_is_recorded_and_the_ladder_goes_on(tmp_path, monkeypatch, capsys):
    photos = tmp_path / "food"
    from altscale.data.synthetic import make_synthetic_dataset

    make_synthetic_dataset(photos, num_train=32, num_test=4, seed=3, size=64)
    results = tmp_path / "results.jsonl"
    tiny = ["--model_name_or_path", "blip2-tiny-opt", "--dataset_path", str(photos), "--output_dir", str(tmp_path / "o"),
            "--dataloader_num_workers", "0", "--num_sample_captions", "0", "--per_device_train_batch_size", "8",
            "--overwrite_output_dir", "true", "--max_steps", "2", "--results_file", str(results)]
    # The first step runs out of memory inside the real script (an injected OOM); the second trains normally.
    oom = [sys.executable, "-c",
           "import sys, torch; from recipes import train; "
           "train.Trainer.training_step = lambda *a, **k: (_ for _ in ()).throw(torch.cuda.OutOfMemoryError('injected')); "
           f"sys.exit(train.run(sys.argv[1:]))", *tiny]
    ok = [sys.executable, str(ladder.ROOT / "recipes" / "train.py"), *tiny]
    commands = {"opt27-fp32-b64": oom, "opt27-fp32-b16": ok}
    monkeypatch.setattr(ladder, "step_command", lambda name, **kwargs: commands[name])
    code = ladder.main(["opt27-fp32-b64", "opt27-fp32-b16", "--results-file", str(results),
                        "--log-dir", str(tmp_path / "logs")])
    out = capsys.readouterr().out
    table = out[out.index("\nladder"):].splitlines()
    assert code == 0
    # The stand-in runs write records named "command-line", so the rows come from the exit codes here.
    assert table[3].split()[:2] == ["opt27-fp32-b64", "oom"]
    assert table[4].split()[:2] == ["opt27-fp32-b16", "ok"]
    assert (tmp_path / "logs" / "opt27-fp32-b64.log").read_text().count("OOM at step 0") == 1


def test_unknown_step_names_the_known_ones(capsys):
    assert ladder.main(["opt99"]) == 2
    assert "steps are: opt27-fp32-b64" in capsys.readouterr().err
