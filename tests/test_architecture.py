"""The design's rules, read from the source (docs/architecture.md says why each holds).

Each rule is a checker over one file's syntax tree that returns `path:line: what` for every offence, so a failure
names where to look. Only code counts: docstrings and comments may mention anything. Each checker is also run on
a small offending snippet, so that a checker that has gone blind fails too.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The folders installed as `altscale.<folder>` (pyproject.toml): the engine.
ENGINE = ("artifacts", "callbacks", "config", "data", "families", "metrics", "models", "patches", "strategies")
# The engine outside the family folders: it asks `families.family_for` and never names a model class.
FAMILY_FREE = tuple(folder for folder in ENGINE if folder != "families")
MODEL_CLASS = re.compile(r"^(Blip2|Blip|OPT|T5)[A-Z]\w*")


def is_model_class(name: str) -> bool:
    """`OPTDecoderLayer`, `T5Block`, `Blip2Config`; not an upper-case constant such as `OPTIMIZERS`."""
    return bool(MODEL_CLASS.match(name)) and not name.isupper()
SKIPPED_DIRS = {".git", ".venv", "venv", "build", "dist", "__pycache__", "node_modules"}


@functools.cache
def python_files() -> tuple[Path, ...]:
    """Every .py file git tracks or would track (new files count before their first commit)."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "*.py"],
                                cwd=ROOT, capture_output=True, check=True, text=True).stdout.split("\0")
        files = [ROOT / name for name in listed if name]
    except (OSError, subprocess.CalledProcessError):  # no git (an exported tree): walk it
        files = [path for path in ROOT.rglob("*.py")
                 if not SKIPPED_DIRS.intersection(path.relative_to(ROOT).parts[:-1])
                 and not any(part.endswith(".egg-info") for part in path.relative_to(ROOT).parts)]
    return tuple(sorted(path for path in files if path.is_file()))  # a tracked file deleted in the work tree is gone


def under(*folders: str) -> list[Path]:
    return [path for path in python_files() if path.relative_to(ROOT).parts[0] in folders]


def scripts_in_recipes() -> list[Path]:
    return [path for path in python_files() if path.parent == ROOT / "recipes"]


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def where(path: Path | str, node: ast.AST) -> str:
    name = path.relative_to(ROOT) if isinstance(path, Path) and path.is_absolute() else path
    return f"{name}:{getattr(node, 'lineno', '?')}"


def imported_modules(tree: ast.Module) -> list[tuple[ast.AST, str]]:
    """(node, absolute module name) for each import: `import a.b` gives a.b, `from a import b` gives a and a.b.
    Relative imports are left out (they stay inside their own package)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node, node.module))
            found += [(node, f"{node.module}.{alias.name}") for alias in node.names if alias.name != "*"]
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in {"import_module", "__import__"}
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node, node.args[0].value))  # importlib.import_module("recipes.train")
    return found


def top(module: str) -> str:
    return module.split(".")[0]


def docstring_nodes(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                ids.add(id(first.value))
    return ids


# --- the checkers: (path, tree) -> offences -------------------------------------------------------------------------

def _is_sys_path(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
            and node.value.id == "sys")


def sys_path_edits(path, tree: ast.Module) -> list[str]:
    """sys.path.insert/append/extend/..., sys.path = / += / [...] =, site.addsitedir(...)."""
    offences = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if _is_sys_path(node.func.value) and node.func.attr in {"insert", "append", "extend", "remove", "pop",
                                                                     "clear", "__setitem__", "__iadd__"}:
                offences.append(f"{where(path, node)}: sys.path.{node.func.attr}(...)")
            elif node.func.attr == "addsitedir":
                offences.append(f"{where(path, node)}: site.addsitedir(...)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "addsitedir":
            offences.append(f"{where(path, node)}: addsitedir(...)")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                changed = target.value if isinstance(target, ast.Subscript) else target
                if _is_sys_path(changed):
                    offences.append(f"{where(path, node)}: assigns to sys.path")
    return offences


def first_per_node(path, matches) -> list[str]:
    """One offence per import statement (`from a import b` yields both a and a.b), in source order."""
    seen, found = set(), []
    for node, module in matches:
        if id(node) not in seen:
            seen.add(id(node))
            found.append(f"{where(path, node)}: imports {module}")
    return found


def imports_of(names: set[str]):
    """A checker for imports of any of the top-level packages `names`."""
    def check(path, tree: ast.Module) -> list[str]:
        return first_per_node(path, [(node, m) for node, m in imported_modules(tree) if top(m) in names])
    return check


def imports_of_modules(modules: set[str]):
    """A checker for imports of any of the dotted `modules` (or anything inside them)."""
    def check(path, tree: ast.Module) -> list[str]:
        return first_per_node(path, [(node, m) for node, m in imported_modules(tree)
                                     if any(m == module or m.startswith(f"{module}.") for module in modules)])
    return check


def model_class_names(path, tree: ast.Module) -> list[str]:
    """Names, attributes, imported names, class names and bare string constants that look like a BLIP-2, OPT or T5
    class (`Blip2ForConditionalGeneration`, `OPTDecoderLayer`, `"T5Block"`); docstrings and comments do not count."""
    docstrings = docstring_nodes(tree)
    offences = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [part for alias in node.names for name in (alias.name, alias.asname) if name
                     for part in name.split(".")]
        elif isinstance(node, ast.ClassDef):
            names = [node.name]
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
              and MODEL_CLASS.fullmatch(node.value)):  # a bare class name, e.g. FSDP's layer classes
            names = [node.value]
        offences += [f"{where(path, node)}: names {name}" for name in names if is_model_class(name)]
    return offences


RECIPE_YAML = re.compile(r"recipes/[\w./-]+?\.yaml")


def missing_recipe_paths(path, tree: ast.Module, root: Path = ROOT) -> list[str]:
    """`recipes/....yaml` paths inside string constants (f-strings' fixed parts included) that do not exist."""
    return [f"{where(path, node)}: names {named}, which does not exist" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            for named in RECIPE_YAML.findall(node.value) if not (root / named).is_file()]


def offences(check, paths) -> list[str]:
    return [offence for path in paths for offence in check(path, parsed(path))]


def report(found: list[str], rule: str) -> str:
    return f"{rule} ({len(found)}):\n  " + "\n  ".join(found)


# --- the rules ------------------------------------------------------------------------------------------------------

def test_the_rules_see_the_code():
    assert len(python_files()) > 50 and len(under(*ENGINE)) > 30 and len(scripts_in_recipes()) >= 4


def test_nothing_edits_sys_path():
    """The engine is installed (pip install -e .), so every import works from any directory without help."""
    found = offences(sys_path_edits, python_files())
    assert not found, report(found, "sys.path edits; install the package (make venv) and import altscale.<folder>")


def test_the_engine_never_imports_a_script():
    """Arrows point from the scripts into the engine, never back: recipes/ is not installed."""
    found = offences(imports_of({"recipes"}), under(*ENGINE))
    assert not found, report(found, "engine modules importing recipes; move what they need into the engine")


def test_no_recipe_script_imports_another():
    """A script's shared code belongs in the engine, where both scripts import it."""
    stems = {path.stem for path in scripts_in_recipes()}
    check_recipes = imports_of({"recipes"})
    found = []
    for path in scripts_in_recipes():
        # `import generate` works in a script too: its own folder comes first on sys.path
        found += check_recipes(path, parsed(path)) + imports_of(stems - {path.stem})(path, parsed(path))
    assert not found, report(found, "recipes/*.py importing another script; move the shared code into the engine")


def has_main_block(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
               and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
               and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators)
               for node in tree.body)


def test_no_benchmark_script_is_imported_by_another_benchmark():
    """A benchmark with a `__main__` block is a script; what two benchmarks share lives in a module that is not."""
    benchmarks = under("benchmarks")
    scripts = {path.stem for path in benchmarks if has_main_block(parsed(path))}
    assert scripts, "benchmarks/ has no scripts with a __main__ block; has it moved?"
    modules = {f"altscale.benchmarks.{stem}" for stem in scripts}
    found = []
    for path in benchmarks:
        found += imports_of_modules(modules - {f"altscale.benchmarks.{path.stem}"})(path, parsed(path))
        found += imports_of(scripts - {path.stem})(path, parsed(path))  # `import ladder`, run from benchmarks/
    assert not found, report(found, "benchmarks importing a benchmark script; move the shared code into a module "
                                    "without a __main__ block")


def test_only_the_families_name_model_classes():
    """What differs between task families is looked up through families.family_for; the rest of the engine and
    the scripts stay the same when a family is added."""
    paths = under(*FAMILY_FREE) + scripts_in_recipes()
    found = offences(model_class_names, paths)
    assert not found, report(found, "BLIP-2/OPT/T5 classes named outside families/; add it to the Family seam "
                                    "(families/__init__.py) and call it from there")


def test_the_engine_is_imported_as_altscale():
    """`import data` would find any project's `data` (or none, outside the repo root); `altscale.data` is ours."""
    found = offences(imports_of({*ENGINE, "benchmarks"}), python_files())
    assert not found, report(found, "bare imports of engine folders; import altscale.<folder> instead (the shared "
                                    "benchmark modules too: altscale.benchmarks)")


def test_every_recipe_path_the_code_names_exists():
    """Error messages send users to example recipes: those must be there."""
    found = offences(missing_recipe_paths, under(*ENGINE) + scripts_in_recipes())
    assert not found, report(found, "recipe paths named in the code that do not exist")


# --- the checkers catch what they are for ---------------------------------------------------------------------------

def snippet(source: str) -> ast.Module:
    return ast.parse(source)


@pytest.mark.parametrize("source", [
    "import sys\nsys.path.insert(0, 'x')",
    "import sys\nsys.path.append('x')",
    "import sys\nsys.path[:0] = ['x']",
    "import sys\nsys.path = ['x']",
    "import sys\nsys.path += ['x']",
    "import site\nsite.addsitedir('x')",
    "from site import addsitedir\naddsitedir('x')",
])
def test_sys_path_edits_are_found(source):
    found = sys_path_edits("bad.py", snippet(source))
    assert len(found) == 1 and found[0].startswith("bad.py:2: "), found


def test_reading_sys_path_is_not_an_edit():
    assert sys_path_edits("ok.py", snippet('"""sys.path.insert in a docstring"""\nimport sys\nprint(sys.path[0])')) == []


@pytest.mark.parametrize("source", ["from recipes import train", "import recipes.train", "from recipes.train import main",
                                    "import importlib\nimportlib.import_module('recipes.train')"])
def test_imports_of_recipes_are_found(source):
    assert imports_of({"recipes"})("bad.py", snippet(source))


def test_a_script_importing_its_sibling_bare_is_found():
    assert imports_of({"generate"})("recipes/score.py", snippet("from generate import main")) == [
        "recipes/score.py:1: imports generate"]


def test_imports_of_a_benchmark_script_are_found():
    check = imports_of_modules({"altscale.benchmarks.ladder"})
    assert check("b.py", snippet("from altscale.benchmarks.ladder import run")) == [
        "b.py:1: imports altscale.benchmarks.ladder"]
    assert check("b.py", snippet("from altscale.benchmarks import ladder")) == ["b.py:1: imports altscale.benchmarks.ladder"]
    assert check("b.py", snippet("from altscale.benchmarks import results_table")) == []
    assert has_main_block(snippet("if __name__ == '__main__':\n    pass"))
    assert not has_main_block(snippet("def main():\n    pass"))


@pytest.mark.parametrize("source", [
    "from transformers import Blip2ForConditionalGeneration",
    "import transformers\nx = transformers.OPTDecoderLayer",
    "x = T5Block",
    "from transformers import AutoModel as Blip2Model",
    "LAYERS = ['Blip2EncoderLayer']",
    "class BlipThing:\n    pass",
])
def test_model_classes_are_found(source):
    assert model_class_names("bad.py", snippet(source))


def test_model_classes_in_docstrings_comments_and_prose_do_not_count():
    source = ('"""Builds a Blip2ForConditionalGeneration."""\n'
              "# OPTDecoderLayer\n"
              "OPTIMIZERS = OPT_NAMES = 1\n"  # constants, not classes
              "message = 'the Blip2Processor could not load'\n"  # prose in a message
              "t5_layers = blip2 = Options = 0\n")
    assert model_class_names("ok.py", snippet(source)) == []


@pytest.mark.parametrize("source", ["import data.loading", "from models.build import x", "from callbacks import y",
                                    "import config", "from families.blip2 import FAMILY"])
def test_bare_engine_imports_are_found(source):
    assert imports_of(set(ENGINE))("bad.py", snippet(source))


@pytest.mark.parametrize("source", ["import altscale.data.loading", "from altscale.models.build import x",
                                    "from tests.data import helpers", "from datasets import load_from_disk",
                                    "from . import collate"])
def test_altscale_imports_are_fine(source):
    assert imports_of(set(ENGINE))("ok.py", snippet(source)) == []


def test_missing_recipe_paths_are_found(tmp_path):
    (tmp_path / "recipes" / "blip2").mkdir(parents=True)
    (tmp_path / "recipes" / "blip2" / "there.yaml").touch()
    source = ('raise ValueError(f"recipe {p}: no such file (e.g. recipes/blip2/gone.yaml)")\n'
              'x = "recipes/blip2/there.yaml"\n')
    assert missing_recipe_paths("bad.py", snippet(source), root=tmp_path) == [
        "bad.py:1: names recipes/blip2/gone.yaml, which does not exist"]
