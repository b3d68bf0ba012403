"""What HACS installs (``custom_components/llm_lanes/``) is what Home Assistant runs.

The simulated server and the benchmark's command line live beside the integration, in ``tools/``:
nothing shipped imports them (nor the tests or the scripts), none of their files is shipped, and
a copy of the integration on its own, as HACS installs it, imports every module and finds every
scenario ``llm_lanes.run_benchmark`` offers.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path
import shutil
import subprocess
import sys

import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "custom_components" / "llm_lanes"
MOVED_OUT = {
    "simulator.py",
    "sim_engine.py",
    "sim_answers.py",
    "micro.py",
    "prefill_delay.py",
}
"""The files of the simulator and the benchmark's command line that ``core/bench/`` once held."""

# Run in a fresh interpreter from the copy's folder: imports every module of the copy, says
# which files it imported them from and whether anything of the repository came along, and
# loads every built-in scenario.
IMPORT_EVERYTHING = """
import importlib, json, pkgutil, sys
import custom_components.llm_lanes as package
modules = [info.name for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
files = [importlib.import_module(name).__file__ for name in modules]
from custom_components.llm_lanes.core.bench.workload import builtin_scenarios, load_scenario
scenarios = sorted(builtin_scenarios())
for name in scenarios:
    load_scenario(name)
repository = sorted({name.partition(".")[0] for name in sys.modules} & set(sys.argv[1:]))
print(json.dumps({"modules": modules, "files": files, "repository": repository, "scenarios": scenarios}))
"""


def _repository_packages() -> set[str]:
    """Top-level folders of the repository with Python code, the integration's aside."""
    return {
        folder.name
        for folder in REPO.iterdir()
        if folder.is_dir()
        and not folder.name.startswith(".")
        and folder.name != "custom_components"
        and any(folder.rglob("*.py"))
    }


def _imported_packages(path: Path) -> list[tuple[int, str]]:
    """Return the top-level package of every absolute import of a module, with its line."""
    imports: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imports += [
                (node.lineno, alias.name.partition(".")[0]) for alias in node.names
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imports.append((node.lineno, node.module.partition(".")[0]))
    return imports


def test_nothing_shipped_imports_the_tools() -> None:
    """No module of the integration imports ``tools``, ``tests`` or ``scripts``."""
    outside = _repository_packages()
    assert {"tools", "tests", "scripts"} <= outside
    found = [
        f"{path.relative_to(REPO)}:{line} imports {package}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, package in _imported_packages(path)
        if package in outside
    ]
    assert found == []


def test_the_simulator_and_the_command_line_are_not_shipped() -> None:
    """No command line (``__main__.py``) and none of the simulator's files is under the integration."""
    shipped = {path.name for path in PACKAGE.rglob("*.py")}
    assert "__main__.py" not in shipped
    assert shipped & MOVED_OUT == set()
    assert (REPO / "tools" / "simulator" / "server.py").is_file()
    assert (REPO / "tools" / "bench" / "__main__.py").is_file()


def test_the_integration_alone_imports_and_has_its_scenarios(tmp_path: Path) -> None:
    """A copy of the integration, and nothing else of the repository, imports every module.

    It loads every built-in scenario, and they are the ones ``run_benchmark`` offers.
    """
    shutil.copytree(
        PACKAGE,
        tmp_path / "custom_components" / "llm_lanes",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERYTHING, *sorted(_repository_packages())],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert "custom_components.llm_lanes.services" in result["modules"]
    assert all(Path(file).is_relative_to(tmp_path) for file in result["files"])
    assert result["repository"] == []
    services = yaml.safe_load((PACKAGE / "services.yaml").read_text(encoding="utf-8"))
    offered = services["run_benchmark"]["fields"]["scenario"]["selector"]["select"]
    assert result["scenarios"] == sorted(offered["options"])
