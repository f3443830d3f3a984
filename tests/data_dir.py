"""Where the suite's reference data lives: tests/data, copied from the project's shared/ folder (provenance and
licences in tests/data/README.md), so a fresh clone runs every test with nothing beside it."""
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
