"""A recipe's TrainingArguments value changes in one place only, config/adjust.py's adjust_training_args, which
records asked, used and why for the run record. Any other assignment would change a user's value silently."""

import ast
import subprocess
from dataclasses import fields
from pathlib import Path

from transformers import TrainingArguments

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = ("config/adjust.py", "adjust_training_args")
FIELDS = {f.name for f in fields(TrainingArguments)}


def model_config(owner: ast.AST) -> bool:
    """`self.<x>`, or a model's config (`config`, `<module>.config`, `text_config`): transformers' model
    configs share names such as use_cache with TrainingArguments (FSDP's checkpointing turns the KV cache off)."""
    name = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else None
    return name is not None and (name == "self" or name.endswith("config"))


def assignments(tree: ast.AST) -> list[tuple[int, str, str | None]]:
    """(line, field, enclosing function) of every `<not self>.<TrainingArguments field> = ...` and
    `setattr(<obj>, "<field>", ...)`."""
    found = []

    def visit(node: ast.AST, function: str | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for element in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if isinstance(element, ast.Attribute) and element.attr in FIELDS and not model_config(element.value):
                    found.append((node.lineno, element.attr, function))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in FIELDS):
            found.append((node.lineno, node.args[1].value, function))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return found


def engine_files() -> list[str]:
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [path for path in tracked.stdout.split() if not path.startswith("tests/")]


def test_training_arguments_are_assigned_only_in_the_adjustment_function():
    offending = []
    for path in engine_files():
        for line, field, function in assignments(ast.parse((ROOT / path).read_text())):
            if (path, function) != ALLOWED:
                offending.append(f"{path}:{line}: {field} assigned in {function or 'module level'}")
    assert not offending, ("TrainingArguments fields may change only in config/adjust.py adjust_training_args, "
                           "which records the change:\n" + "\n".join(offending))


def test_the_check_sees_assignments_and_setattr_but_not_self():
    code = ("def f(args, t):\n    args.training.learning_rate = 1\n    setattr(t, 'seed', 3)\n"
            "    t.output_dir, x = 'a', 1\n    model.config.text_config.use_cache = False\nclass C:\n    def g(self):\n        self.seed = 1\n")
    assert [(line, field) for line, field, _ in assignments(ast.parse(code))] == [
        (2, "learning_rate"), (3, "seed"), (4, "output_dir")]


def test_the_adjustment_function_exists_where_the_rule_says():
    tree = ast.parse((ROOT / ALLOWED[0]).read_text())
    assert ALLOWED[1] in {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert {field for _, field, _ in assignments(tree)} >= {"learning_rate", "gradient_checkpointing", "push_to_hub"}
