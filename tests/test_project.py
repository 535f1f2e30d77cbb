"""Project-level rules: layer contracts, the README's commands, the CLI's entry points."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import modules_loaded_by

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_hold():
    """engine never imports Qt, pyqtgraph or studio; engine's packages keep their layers; no package's
    modules import each other in a cycle; studio uses engine's public names; the pages' controllers
    never import Qt (pyproject.toml)."""
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 7 kept, 0 broken" in result.stdout


def test_no_module_imports_a_package_that_imports_it():
    """The cycle the sibling contract cannot see: a module importing its own package (or one above),
    whose __init__ imports that module back."""
    import grimp

    graph = grimp.build_graph("engine", "studio")
    cycles = []
    for module in sorted(graph.modules):
        parts = module.split(".")
        for i in range(1, len(parts)):
            package = ".".join(parts[:i])
            if graph.direct_import_exists(importer=module, imported=package) and graph.chain_exists(
                importer=package, imported=module
            ):
                cycles.append(f"{module} -> {package} -> ... -> {module}")
    assert not cycles, cycles


def test_engine_imports_without_qt():
    """Every name the engine exports, loaded (they load on first use), brings no Qt and no studio."""
    loaded = modules_loaded_by("engine", ("PySide6", "pyqtgraph", "studio"), then="from engine import *")
    assert loaded == []


def test_every_name_the_engine_exports_exists():
    """`from engine import *` imports every name of engine.__all__ (quantizable_types was listed and
    not imported: the star import raised)."""
    namespace: dict = {}
    exec("from engine import *", namespace)
    import engine

    assert set(engine.__all__) <= set(namespace) and "quantizable_types" in namespace


def test_ci_runs_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    test_cmd = next(b.strip() for b in blocks if "pytest" in b)
    assert test_cmd in ci
    assert any("tune-studio --demo" in b for b in blocks)


def test_ruff_lint_is_clean():
    ruff = Path(sys.executable).parent / "ruff"
    paths = ["engine", "studio", "tests", "bench", "resources"]
    result = subprocess.run([str(ruff), "check", *paths], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
