"""Our own writes are atomic; overwriting removes the old run's checkpoints; `last` finds the newest."""

import json
from types import SimpleNamespace

import pytest

from altscale.artifacts import output_dir as outputs


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    outputs.write_json_atomic(path, {"run": 1})
    monkeypatch.setattr(outputs.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        outputs.write_json_atomic(path, {"run": 2})
    assert json.loads(path.read_text()) == {"run": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temp file left behind


def test_last_is_the_highest_step_not_the_latest_name(tmp_path):
    for step in (5, 40, 100):
        (tmp_path / f"checkpoint-{step}").mkdir()
    assert outputs.resolve_checkpoint(str(tmp_path), "last") == str(tmp_path / "checkpoint-100")
    assert outputs.resolve_checkpoint(str(tmp_path), "some/folder") == "some/folder"


def test_overwriting_removes_the_old_checkpoints_only(tmp_path, capsys):
    (tmp_path / "checkpoint-1000").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    args = SimpleNamespace(strategy=SimpleNamespace(overwrite_output_dir=True),
                           training=SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint=None, process_index=0))
    assert outputs.prepare_output_dir(args) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert "removed 1 old checkpoint folders" in capsys.readouterr().out


def test_resuming_keeps_the_checkpoints_even_with_overwrite(tmp_path):
    (tmp_path / "checkpoint-3").mkdir()
    args = SimpleNamespace(strategy=SimpleNamespace(overwrite_output_dir=True),
                           training=SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint="last", process_index=0))
    assert outputs.prepare_output_dir(args) == str(tmp_path / "checkpoint-3")
    assert (tmp_path / "checkpoint-3").is_dir()
