"""Print the integration's pinned requirements from manifest.json, one per line."""

import json
from pathlib import Path
import sys

manifest = (
    Path(__file__).resolve().parents[2] / "custom_components/llm_lanes/manifest.json"
)
sys.stdout.write(
    "".join(f"{req}\n" for req in json.loads(manifest.read_text())["requirements"])
)
