"""Generated docs stay in step with the code."""

import subprocess
import sys

from support.paths import REPO

ROOT = REPO


def test_generated_docs_are_current() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_docs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr


def test_readme_commands_exist_in_makefile() -> None:
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert f"make {target}" in readme
        assert f"\n{target}:" in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text()
