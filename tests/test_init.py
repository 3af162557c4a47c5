"""The public API: every exported name resolves, and importing the package stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest

import lightning_ig


def test_every_exported_name_resolves() -> None:
    for name in lightning_ig.__all__:
        assert getattr(lightning_ig, name) is not None, name
    assert sorted(dir(lightning_ig)) == sorted(lightning_ig.__all__)


def test_unknown_names_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="not_a_name"):
        lightning_ig.not_a_name  # noqa: B018


def test_importing_the_package_does_not_import_lightning_or_cupy() -> None:
    heavy = ("lightning", "cupy", "matplotlib", "PIL", "tensorboard")
    code = f"import sys, lightning_ig; print(any(m.split('.')[0] in {heavy!r} for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_command_answers_help_and_bad_flags_without_importing_torch() -> None:
    code = (
        "import sys\n"
        "from lightning_ig.cli import build_parser, main\n"
        "parser = build_parser()\n"
        "parser.format_help()\n"
        "assert main(['diag']) == 2\n"  # a missing --checkpoint: one line, no torch
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False" and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [["--help"], ["diag", "--help"], ["show", "--help"], ["--version"]])
def test_help_imports_neither_torch_nor_lightning(argv: list[str]) -> None:
    # guards against: diag --help listed --method's choices from lightning_ig.vocabulary, which imports torch (3.5-6.4
    # s)
    code = (
        "import sys\n"
        "from lightning_ig.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit as done:\n"
        "    assert done.code == 0, done.code\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'lightning', 'safetensors'}), file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
    assert "(default: None)" not in done.stdout


def test_the_command_and_checkpoints_keep_their_import_paths() -> None:
    from lightning_ig import checkpoint, cli

    assert callable(cli.main) and callable(cli.build_parser)
    for name in ("save_checkpoint", "load_checkpoint", "list_heads", "load_states", "states_beside", "CheckpointError"):
        assert hasattr(checkpoint, name), name
    assert lightning_ig.load_checkpoint is checkpoint.load_checkpoint


def _package_modules() -> list[str]:
    import pkgutil

    found = pkgutil.walk_packages(lightning_ig.__path__, "lightning_ig.")
    return ["lightning_ig", *(info.name for info in found if not info.name.endswith("__main__"))]


@pytest.mark.parametrize("module_name", _package_modules())
def test_every_module_says_what_it_exports_and_nothing_else(module_name: str) -> None:
    import ast
    import importlib
    import inspect

    module = importlib.import_module(module_name)
    exported = module.__all__
    assert len(exported) == len(set(exported)), f"{module_name}.__all__ repeats a name"
    for name in exported:
        assert hasattr(module, name), f"{module_name}.__all__ lists {name}, which it does not have"
    if module_name == "lightning_ig":
        return  # the public face defines nothing: it imports on first use
    tree = ast.parse(inspect.getsource(module))
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(target.id for target in targets if isinstance(target, ast.Name))
    public = {name for name in defined if not name.startswith("_")}
    assert public <= set(exported), f"{module_name} defines {sorted(public - set(exported))} but does not export them"


def test_the_top_level_exports_at_most_sixteen_names() -> None:
    assert len(lightning_ig.__all__) <= 16, lightning_ig.__all__
