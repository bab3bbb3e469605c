"""The library attributes this project changes or reads exist in the installed versions, and only patches/ changes any.

Each patches/<library>.py lists in `PATCHED` what it changes in its library and which internals the engine reads
(altscale.patches says the entry forms). An upgrade that renames one fails here, naming the library, its version,
the module that relies on it and the versions it was checked with, rather than on the GPU machine mid-run.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import altscale.patches as patches
from altscale.patches import patch_modules, patched_attributes

ROOT = Path(__file__).resolve().parents[2]
PATCHES = ROOT / "patches"
# Engine folders outside patches/ (pyproject.toml installs each as altscale.<folder>), and the scripts.
ENGINE = ("artifacts", "callbacks", "config", "data", "families", "metrics", "models", "strategies")
LIBRARIES = {"torch", "transformers", "accelerate", "deepspeed", "peft", "bitsandbytes", "datasets", "safetensors",
             "tokenizers", "huggingface_hub"}
# Libraries the CPU machines (CI) do not install: their entries are checked where they are, on the GPU machine.
NOT_ON_CPU = {"deepspeed"}
ENTRIES = patched_attributes()


def engine_files() -> list[Path]:
    files = [path for folder in ENGINE for path in sorted((ROOT / folder).rglob("*.py"))]
    return files + sorted((ROOT / "recipes").glob("*.py"))


def resolve(dotted: str):
    """The module, class or function at `dotted`: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as err:
            if err.name is None or not ".".join(parts[:cut]).startswith(err.name):
                raise  # the module exists but imports something missing: a real failure
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(dotted)


def _assigned(name: str) -> str:
    """`x.name = ...` / `x.name: T = ...`, or the name as a string (setattr(x, "name", ...), a constant)."""
    return rf"\.{name}\s*(?::[^=\n]*)?=(?!=)|[\"']{name}[\"']"


def _named(name: str) -> str:
    """A key `"name"` or an attribute read `.name`."""
    return rf"[\"']{name}[\"']|\.{name}\b"


def has(owner, attribute: str, kind: str) -> bool:
    if kind == "attribute":
        return hasattr(owner, attribute)
    if kind == "instance":
        if hasattr(owner, attribute):
            return True
        if dataclasses.is_dataclass(owner) and attribute in {field.name for field in dataclasses.fields(owner)}:
            return True
        return re.search(_assigned(attribute), inspect.getsource(owner)) is not None
    assert kind == "source", f"unknown kind {kind!r}: use one of {patches.KINDS}"
    return re.search(_named(attribute), inspect.getsource(owner)) is not None


def checked_with(module: str) -> str:
    """The versions a patches module's docstring says it was checked with."""
    doc = importlib.import_module(f"altscale.patches.{module}").__doc__ or ""
    versions = re.findall(r"\b\d+\.\d+(?:\.\d+)?\b", doc.split("\n\n")[0])
    return ", ".join(dict.fromkeys(versions)) or "no versions named"


def version(library: str) -> str:
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


@pytest.mark.parametrize("module, owner, attribute, kind", ENTRIES,
                         ids=[f"{module}:{owner}.{attribute}" for module, owner, attribute, _ in ENTRIES])
def test_every_patched_attribute_exists_in_the_installed_version(module, owner, attribute, kind):
    library = owner.split(".")[0]
    if importlib.util.find_spec(library) is None:
        assert library in NOT_ON_CPU, f"{library} is not installed, but patches/{module}.py needs it"
        pytest.skip(f"{library} is not installed here; this check runs where it is (the GPU machine)")
    where = f"patches/{module}.py changes or reads it (checked with {checked_with(module)}): re-check the patch"
    try:
        target = resolve(owner)
    except (ImportError, AttributeError) as err:
        pytest.fail(f"{library} {version(library)}: cannot import {owner} ({err}); {where}")
    how = {"attribute": "has no", "instance": "never sets", "source": "no longer uses"}[kind]
    assert has(target, attribute, kind), f"{library} {version(library)}: {owner} {how} {attribute}; {where}"


def test_the_checks_are_not_skipped_for_the_installed_libraries():
    """Only the libraries the CPU machines lack may skip; a missing required one would hide its checks."""
    libraries = {owner.split(".")[0] for _, owner, _, _ in ENTRIES}
    missing = sorted(lib for lib in libraries - NOT_ON_CPU if importlib.util.find_spec(lib) is None)
    assert not missing, f"not installed, so their patches go unchecked: {missing}"
    assert {"torch", "transformers", "accelerate", "bitsandbytes", "deepspeed"} <= libraries


def test_every_patches_module_has_a_registry_and_says_what_it_was_checked_with():
    assert patch_modules() == sorted(path.stem for path in PATCHES.glob("*.py") if path.stem != "__init__")
    for name in patch_modules():
        module = importlib.import_module(f"altscale.patches.{name}")
        doc = module.__doc__ or ""
        assert re.search(r"[Cc]hecked (?:with|in) .*\d+\.\d+", doc.split("\n\n")[0], re.S), (
            f"patches/{name}.py: its docstring's first paragraph must name the versions it was checked with")
        registry = getattr(module, "PATCHED", None)
        assert isinstance(registry, tuple) and registry, f"patches/{name}.py has no PATCHED registry"
        for entry in registry:
            assert len(entry) in (2, 3) and all(isinstance(part, str) for part in entry), entry
            assert entry[0].split(".")[0] == name, f"patches/{name}.py lists {entry[0]}: one module per library"
            assert len(entry) == 2 or entry[2] in patches.KINDS, entry


# --- nothing outside patches/ changes a library ---------------------------------------------------------------------

def library_names(tree: ast.Module) -> set[str]:
    """Names bound to a library module, class or function by an import anywhere in the file."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARIES:
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in LIBRARIES:
                names.update(alias.asname or alias.name for alias in node.names)
    return names


def root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def library_assignments(path, tree: ast.Module) -> list[str]:
    """`lib.attr = ...`, `Imported.attr = ...` (also augmented, annotated, deleted, item-assigned), and
    setattr/delattr on them, where the name came from an import of a library."""
    names, found = library_names(tree), []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"setattr", "delattr"}
              and node.args):
            targets = [ast.Attribute(value=node.args[0], attr="?")]
        for target in targets:
            for part in ast.walk(target) if isinstance(target, ast.Tuple) else [target]:
                if isinstance(part, (ast.Attribute, ast.Subscript)) and root_name(part) in names:
                    found.append(f"{path}:{node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return found


def test_nothing_outside_patches_assigns_a_library_attribute():
    found = [offence for path in engine_files()
             for offence in library_assignments(path.relative_to(ROOT), ast.parse(path.read_text()))]
    assert not found, ("library attributes assigned outside patches/; move the change into patches/<library>.py, say "
                       "why and the versions checked, and list it in PATCHED:\n  " + "\n  ".join(found))


@pytest.mark.parametrize("source", [
    "import transformers.masking_utils as masking\nmasking.is_tracing = lambda: True",
    "from transformers import Trainer\nTrainer.training_step = step",
    "import torch\ntorch.nn.Module.zero_grad = zero_grad",
    "from torch.nn.parallel import DistributedDataParallel as DDP\nDDP.zero_grad += 1",
    "import accelerate\nsetattr(accelerate.utils, 'x', 1)",
    "def f():\n    from peft import tuners\n    tuners.lora.LoraLayer.__init__ = init",
    "import transformers\ntransformers.integrations.INTEGRATION_TO_CALLBACK['mine'] = Mine",
    "import torch\ndel torch.Tensor.masked_scatter",
])
def test_library_assignments_are_found(source):
    assert library_assignments("bad.py", ast.parse(source))


def test_changing_own_objects_is_not_a_library_assignment():
    source = ("import torch\nfrom transformers import Trainer\n"
              "def f(model, trainer, handler):\n"
              "    model.config.use_cache = False\n    trainer.optimizer_cls_and_kwargs = (1, {})\n"
              "    x = torch.zeros(1)\n    x.grad = None\n    setattr(model, 'a', 1)\n"
              "class T(Trainer):\n    def __init__(self):\n        self.x = 1\n")
    assert library_assignments("ok.py", ast.parse(source)) == []


# --- every private library name the engine uses is listed -----------------------------------------------------------

def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) for `x._name`, getattr/hasattr/setattr(x, "_name"), and imports through a `_module`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            found.append((node.lineno, node.attr))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in {"getattr", "hasattr", "setattr"} and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value)):
            found.append((node.lineno, node.args[1].value))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [(node.lineno, module) for module in modules
                      if module.split(".")[0] in LIBRARIES and any(_private(part) for part in module.split("."))]
    return found


def own_names(trees: list[ast.Module]) -> set[str]:
    """Names the engine defines itself: functions, classes, attributes it assigns, module-level names."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names


def test_every_private_library_name_the_engine_uses_is_listed():
    """`x._name` on a library's object, `_module` imports: each is named in some PATCHED, so the check above sees it."""
    trees = {path: ast.parse(path.read_text()) for path in engine_files()}
    own = own_names(list(trees.values()))
    listed = {attribute for _, _, attribute, _ in ENTRIES} | {owner for _, owner, _, _ in ENTRIES}
    found = [f"{path.relative_to(ROOT)}:{line}: {name}" for path, tree in trees.items()
             for line, name in private_uses(tree)
             if name not in listed and not ("." not in name and name in own)]
    assert not found, ("private library names used outside patches/ and listed in no patches/<library>.py PATCHED; "
                       "list them there (or move the use there):\n  " + "\n  ".join(found))


def test_the_trainer_step_takes_what_the_graphed_trainer_passes():
    """GraphedTrainer calls the Trainer's own `training_step(model, inputs, num_items_in_batch)` positionally."""
    from transformers import Trainer

    assert list(inspect.signature(Trainer.training_step).parameters)[:4] == [
        "self", "model", "inputs", "num_items_in_batch"], (
        f"transformers {version('transformers')}: Trainer.training_step's parameters changed; "
        "strategies/cuda_graphs.py GraphedTrainer overrides and calls it (patches/transformers.py): re-check it")
