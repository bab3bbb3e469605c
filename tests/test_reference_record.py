"""Moving code must not change what a run does: the tiny demo's record equals the one written before the move."""

import json
from pathlib import Path

from tests.reference_record import differences, run_tiny_demo

REFERENCE = Path(__file__).parent / "reference" / "tiny_demo_record.json"


def test_tiny_demo_record_equals_the_reference_to_1e_6(tmp_path):
    expected = json.loads(REFERENCE.read_text())
    actual = json.loads(json.dumps(run_tiny_demo(tmp_path)))  # the same types as the file: lists, not tuples
    found = differences(expected, actual)
    assert not found, "the run differs from tests/reference/tiny_demo_record.json:\n" + "\n".join(found[:20])


def test_the_comparison_sees_a_change_beyond_1e_6():
    expected = json.loads(REFERENCE.read_text())
    changed = json.loads(REFERENCE.read_text())
    changed["losses"][0] *= 1 + 1e-5
    changed["snapshots"][0]["params_cpu"] += 4
    assert len(differences(expected, changed)) == 2
