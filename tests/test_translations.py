"""Translations: en.json is strings.json, fr.json has its keys, actions have icons, errors have text."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import yaml

from custom_components.llm_lanes.core.errors import LanesError

PACKAGE = Path(__file__).resolve().parents[1] / "custom_components" / "llm_lanes"
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "lib" / "translations.py"


def _translations_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("translations_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_translation_files_are_in_step() -> None:
    """en.json is a plain copy of strings.json and fr.json has exactly its keys."""
    assert _translations_module().problems(PACKAGE) == []


def test_check_finds_missing_french_key(tmp_path: Path) -> None:
    """The check reports a key French lacks and a stale English copy."""
    (tmp_path / "translations").mkdir()
    (tmp_path / "strings.json").write_text(json.dumps({"a": {"b": "x", "c": "y"}}))
    (tmp_path / "translations" / "en.json").write_text(json.dumps({"a": {"b": "x"}}))
    (tmp_path / "translations" / "fr.json").write_text(
        json.dumps({"a": {"b": "x", "d": "z"}})
    )
    found = _translations_module().problems(tmp_path)
    assert found == [
        "translations/en.json differs from strings.json",
        "fr.json lacks a.c",
        "fr.json has unknown a.d",
    ]


def test_every_action_is_translated_and_has_an_icon() -> None:
    """Each action of services.yaml has a name, field texts and an icon."""
    services = yaml.safe_load((PACKAGE / "services.yaml").read_text())
    strings = json.loads((PACKAGE / "strings.json").read_text())
    icons = json.loads((PACKAGE / "icons.json").read_text())
    for name, spec in services.items():
        assert name in icons["services"]
        translated = strings["services"][name]
        assert translated["name"]
        assert set(translated["fields"]) == set(spec["fields"])


def _all_subclasses(cls: type) -> set[type]:
    found = {cls}
    for sub in cls.__subclasses__():
        found |= _all_subclasses(sub)
    return found


def _raised_translation_keys() -> set[str]:
    """Collect the translation keys the package's own code gives the errors it raises."""
    keys: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name in {"validation_error", "failure"} and node.args:
                key = node.args[0]
            elif name.endswith(("Error", "Failed")):
                key = next(
                    (kw.value for kw in node.keywords if kw.arg == "translation_key"),
                    None,
                )
            else:
                continue
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                keys.add(key.value)
    return keys


def test_every_error_raised_to_a_user_is_translated() -> None:
    """Each engine error's key, and each key the integration raises, has a message."""
    exceptions = json.loads((PACKAGE / "strings.json").read_text())["exceptions"]
    engine_keys = {error.translation_key for error in _all_subclasses(LanesError)}
    raised = _raised_translation_keys()
    assert {
        "job_not_found",
        "job_already_finished",
        "notify_target_not_found",
    } <= raised
    assert (engine_keys | raised) - set(exceptions) == set()
