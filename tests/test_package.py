"""The package as a whole: other libraries through their public API only, no import cycles, a run's numbers apart
from words and pixels.

An attribute whose name starts with one underscore is private to the object that owns it. The package's own
private names (methods, class attributes and ``self._...`` attributes of its classes) may be reached from its other
modules; any other one (``tensor._version``, ``module._parameters``, ``torch._foreach_copy_``,
``writer._get_file_writer``, Lightning's ``self._generate_state_key``) is another library's internals.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lightning_ig

PACKAGE = Path(lightning_ig.__file__).parent

# Private names of other libraries that are public in practice, each with its reason.
ALLOWED = {
    "_exit": "os._exit, documented by the standard library",
}


def _trees() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def _own_names(trees: dict[Path, ast.Module]) -> set[str]:
    """Every name the package's classes define: methods, class attributes, ``self.x = ...`` attributes."""
    own: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        own.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        own.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        own.update(target.id for target in item.targets if isinstance(target, ast.Name))
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                own.update(
                    target.attr
                    for target in targets
                    if isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id in ("self", "cls")
                )
    return own


def _private_uses(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, name)`` of every ``x._name`` and ``getattr(x, "_name")`` (dunder names are Python's, not private)."""
    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute):
            name = node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            name = node.args[1].value
        if name is not None and name.startswith("_") and not name.startswith("__"):
            found.append((node.lineno, name))
    return found


def test_no_private_attribute_of_another_library_is_used() -> None:
    trees = _trees()
    own = _own_names(trees) | set(ALLOWED)
    used = [
        f"{path.relative_to(PACKAGE)}:{line}: {name}"
        for path, tree in trees.items()
        for line, name in _private_uses(tree)
        if name not in own
    ]
    assert not used, "private attributes of other libraries (use their public API):\n" + "\n".join(used)


def test_the_scan_finds_what_it_is_for() -> None:
    # the kinds this package once used, each seen by the scan
    code = (
        "v = tensor._version\n"
        "module._parameters.clear()\n"
        "torch._foreach_copy_(a, b)\n"
        "f = getattr(writer, '_get_file_writer', None)\n"
        "key = self._generate_state_key(a=1)\n"
        "ok = value.__class__\n"
    )
    kinds = {"_version", "_parameters", "_foreach_copy_", "_get_file_writer", "_generate_state_key"}
    assert sorted(name for _, name in _private_uses(ast.parse(code))) == sorted(kinds)
    assert not kinds & _own_names(_trees())


def test_a_runs_numbers_import_no_words_and_no_pixels() -> None:
    import subprocess
    import sys

    code = (
        "import sys, lightning_ig.run\n"
        "print(sorted(m for m in sys.modules if m.startswith('lightning_ig.views') or m.split('.')[0] in "
        "('PIL', 'matplotlib', 'tensorboard', 'lightning')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: each strongly connected group of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in edges[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                other = stack.pop()
                group.append(other)
                if other == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles_among_the_packages_modules() -> None:
    import grimp

    graph = grimp.build_graph("lightning_ig")  # lazy imports and TYPE_CHECKING ones included, as lint-imports reads
    edges = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    assert _cycles(edges) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check can fail


# Modules without a test file of their own name (none: a new module comes with its tests/<wing>/test_<module>.py).
WITHOUT_OWN_TESTS: set[str] = set()


def _own_test_file(module: Path) -> Path:
    """``lightning_ig/<wing>/<name>.py`` -> ``tests/<wing>/test_<name>.py``; a private module's leading underscores
    are dropped (``ops/_cupy.py`` -> ``tests/ops/test_cupy.py``)."""
    relative = module.relative_to(PACKAGE)
    return PACKAGE.parent / "tests" / relative.parent / f"test_{relative.stem.lstrip('_')}.py"


def test_every_module_has_a_test_file_of_its_own_name() -> None:
    modules = [path for path in sorted(PACKAGE.rglob("*.py")) if not path.name.startswith("__")]  # __init__, __main__
    missing = {str(path.relative_to(PACKAGE)) for path in modules if not _own_test_file(path).is_file()}
    assert missing - WITHOUT_OWN_TESTS == set(), "modules without tests/<wing>/test_<module>.py"
    assert WITHOUT_OWN_TESTS - missing == set(), "these have their own test file now: take them off the list"
    assert _own_test_file(PACKAGE / "ops" / "_cupy.py").name == "test_cupy.py"


def test_the_package_is_marked_typed() -> None:
    # PEP 561: without the marker a user's type checker skips the installed package ("missing library stubs or
    # py.typed marker") and every name from it is Any; .ci/run checks that the wheel carries it
    assert (PACKAGE / "py.typed").is_file()
