"""Keep the translation files in step with strings.json.

``python scripts/lib/translations.py`` writes ``translations/en.json`` as a copy of
``strings.json`` (which uses no ``[%key:...%]`` references, so the copy is the English text), then
checks that ``translations/fr.json`` has exactly the same keys. ``--check`` only checks (exit 1 when
en.json is stale or French keys differ).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import sys
from typing import Any

PACKAGE = Path(__file__).resolve().parents[2] / "custom_components" / "llm_lanes"


def key_paths(tree: Any, prefix: str = "") -> set[str]:
    """Every leaf key of a translation tree, as dotted paths."""
    if not isinstance(tree, dict):
        return {prefix}
    paths: set[str] = set()
    for key, value in tree.items():
        paths |= key_paths(value, f"{prefix}.{key}" if prefix else key)
    return paths


def problems(package: Path = PACKAGE) -> list[str]:
    """List what is wrong with the translation files (empty when they are in step)."""
    found: list[str] = []
    strings_text = (package / "strings.json").read_text(encoding="utf-8")
    strings = json.loads(strings_text)
    if "[%key:" in strings_text:
        found.append("strings.json uses [%key:...%] references; write the text instead")
    english = json.loads(
        (package / "translations" / "en.json").read_text(encoding="utf-8")
    )
    if english != strings:
        found.append("translations/en.json differs from strings.json")
    french = json.loads(
        (package / "translations" / "fr.json").read_text(encoding="utf-8")
    )
    expected, actual = key_paths(strings), key_paths(french)
    found.extend(f"fr.json lacks {path}" for path in sorted(expected - actual))
    found.extend(f"fr.json has unknown {path}" for path in sorted(actual - expected))
    return found


def write_english(package: Path = PACKAGE) -> None:
    """Copy strings.json to translations/en.json."""
    strings = json.loads((package / "strings.json").read_text(encoding="utf-8"))
    (package / "translations" / "en.json").write_text(
        json.dumps(strings, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )


def main() -> int:
    """Write en.json (unless --check) and report mismatches."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="only check, write nothing"
    )
    args = parser.parse_args()
    if not args.check:
        write_english()
    found = problems()
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
