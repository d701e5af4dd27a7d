"""The one build step ``pyproject.toml`` cannot declare: hangdoc's start-up hook for the
in-process probe, ``hangdoc/probe_hook/hangdoc-probe.pth``, goes to the root of
site-packages, where Python runs it at start-up (``HANGDOC_PROBE=1`` turns it on).

- a wheel (``pip install hangdoc``, pipx, ``pip install .``): ``build_py`` copies it to the
  root of the wheel;
- an editable install (``pip install -e .``, PEP 660): setuptools' editable wheel holds
  only its own path hook, so ``editable_wheel`` adds the file to the wheel it built (with
  its RECORD line: pip uninstalls it like any other file).

Everything else about the project is in ``pyproject.toml``.
"""

from __future__ import annotations

import base64
import hashlib
import time
import zipfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = Path(__file__).resolve().parent / "hangdoc" / "probe_hook" / "hangdoc-probe.pth"


class BuildPyWithProbeHook(build_py):
    """``build_py`` that also puts the hook at the root of the wheel."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            self.copy_file(str(PTH), str(Path(self.build_lib) / PTH.name))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        return outputs if self.editable_mode else [*outputs, str(Path(self.build_lib) / PTH.name)]


class EditableWheelWithProbeHook(editable_wheel):
    """``editable_wheel`` whose wheel also installs the hook at the root of site-packages."""

    def run(self) -> None:
        started = time.time()
        super().run()
        built = [w for w in Path(self.dist_dir).glob("*.whl") if w.stat().st_mtime >= started - 1]
        if len(built) != 1:
            raise RuntimeError(f"hangdoc: expected one editable wheel in {self.dist_dir}, found {len(built)}")
        _add_to_wheel(built[0], PTH.name, PTH.read_bytes())


def _add_to_wheel(wheel: Path, name: str, data: bytes) -> None:
    """Rewrite ``wheel`` with ``name`` at its root and its line in RECORD."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    rewritten = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as old, zipfile.ZipFile(rewritten, "w", zipfile.ZIP_DEFLATED) as new:
        for item in old.infolist():
            content = old.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                content = content.rstrip(b"\n") + f"\n{name},sha256={digest},{len(data)}\n".encode()
            new.writestr(item, content)
        new.writestr(name, data)
    rewritten.replace(wheel)


setup(cmdclass={"build_py": BuildPyWithProbeHook, "editable_wheel": EditableWheelWithProbeHook})
