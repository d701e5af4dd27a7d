"""The build steps ``pyproject.toml`` cannot declare.

hangdoc's start-up hook for the in-process probe, ``hangdoc/probe_hook/hangdoc-probe.pth``,
goes to the root of site-packages, where Python runs it at start-up (``HANGDOC_PROBE=1``
turns it on):

- a wheel (``pip install hangdoc``, pipx, ``pip install .``): ``build_py`` copies it to the
  root of the wheel;
- an editable install (``pip install -e .``, PEP 660): setuptools' editable wheel holds
  only its own path hook, so ``editable_wheel`` adds the file to the wheel it built (with
  its RECORD line: pip uninstalls it like any other file).

The agent API's definition, ``proto/hangdoc/v1/agent.proto`` (where ``make proto`` reads
it), is shipped beside the code generated from it: ``build_py`` copies it to
``hangdoc/fleet/v1/agent.proto`` in the wheel (MANIFEST.in puts it in the sdist). An
editable install reads it where it is.

Everything else about the project is in ``pyproject.toml``.
"""

from __future__ import annotations

import base64
import hashlib
import time
import warnings
import zipfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel
from setuptools.warnings import InformationOnly

ROOT = Path(__file__).resolve().parent
PTH = ROOT / "hangdoc" / "probe_hook" / "hangdoc-probe.pth"
PROTO = ROOT / "proto" / "hangdoc" / "v1" / "agent.proto"
# what build_py adds to the wheel: each file, and where it goes in the wheel
EXTRA = ((PTH, PTH.name), (PROTO, "hangdoc/fleet/v1/agent.proto"))


class BuildPyWithProbeHook(build_py):
    """``build_py`` that also puts the hook at the root of the wheel, and the .proto beside
    the code generated from it."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            for source, target in EXTRA:
                self.copy_file(str(source), str(Path(self.build_lib) / target))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if self.editable_mode:
            return outputs
        return [*outputs, *(str(Path(self.build_lib) / target) for _, target in EXTRA)]


class EditableWheelWithProbeHook(editable_wheel):
    """``editable_wheel`` whose wheel also installs the hook at the root of site-packages."""

    def run(self) -> None:
        started = time.time()
        with warnings.catch_warnings():
            # setuptools' note on every editable install of a package at the project's root
            # ("be careful with folders in your working directory with the same name as your
            # package"): for information only, yet pip shows it as a warning on each `make install`
            warnings.filterwarnings("ignore", message="Editable installation", category=InformationOnly)
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
