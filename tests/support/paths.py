"""Where the repository's files are, for tests at any depth of ``tests/``."""

from pathlib import Path

#: The repository's root (the folder holding ``pyproject.toml``).
ROOT = Path(__file__).resolve().parents[2]
#: JSON Schemas written from the published reference.
SCHEMAS = ROOT / "tests" / "support" / "schemas"
