"""What HACS' default store and hassfest ask of the release files, checked before CI does.

HACS' default store requires its validation action (category integration) and hassfest to pass
with nothing ignored (``.github/workflows/validate.yaml`` runs both; they need GitHub's API and
hassfest's image, so they run in CI only). The rules they apply to our files are restated here,
each from the source named beside it: the manifest, ``hacs.json``, the translations, the imports
of other integrations, ``quality_scale.yaml`` (every rule of bronze to platinum, and what
hassfest's own checks of a rule marked done look for). Then what a release needs: one version in
the manifest, ``pyproject.toml`` and CHANGELOG.md, and the workflows. The brand images are
``tests/test_brand.py``'s.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from importlib.metadata import packages_distributions, requires
from importlib.util import find_spec
import json
from pathlib import Path
import re
import string
import sys
import tomllib
from typing import Any, get_args, get_type_hints
from urllib.parse import urlparse

from awesomeversion import AwesomeVersion, AwesomeVersionStrategy
from homeassistant.const import Platform, __version__ as HA_VERSION
from homeassistant.loader import Manifest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "custom_components" / "llm_lanes"
WORKFLOWS = ROOT / ".github" / "workflows"


def _json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


MANIFEST = _json(PACKAGE / "manifest.json")
HACS_JSON = _json(ROOT / "hacs.json")
QUALITY_SCALE: dict[str, Any] = yaml.safe_load(
    (PACKAGE / "quality_scale.yaml").read_text(encoding="utf-8")
)["rules"]


# --- manifest.json ----------------------------------------------------------------------------

# hassfest's CUSTOM_INTEGRATION_MANIFEST_SCHEMA: INTEGRATION_MANIFEST_SCHEMA's keys plus version,
# issue_tracker and import_executor; any other key is an error. From
# https://github.com/home-assistant/core/blob/dev/script/hassfest/manifest.py (the version that
# validates with probatio, as Home Assistant 2026.10 does).
HASSFEST_MANIFEST_KEYS = {
    "after_dependencies",
    "bluetooth",
    "codeowners",
    "config_flow",
    "dependencies",
    "dhcp",
    "disabled",
    "documentation",
    "domain",
    "homekit",
    "import_executor",
    "integration_type",
    "iot_class",
    "issue_tracker",
    "loggers",
    "mqtt",
    "name",
    "preview_features",
    "quality_scale",
    "requirements",
    "single_config_entry",
    "ssdp",
    "usb",
    "version",
    "zeroconf",
}
HASSFEST_REQUIRED_KEYS = {"domain", "name", "documentation", "codeowners", "version"}
"""``version`` too: hassfest's ``validate_version`` fails a custom integration without one."""
SUPPORTED_IOT_CLASSES = {
    "assumed_state",
    "calculated",
    "cloud_polling",
    "cloud_push",
    "local_polling",
    "local_push",
}
CORE_DOCUMENTATION = "https://www.home-assistant.io/integrations"

# HACS' INTEGRATION_MANIFEST_JSON_SCHEMA (extra keys allowed), from
# https://github.com/hacs/integration/blob/3249355704d1a716e637d4d044b6cb4ae72dc271/custom_components/hacs/utils/validate.py
HACS_MANIFEST_REQUIRED_KEYS = {
    "codeowners",
    "documentation",
    "domain",
    "issue_tracker",
    "name",
    "version",
}


def _is_https_url(value: object) -> bool:
    if not isinstance(value, str):
        return False
    parsed = urlparse(value)
    return parsed.scheme == "https" and bool(parsed.netloc)


def test_manifest_keys_are_what_hassfest_and_hacs_accept() -> None:
    """Only known keys, the required ones there, sorted as hassfest sorts them."""
    keys = list(MANIFEST)
    assert set(keys) <= HASSFEST_MANIFEST_KEYS
    assert set(keys) >= HASSFEST_REQUIRED_KEYS | HACS_MANIFEST_REQUIRED_KEYS
    # hassfest's sort_manifest: domain, name, then alphabetical order.
    assert keys == ["domain", "name", *sorted(set(keys) - {"domain", "name"})]


def test_manifest_values_are_valid() -> None:
    """The values hassfest (and HACS) validate for a custom integration."""
    assert MANIFEST["domain"] == PACKAGE.name
    assert MANIFEST["name"] == HACS_JSON["name"]
    # custom_documentation_url: https, and not Home Assistant's own documentation.
    assert _is_https_url(MANIFEST["documentation"])
    assert not MANIFEST["documentation"].startswith(CORE_DOCUMENTATION)
    assert _is_https_url(MANIFEST["issue_tracker"])
    assert MANIFEST["codeowners"]
    assert all(re.fullmatch(r"@[\w.-]+(/[\w.-]+)?", o) for o in MANIFEST["codeowners"])
    assert MANIFEST["iot_class"] in SUPPORTED_IOT_CLASSES
    integration_types = set(get_args(get_type_hints(Manifest)["integration_type"]))
    assert MANIFEST["integration_type"] in integration_types - {"virtual"}
    assert MANIFEST["config_flow"] is True
    assert (PACKAGE / "config_flow.py").is_file()


DEVELOPMENT_ONLY = {"matplotlib"}
"""Imported inside the benchmark's plot functions only, which the command line (tools/bench) calls."""


def _imported_packages(
    node: ast.AST, in_function: bool = False
) -> Iterator[tuple[str, bool]]:
    """Yield the top-level packages imported, outside ``if TYPE_CHECKING:``, and whether in a function."""
    for child in ast.iter_child_nodes(node):
        if (
            isinstance(child, ast.If)
            and isinstance(child.test, ast.Name)
            and child.test.id == "TYPE_CHECKING"
        ):
            continue
        if isinstance(child, ast.Import):
            for alias in child.names:
                yield alias.name.partition(".")[0], in_function
        elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
            yield child.module.partition(".")[0], in_function
        yield from _imported_packages(
            child,
            in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)),
        )


def test_the_integration_needs_nothing_beyond_home_assistant() -> None:
    """No requirement: what the package imports is Python's, Home Assistant's or its requirements'.

    dependency-transparency holds without a dependency. The benchmark's plots are the one
    exception (``DEVELOPMENT_ONLY``), imported when the command line draws them, never on load.
    """
    assert MANIFEST["requirements"] == []
    ours = {
        "__future__",
        "custom_components",
        "homeassistant",
        *sys.stdlib_module_names,
    }
    home_assistant = {
        canonicalize_name(Requirement(requirement).name)
        for requirement in requires("homeassistant") or []
    }
    distributions = packages_distributions()
    outside = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in PACKAGE.rglob("*.py")
        for name, in_function in _imported_packages(ast.parse(path.read_text("utf-8")))
        if name not in ours
        and not (name in DEVELOPMENT_ONLY and in_function)
        and not home_assistant
        & {canonicalize_name(dist) for dist in distributions.get(name, [])}
    }
    assert not outside


def test_manifest_dependencies_are_integrations() -> None:
    """Each dependency is a Home Assistant integration, listed once (hassfest's dependencies)."""
    dependencies = MANIFEST["dependencies"]
    after = MANIFEST["after_dependencies"]
    assert not set(dependencies) & set(after)
    for domain in [*dependencies, *after]:
        assert find_spec(f"homeassistant.components.{domain}") is not None, domain


# hassfest's dependencies.py ALLOWED_USED_COMPONENTS (besides the entity platforms): integrations
# any integration may import without naming them. From
# https://github.com/home-assistant/core/blob/02c260ad4cffb8a1eea56b1296456713a795ba41/script/hassfest/dependencies.py
ALLOWED_USED_COMPONENTS = {
    "alert",
    "automation",
    "conversation",
    "default_config",
    "device_automation",
    "frontend",
    "group",
    "homeassistant",
    "input_boolean",
    "input_button",
    "input_datetime",
    "input_number",
    "input_select",
    "input_text",
    "media_source",
    "onboarding",
    "panel_custom",
    "persistent_notification",
    "person",
    "script",
    "shopping_list",
    "sun",
    "system_health",
    "system_log",
    "timer",
    "webhook",
    "websocket_api",
    "zone",
    "mjpeg",
    "stream",
}


def _referenced_integrations(module: ast.Module) -> Iterator[str]:
    """Yield the integrations a module imports, outside ``if TYPE_CHECKING:`` (as hassfest)."""
    pending: list[ast.AST] = [module]
    while pending:
        node = pending.pop()
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING"
        ):
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("homeassistant.components."):
                yield node.module.split(".")[2]
            elif node.module == "homeassistant.components":
                yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("homeassistant.components."):
                    yield alias.name.split(".")[2]
        pending.extend(ast.iter_child_nodes(node))


def test_imported_integrations_are_declared() -> None:
    """Every integration our code imports is a dependency, an after-dependency or allowed."""
    allowed = (
        ALLOWED_USED_COMPONENTS
        | {platform.value for platform in Platform}
        | set(MANIFEST["dependencies"])
        | set(MANIFEST["after_dependencies"])
    )
    undeclared = {
        f"{path.relative_to(PACKAGE)}: {domain}"
        for path in PACKAGE.rglob("*.py")
        for domain in _referenced_integrations(ast.parse(path.read_text("utf-8")))
        # A platform of ours for that integration (diagnostics.py, repairs.py) may import it.
        if domain not in allowed and not (PACKAGE / f"{domain}.py").is_file()
    }
    assert not undeclared


# --- translations -----------------------------------------------------------------------------

# hassfest validates strings.json and, for a custom integration, translations/en.json with
# translations.py's validate_translation_value: no HTML, no placeholder in single quotes,
# placeholders that are identifiers, no combined reference, no surrounding spaces, no URL. From
# https://github.com/home-assistant/core/blob/00a70521db04c9882a34d93ca23bee2f6d2334d5/script/hassfest/translations.py
RE_URL = re.compile(
    r"(((ftp|ftps|scp|http|https|mqtt|mqtts|socket|socks5):\/\/|www\.)"
    r"[a-z0-9]+([\-\.]{1}[a-z0-9]+)*\.[a-z]{2,5}(:[0-9]{1,5})?(\/.*)?)",
    re.IGNORECASE,
)
RE_ANY_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S", re.IGNORECASE)
"""Stricter than the pattern above, which lets an IP address through (``http://192.168.1.20``):
hassfest's rule is that strings carry no URL at all, a description placeholder does."""
RE_PLACEHOLDER_IN_SINGLE_QUOTES = re.compile(r"'{\w+}'")
RE_COMBINED_REFERENCE = re.compile(r"(.+\[%)|(%\].+)")
RE_HTML = re.compile(r"<[a-z/!][^>]*>", re.IGNORECASE)
"""What Home Assistant's ``cv.string_with_no_html`` refuses."""


def _strings(data: dict[str, Any], path: str = "") -> Iterator[tuple[str, str]]:
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _strings(value, f"{path}{key}.")
        else:
            yield f"{path}{key}", value


def _translation_problems(value: str) -> list[str]:
    problems = []
    if RE_HTML.search(value):
        problems.append("HTML")
    if RE_PLACEHOLDER_IN_SINGLE_QUOTES.search(value):
        problems.append("a placeholder in single quotes")
    if any(
        name and not name.isidentifier()
        for _, name, _, _ in string.Formatter().parse(value)
    ):
        problems.append("a placeholder that is not an identifier")
    if RE_COMBINED_REFERENCE.search(value):
        problems.append("a combined reference")
    if value != value.strip():
        problems.append("surrounding spaces")
    if RE_URL.search(value) or RE_ANY_URL.search(value):
        problems.append("a URL")
    return problems


def test_translation_check_finds_what_hassfest_refuses() -> None:
    """The check below fails the strings hassfest fails."""
    assert _translation_problems("Open http://example.com") == ["a URL"]
    assert _translation_problems("Server '{url}' ") == [
        "a placeholder in single quotes",
        "surrounding spaces",
    ]
    assert _translation_problems("<b>{url}</b>") == ["HTML"]
    assert _translation_problems("Base URL, e.g. http://192.168.1.20:11434") == [
        "a URL"
    ]
    assert _translation_problems("Base URL, e.g. {example_url}") == []


@pytest.mark.parametrize(
    "name", ["strings.json", "translations/en.json", "translations/fr.json"]
)
def test_translations_pass_hassfest(name: str) -> None:
    """Every string of the files hassfest validates passes its value rules."""
    problems = {
        key: found
        for key, value in _strings(_json(PACKAGE / name))
        if (found := _translation_problems(value))
    }
    assert not problems


# --- hacs.json --------------------------------------------------------------------------------

# HACS' HACS_MANIFEST_JSON_SCHEMA (no other key allowed; name required), from
# https://github.com/hacs/integration/blob/3249355704d1a716e637d4d044b6cb4ae72dc271/custom_components/hacs/utils/validate.py
HACS_JSON_KEYS: dict[str, type | tuple[type, ...]] = {
    "content_in_root": bool,
    "country": (str, list),
    "filename": str,
    "hacs": str,
    "hide_default_branch": bool,
    "homeassistant": str,
    "name": str,
    "persistent_directory": str,
    "render_readme": bool,
    "zip_release": bool,
}


def test_hacs_json_is_valid() -> None:
    """Known keys of the right types; a zip release names its file (HACS' hacsjson check)."""
    assert set(HACS_JSON) <= set(HACS_JSON_KEYS)
    assert HACS_JSON["name"]
    for key, value in HACS_JSON.items():
        assert isinstance(value, HACS_JSON_KEYS[key]), key
    if HACS_JSON.get("zip_release"):
        assert HACS_JSON.get("filename", "").endswith(".zip")


def test_hacs_json_minimum_home_assistant() -> None:
    """The minimum is one the tests run on, and the one README.md states."""
    minimum = HACS_JSON["homeassistant"]
    assert AwesomeVersion(minimum) <= AwesomeVersion(HA_VERSION)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"Requires Home Assistant {minimum} or newer" in readme


# --- quality_scale.yaml -----------------------------------------------------------------------

# hassfest's ALL_RULES, per tier, from
# https://github.com/home-assistant/core/blob/008538e822535b1d6155c91f6642127afa184ed1/script/hassfest/quality_scale.py
# (the same rules as the developer documentation's tiers.json at
# https://github.com/home-assistant/developers.home-assistant/blob/186ad063987c56ccdbbc2145bb262d877eb15976/docs/core/integration-quality-scale/_includes/tiers.json).
QUALITY_SCALE_RULES = {
    "bronze": [
        "action-setup",
        "appropriate-polling",
        "brands",
        "common-modules",
        "config-flow",
        "config-flow-test-coverage",
        "dependency-transparency",
        "docs-actions",
        "docs-conditions",
        "docs-high-level-description",
        "docs-installation-instructions",
        "docs-removal-instructions",
        "docs-triggers",
        "entity-event-setup",
        "entity-unique-id",
        "has-entity-name",
        "runtime-data",
        "test-before-configure",
        "test-before-setup",
        "unique-config-entry",
    ],
    "silver": [
        "action-exceptions",
        "config-entry-unloading",
        "docs-configuration-parameters",
        "docs-installation-parameters",
        "entity-unavailable",
        "integration-owner",
        "log-when-unavailable",
        "parallel-updates",
        "reauthentication-flow",
        "test-coverage",
    ],
    "gold": [
        "devices",
        "diagnostics",
        "discovery",
        "discovery-update-info",
        "docs-data-update",
        "docs-examples",
        "docs-known-limitations",
        "docs-supported-devices",
        "docs-supported-functions",
        "docs-troubleshooting",
        "docs-use-cases",
        "dynamic-devices",
        "entity-category",
        "entity-device-class",
        "entity-disabled-by-default",
        "entity-translations",
        "exception-translations",
        "icon-translations",
        "reconfiguration-flow",
        "repair-issues",
        "stale-devices",
    ],
    "platinum": ["async-dependency", "inject-websession", "strict-typing"],
}
ALL_RULES = [rule for rules in QUALITY_SCALE_RULES.values() for rule in rules]


def _status(value: object) -> str:
    """Return a rule's status as hassfest's SCHEMA accepts it, or fail.

    ``done`` or ``todo`` alone, or a mapping of ``status`` and ``comment`` (an ``exempt`` always
    has one); a comment here must also say something.
    """
    if value in ("done", "todo"):
        return str(value)
    assert isinstance(value, dict), value
    assert set(value) == {"status", "comment"}, value
    assert value["status"] in ("done", "exempt", "todo"), value
    assert isinstance(value["comment"], str) and value["comment"].strip(), value
    return str(value["status"])


def test_quality_scale_names_every_rule() -> None:
    """Every rule of the four tiers, nothing else, each with a valid status."""
    assert len(ALL_RULES) == len(set(ALL_RULES)) == 54
    assert sorted(QUALITY_SCALE) == sorted(ALL_RULES)
    for rule, value in QUALITY_SCALE.items():
        assert _status(value), rule


def test_quality_scale_is_complete() -> None:
    """Every rule of bronze to platinum is done or exempt: none is left to do."""
    assert [rule for rule in ALL_RULES if _status(QUALITY_SCALE[rule]) == "todo"] == []


def test_quality_scale_status_check_refuses_what_hassfest_refuses() -> None:
    """A bare ``exempt``, an exempt without comment and an unknown status all fail."""
    for value in (
        "exempt",
        {"status": "exempt"},
        {"status": "exempt", "comment": " "},
        "partially",
    ):
        with pytest.raises(AssertionError):
            _status(value)


def _module(name: str) -> ast.Module:
    return ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8"))


def _async_function(module: ast.Module, name: str) -> ast.AsyncFunctionDef | None:
    return next(
        (
            node
            for node in module.body
            if isinstance(node, ast.AsyncFunctionDef) and node.name == name
        ),
        None,
    )


def _defines(module: ast.Module, name: str) -> bool:
    return any(
        isinstance(node, ast.AsyncFunctionDef) and node.name == name
        for node in ast.walk(module)
    )


def _calls(module: ast.AST, name: str) -> bool:
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == name
        for node in ast.walk(module)
    )


def _platform_modules() -> list[str]:
    return [p.value for p in Platform if (PACKAGE / f"{p.value}.py").is_file()]


def _sets_parallel_updates(name: str) -> bool:
    return any(
        isinstance(node, ast.Assign)
        and any(
            isinstance(target, ast.Name) and target.id == "PARALLEL_UPDATES"
            for target in node.targets
        )
        for node in _module(name).body
    )


TYPED_ENTRY = re.compile(r"^[A-Za-z]+ConfigEntry$")


def _entry_annotations() -> Iterator[tuple[str, ast.expr | None]]:
    """Yield the config entry arguments hassfest wants typed with our own ConfigEntry alias."""
    functions = {
        "__init__": [
            "async_migrate_entry",
            "async_remove_config_entry_device",
            "async_remove_entry",
            "async_setup_entry",
            "async_unload_entry",
        ],
        "diagnostics": [
            "async_get_config_entry_diagnostics",
            "async_get_device_diagnostics",
        ],
        **{platform: ["async_setup_entry"] for platform in _platform_modules()},
    }
    for module_name, names in functions.items():
        module = _module(module_name)
        for name in names:
            if (function := _async_function(module, name)) is not None:
                yield f"{module_name}.{name}", function.args.args[1].annotation
    for node in _module("config_flow").body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if (
                    isinstance(item, ast.FunctionDef)
                    and item.name == "async_get_options_flow"
                ):
                    yield f"config_flow.{item.name}", item.args.args[0].annotation


def _annotations(module: ast.Module) -> Iterator[tuple[int, ast.expr]]:
    """Yield every annotation of a module: arguments, returns and annotated assignments."""
    for node in ast.walk(module):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            for argument in (
                *arguments.posonlyargs,
                *arguments.args,
                *arguments.kwonlyargs,
                *filter(None, (arguments.vararg, arguments.kwarg)),
            ):
                if argument.annotation is not None:
                    yield argument.lineno, argument.annotation
            if node.returns is not None:
                yield node.lineno, node.returns
        elif isinstance(node, ast.AnnAssign):
            yield node.lineno, node.annotation


def _bare_entries() -> list[str]:
    """Return where the package annotates a plain ``ConfigEntry`` rather than our typed alias."""
    return [
        f"{path.relative_to(PACKAGE)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, annotation in _annotations(ast.parse(path.read_text("utf-8")))
        if any(
            isinstance(node, ast.Name) and node.id == "ConfigEntry"
            for node in ast.walk(annotation)
        )
    ]


def _untyped_entries() -> list[str]:
    return [
        name
        for name, annotation in _entry_annotations()
        if not (isinstance(annotation, ast.Name) and TYPED_ENTRY.match(annotation.id))
    ] + _bare_entries()


def _runtime_data() -> bool:
    setup = _async_function(_module("__init__"), "async_setup_entry")
    assert setup is not None
    entry = setup.args.args[1].arg
    return any(
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == entry
        and node.attr == "runtime_data"
        and isinstance(node.ctx, ast.Store)
        for node in ast.walk(setup)
    )


def _strict_typing() -> bool:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return pyproject["tool"]["mypy"]["strict"] is True and not _untyped_entries()


def _test_before_setup() -> bool:
    setup = _async_function(_module("__init__"), "async_setup_entry")
    assert setup is not None
    raised = {"ConfigEntryNotReady", "ConfigEntryAuthFailed", "ConfigEntryError"}
    return _calls(setup, "async_config_entry_first_refresh") or any(
        isinstance(node, ast.Raise)
        and raised & set(re.findall(r"\w+", ast.unparse(node)))
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text("utf-8")))
    )


DISCOVERY_MANIFEST_KEYS = {
    "bluetooth",
    "dhcp",
    "homekit",
    "mqtt",
    "ssdp",
    "usb",
    "zeroconf",
}
DISCOVERY_STEPS = {
    "async_step_bluetooth",
    "async_step_discovery",
    "async_step_dhcp",
    "async_step_hassio",
    "async_step_homekit",
    "async_step_mqtt",
    "async_step_ssdp",
    "async_step_usb",
    "async_step_zeroconf",
}

# What hassfest's validators (script/hassfest/quality_scale_validation/, the commits above and
# https://github.com/home-assistant/core/tree/19ef880cde90a6cec6b83f0d262715b6c5b4b670/script/hassfest/quality_scale_validation)
# look for when a rule is marked done. hassfest runs them on core integrations only: here they
# hold our claims to the same test. strict-typing's (a line in core's .strict-typing) becomes
# mypy's strict mode over the package (which scripts/test runs), with the typed config entry
# that hassfest's runtime-data check then asks for, in its functions and in every other
# annotation of the package.
RULE_CHECKS: dict[str, Callable[[], bool]] = {
    "config-flow": lambda: (
        MANIFEST.get("config_flow") is True and (PACKAGE / "config_flow.py").is_file()
    ),
    "config-entry-unloading": lambda: (
        _async_function(_module("__init__"), "async_unload_entry") is not None
    ),
    "diagnostics": lambda: (
        (PACKAGE / "diagnostics.py").is_file()
        and (
            _defines(_module("diagnostics"), "async_get_config_entry_diagnostics")
            or _defines(_module("diagnostics"), "async_get_device_diagnostics")
        )
    ),
    "discovery": lambda: (
        bool(DISCOVERY_MANIFEST_KEYS & set(MANIFEST))
        or any(_defines(_module("config_flow"), step) for step in DISCOVERY_STEPS)
    ),
    "parallel-updates": lambda: all(map(_sets_parallel_updates, _platform_modules())),
    "reauthentication-flow": lambda: _defines(
        _module("config_flow"), "async_step_reauth"
    ),
    "reconfiguration-flow": lambda: _defines(
        _module("config_flow"), "async_step_reconfigure"
    ),
    "runtime-data": _runtime_data,
    "strict-typing": _strict_typing,
    "test-before-setup": _test_before_setup,
    "unique-config-entry": lambda: (
        MANIFEST.get("single_config_entry") is True
        or _calls(_module("config_flow"), "_async_abort_entries_match")
        or (
            _calls(_module("config_flow"), "async_set_unique_id")
            and _calls(_module("config_flow"), "_abort_if_unique_id_configured")
        )
    ),
}


@pytest.mark.parametrize("rule", sorted(RULE_CHECKS))
def test_quality_scale_claims_hold(rule: str) -> None:
    """A rule marked done passes hassfest's check of it; one marked exempt or todo does not.

    (A rule that passes while marked todo is done; one that passes while exempt is not exempt.)
    """
    assert RULE_CHECKS[rule]() is (_status(QUALITY_SCALE[rule]) == "done")


# --- the version, the changelog ---------------------------------------------------------------


def test_one_version_everywhere() -> None:
    """The manifest's version is semantic, pyproject.toml's, and a heading of CHANGELOG.md."""
    version = MANIFEST["version"]
    assert AwesomeVersion(version).strategy is AwesomeVersionStrategy.SEMVER
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["version"] == version
    headings = re.findall(
        r"^## \[(.+?)\](?: - (\d{4}-\d{2}-\d{2}))?$",
        (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"),
        re.MULTILINE,
    )
    # Keep a Changelog: Unreleased first (no date), then the releases, newest first, dated.
    assert headings[0] == ("Unreleased", "")
    released = [AwesomeVersion(name) for name, _ in headings[1:]]
    assert released == sorted(released, reverse=True)
    assert all(date for _, date in headings[1:])
    assert version in [name for name, _ in headings]


# --- the workflows ----------------------------------------------------------------------------


def _workflow(name: str) -> dict[Any, Any]:
    data: dict[Any, Any] = yaml.safe_load((WORKFLOWS / name).read_text("utf-8"))
    return data


def _triggers(workflow: dict[Any, Any]) -> dict[str, Any]:
    # YAML 1.1, as PyYAML reads it, takes the key "on" for the boolean true.
    triggers: dict[str, Any] = workflow[True]
    return triggers


def _steps(workflow: dict[Any, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job["steps"]]


def _uses(workflow: dict[Any, Any], action: str) -> list[dict[str, Any]]:
    return [
        step
        for step in _steps(workflow)
        if step.get("uses", "").partition("@")[0] == action
    ]


def test_validate_workflow_runs_hacs_and_hassfest() -> None:
    """HACS' action for an integration with no check ignored, and hassfest, also nightly."""
    workflow = _workflow("validate.yaml")
    assert {"push", "pull_request", "schedule", "workflow_dispatch"} <= set(
        _triggers(workflow)
    )
    (hacs,) = _uses(workflow, "hacs/action")
    assert hacs["with"] == {"category": "integration"}
    assert len(_uses(workflow, "home-assistant/actions/hassfest")) == 1


def test_test_workflow_runs_ci_run() -> None:
    """``.ci/run`` as root, its cache folder cached by the requirements and the manifest."""
    workflow = _workflow("test.yaml")
    (job,) = workflow["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest"
    assert "LLM_LANES_CACHE" in job["env"]
    assert [
        step["run"] for step in job["steps"] if "ci/run" in step.get("run", "")
    ] == ["sudo -E .ci/run"]
    (restore,) = _uses(workflow, "actions/cache/restore")
    assert (
        "hashFiles('requirements_test.txt', 'custom_components/llm_lanes/manifest.json')"
        in restore["with"]["key"]
    )
    assert len(_uses(workflow, "actions/cache/save")) == 1


def test_release_workflow_checks_the_tag() -> None:
    """On a published release, the tag is compared with the manifest's version."""
    workflow = _workflow("release.yaml")
    assert _triggers(workflow) == {"release": {"types": ["published"]}}
    scripts = "\n".join(step.get("run", "") for step in _steps(workflow))
    assert "custom_components/llm_lanes/manifest.json" in scripts
    assert '[ "$TAG" != "$version" ]' in scripts
    assert "gh release upload" in scripts


@pytest.mark.parametrize("name", ["validate.yaml", "test.yaml", "release.yaml"])
def test_workflow_actions_are_pinned_to_a_major_version(name: str) -> None:
    """GitHub's actions at a major version; HACS' and hassfest's at the branch they publish."""
    published_branch = {
        "hacs/action": "main",
        "home-assistant/actions/hassfest": "master",
    }
    for step in _steps(_workflow(name)):
        if "uses" not in step:
            continue
        action, _, ref = step["uses"].partition("@")
        assert ref == published_branch.get(action) or re.fullmatch(r"v\d+", ref), step
