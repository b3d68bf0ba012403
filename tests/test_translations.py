"""Translations: en.json is strings.json, fr.json has its keys, actions have icons, errors have text.

Every string also parses as the frontend parses it: ICU MessageFormat (formatjs'
``intl-messageformat``, tags enabled), where ``<`` opens a tag, ``{`` a placeholder and an
apostrophe before a syntax character quotes text. A string that breaks these rules shows as
"Translation error: UNCLOSED_TAG" (or worse, silently loses text) in the UI.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
import json
from pathlib import Path
import re
from types import ModuleType
from typing import Any

import pytest
import yaml

from custom_components.llm_lanes.calibration import APPLIED_SETTINGS
from custom_components.llm_lanes.core.errors import LanesError

from .support.scripts import load_script

PACKAGE = Path(__file__).resolve().parents[1] / "custom_components" / "llm_lanes"


def _translations_module() -> ModuleType:
    return load_script("translations")


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


@pytest.mark.parametrize("name", ["strings.json", "translations/fr.json"])
def test_run_benchmark_apply_names_every_setting_it_writes(name: str) -> None:
    """The ``apply`` field says what it writes: each option's name, as the options flow has it."""
    strings = json.loads((PACKAGE / name).read_text(encoding="utf-8"))
    labels = strings["options"]["step"]["init"]["data"]
    text = strings["services"]["run_benchmark"]["fields"]["apply"]["description"]
    for option in APPLIED_SETTINGS:
        # The label without its unit: "Prefill budget (tokens)" is "prefill budget" in the text.
        label = labels[option].split(" (")[0].lower()
        assert label in text.lower(), (option, label)


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


ICU_SYNTAX = "{}<>"
"""What an apostrophe quotes in formatjs (``#`` too, inside plurals, which we do not use)."""
PLACEHOLDER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def icu_problems(text: str) -> list[str]:
    """Check a string against the frontend's ICU message rules; return what is wrong.

    - ``''`` is one apostrophe; an apostrophe before ``{ } < >`` starts a quoted literal up to
      the next apostrophe: allowed only to escape those characters (``'<'``), never around text
      (a French "l'{name}" would hide the placeholder);
    - ``<`` outside such a quote opens a tag (we use none);
    - ``{`` opens a placeholder, which must be ``{name}`` and closed; a lone ``}`` is an error.
    """
    problems: list[str] = []
    i = 0
    while i < len(text):
        char, following = text[i], text[i + 1 : i + 2]
        if char == "'" and following == "'":
            i += 2
            continue
        if char == "'" and following and following in ICU_SYNTAX:
            end = text.find("'", i + 1)
            quoted = text[i + 1 :] if end == -1 else text[i + 1 : end]
            if end == -1 or set(quoted) - set(ICU_SYNTAX):
                problems.append(f"an apostrophe before {following!r} quotes {quoted!r}")
            i = len(text) if end == -1 else end + 1
            continue
        if char == "<":
            problems.append(f"unescaped '<' at {i} (a tag)")
        elif char == "{":
            end = text.find("}", i)
            if end == -1:
                problems.append(f"'{{' at {i} is never closed")
                break
            if not PLACEHOLDER.fullmatch(text[i + 1 : end]):
                problems.append(f"{text[i : end + 1]!r} is not a {{name}} placeholder")
            i = end + 1
            continue
        elif char == "}":
            problems.append(f"unmatched '}}' at {i}")
        i += 1
    return problems


def placeholders(text: str) -> set[str]:
    """Return the ``{name}`` placeholders of a string."""
    return set(re.findall(r"{([A-Za-z_][A-Za-z0-9_]*)}", text))


def _leaves(tree: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _leaves(value, f"{path}.{key}" if path else key)
    else:
        yield path, tree


TRANSLATION_FILES = ["strings.json", "translations/en.json", "translations/fr.json"]


@pytest.mark.parametrize("name", TRANSLATION_FILES)
def test_every_string_parses_as_an_icu_message(name: str) -> None:
    """No string of strings.json or a translation breaks the frontend's message parser."""
    tree = json.loads((PACKAGE / name).read_text(encoding="utf-8"))
    found = {
        path: problems
        for path, text in _leaves(tree)
        if (problems := icu_problems(text))
    }
    assert found == {}


def test_translations_have_the_placeholders_of_english() -> None:
    """French uses exactly the placeholders of each English string (the code fills those)."""
    english = dict(_leaves(json.loads((PACKAGE / "strings.json").read_text())))
    french = dict(_leaves(json.loads((PACKAGE / "translations/fr.json").read_text())))
    differ = {
        path: (placeholders(text), placeholders(french[path]))
        for path, text in english.items()
        if path in french and placeholders(text) != placeholders(french[path])
    }
    assert differ == {}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("job:<name> by default", "unescaped '<' at 4 (a tag)"),
        ("Found {kind", "'{' at 6 is never closed"),
        ("{a} and }", "unmatched '}' at 8"),
        ("{count, plural, one {# job} other {# jobs}}", "is not a {name} placeholder"),
        ("l'{name} vaut", "an apostrophe before '{' quotes '{name} vaut'"),
        ("l'{name}' vaut", "an apostrophe before '{' quotes '{name}'"),
    ],
)
def test_icu_check_finds(text: str, problem: str) -> None:
    """The check reports each broken rule (the summarize requester text had the first)."""
    assert any(problem in found for found in icu_problems(text)), icu_problems(text)


@pytest.mark.parametrize(
    "text",
    ["Found {kind} (version {version}).", "qu'il", "l''{name}", "a '<' b", "…"],
)
def test_icu_check_accepts(text: str) -> None:
    """Plain text, placeholders, apostrophes before letters and escapes are fine."""
    assert icu_problems(text) == []
