"""Callbacks observe: no engine code assigns a callback's attributes from outside the callback's own class.

A trainer that has something to tell its callbacks (CUDA graph replays run no forward hook and allocate nothing the
allocator's counters see) fills a plain object the recipe handed to both: strategies/cuda_graphs.py's GraphedRun.
Reaching into a callback instead couples it to whoever does so, and to the order things happen in.

The check reads the source: an assignment `<something>.<name> = ...` (or `setattr(<something>, "<name>", ...)`) whose
object is not `self`, where `<name>` is an attribute some callback class in callbacks/ sets in its `__init__`.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ("strategies", "recipes", "config", "families", "callbacks", "artifacts", "data", "models", "patches")


def _name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _targets(node: ast.AST) -> list[ast.expr]:
    """Every expression an assignment statement writes to, tuples unpacked."""
    if isinstance(node, ast.Assign):
        found = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        found = [node.target]
    else:
        return []
    flat = []
    while found:
        target = found.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            found.extend(target.elts)
        elif isinstance(target, ast.Starred):
            found.append(target.value)
        else:
            flat.append(target)
    return flat


def callback_attributes(folder: Path = ROOT / "callbacks") -> set[str]:
    """The attributes callback classes (a base named *Callback) set on `self` in their `__init__`."""
    names = set()
    for path in sorted(folder.glob("*.py")):
        for cls in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(cls, ast.ClassDef) and any(_name(b).endswith("Callback") for b in cls.bases)):
                continue
            for init in (f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"):
                for node in ast.walk(init):
                    names.update(t.attr for t in _targets(node) if isinstance(t, ast.Attribute) and _is_self(t.value))
    return names


def writes_from_outside(source: str, attributes: set[str], where: str = "<source>") -> list[str]:
    """`file:line: code` for each assignment (or setattr) of one of `attributes` on an object other than `self`."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        written = [t for t in _targets(node) if isinstance(t, ast.Attribute) and not _is_self(t.value)
                   and t.attr in attributes]
        if isinstance(node, ast.Call) and _name(node.func) == "setattr" and len(node.args) >= 2:
            obj, name = node.args[:2]
            if not _is_self(obj) and isinstance(name, ast.Constant) and name.value in attributes:
                written.append(node)
        if written:
            found.append((node.lineno, f"{where}:{node.lineno}: {ast.unparse(node).splitlines()[0]}"))
    return [line for _, line in sorted(found)]


def test_the_checker_sees_the_attributes_and_the_writes_it_is_for():
    attributes = callback_attributes()
    # Run summary, memory, interrupt: a collector that found nothing would pass every file.
    assert {"counts", "rows", "graphed_run", "memory", "every"} <= attributes, sorted(attributes)
    # The wiring this replaced, in GraphedTrainer.training_step:
    before = ("memory.graphed_steps = self.graphed_steps\n"
              "for callback in counters:\n    callback.counts_forward = False\n"
              "setattr(memory, 'graphed_steps', None)\n"
              "cb.a, (cb.b, cb.c) = 1, (2, 3)\n"
              "self.counts_forward = True\nself.graphed_steps = None\nrun.steps = None\n")
    flagged = writes_from_outside(before, {"graphed_steps", "counts_forward", "c"})
    assert [line.split(": ", 1)[0] for line in flagged] == ["<source>:1", "<source>:3", "<source>:4", "<source>:5"]


def test_no_engine_code_writes_into_a_callback():
    attributes = callback_attributes()
    found = []
    for folder in ENGINE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += writes_from_outside(path.read_text(), attributes, str(path.relative_to(ROOT)))
    assert found == [], "hand the callback an object it reads instead (see this test's docstring):\n" + "\n".join(found)
