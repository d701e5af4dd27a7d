"""Where the tests' own files are, wherever a test module sits."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
