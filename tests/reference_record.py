"""The tiny demo's run record, reduced to what must not change when code moves: losses, memory bytes per category
at each phase, the effective configuration and the recipe's resolved configuration.

    python -m tests.reference_record --write tests/reference/tiny_demo_record.json

The committed file was written at 95c4649, the commit before the engine left recipes/ (issue 14);
tests/test_reference_record.py reruns the same short demo and compares to 1e-6. Wall-clock values (times,
throughput, resident memory) and where the run wrote are left out: they differ between any two runs.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

STEPS = 6
# Everything that varies between two runs of the same code: times, host memory, paths, the commit.
VOLATILE_KEYS = {"time_s", "rss_bytes", "build_time_s", "output_dir", "logging_dir", "dataset_path", "results_file", "run_name"}


def run_tiny_demo(work: Path) -> dict:
    from altscale.data.synthetic import make_synthetic_dataset
    from recipes import train

    make_synthetic_dataset(work / "food", num_train=64, num_test=16, seed=3, size=64)
    result = train.main([
        "recipes/blip2/tiny-opt-demo.yaml", "--dataset_path", str(work / "food"), "--output_dir", str(work / "out"),
        "--results_file", str(work / "results.jsonl"), "--max_steps", str(STEPS), "--logging_steps", "1",
        "--memory_log_steps", "2", "--dataloader_num_workers", "0", "--num_sample_captions", "0",
        "--eval_strategy", "no", "--disable_tqdm", "true", "--save_model", "false",
    ])
    return reduce_record(result["record"], result["log_history"])


def _strip(value):
    if isinstance(value, dict):
        return {key: _strip(item) for key, item in value.items() if key not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [_strip(item) for item in value]
    return value


def reduce_record(record: dict, log_history: list[dict]) -> dict:
    return {
        "losses": [entry["loss"] for entry in log_history if "loss" in entry],
        "grad_norms": [entry["grad_norm"] for entry in log_history if "grad_norm" in entry],
        "snapshots": _strip(record["snapshots"]),
        "effective_config": _strip(record["effective_config"]),
        "config": _strip(record["config"]),
        "optimizer_steps": record["summary"]["optimizer_steps"],
        "samples": record["summary"]["samples"],
        "tokens": record["summary"]["tokens"],
        "flops_per_sample": record["summary"]["flops_per_sample"],
    }


def differences(expected, actual, where: str = "", rel: float = 1e-6) -> list[str]:
    """Every place where two reduced records differ: numbers beyond `rel`, anything else at all."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        found = [f"{where}.{key}: missing after the change" for key in expected.keys() - actual.keys()]
        found += [f"{where}.{key}: new after the change" for key in actual.keys() - expected.keys()]
        for key in expected.keys() & actual.keys():
            found += differences(expected[key], actual[key], f"{where}.{key}", rel)
        return found
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{where}: {len(expected)} items before, {len(actual)} after"]
        return [problem for i, (a, b) in enumerate(zip(expected, actual)) for problem in differences(a, b, f"{where}[{i}]", rel)]
    numbers = (int, float)
    if isinstance(expected, numbers) and isinstance(actual, numbers) and not isinstance(expected, bool):
        if math.isclose(expected, actual, rel_tol=rel, abs_tol=rel):
            return []
    elif expected == actual:
        return []
    return [f"{where}: {expected!r} before, {actual!r} after"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", required=True, help="where to write the reduced record (JSON)")
    out = Path(parser.parse_args().write)
    with tempfile.TemporaryDirectory() as work:
        reduced = run_tiny_demo(Path(work))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(reduced, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
