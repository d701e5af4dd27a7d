"""What a stack dump file shows of one process, and how its words become model values.

``dumptext`` (py-spy's text, ``ray stack``) and ``dumpjson`` (``py-spy dump --json``) turn
a file into ``ProcessDump`` values, one per dump in the file's order; ``dumpfile`` groups
them by process and builds the ``JobSnapshot``. This module holds what both parsers share:
the ``ProcessDump`` itself, how a frame of py-spy's *text* is read (native or Python, and
where its code comes from, from the path py-spy shortened), and what a py-spy error
message means (``CaptureError``).

py-spy's text shortens a file name to its path inside its package (``torch/distributed/
distributed_c10d.py``, ``threading.py``, ``deepspeed/comm/comm.py``), which on its own
reads as the job's code. ``python_filename`` restores what the layout implies, with the
part py-spy left out written as ``…``: torch's own files and those of the well-known
libraries below as ``…/site-packages/PATH``, the standard library's as
``…/lib/pythonX.Y/PATH``; anything else (``train.py``, ``fairseq_cli/train.py``) stays the
job's code, as py-spy printed it. Reports show the path py-spy printed either way.
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass

from ...model import CaptureError, CaptureErrorKind, Frame, ThreadStack
from ..read.pyspy import DENIED_WORDS, NOT_PYTHON_WORDS, clean_message

ELIDED = "…"  # the part of a path py-spy's text left out

# Installed packages of the PyTorch training and serving ecosystem that py-spy's text
# names by their package path: their frames are a library's, not the job's. A package
# not listed here reads as the job's code (the safe side: a library frame taken for the
# job's only names a deeper call site).
KNOWN_LIBRARIES = frozenset(
    {
        "accelerate",
        "aiohttp",
        "anyio",
        "apex",
        "bitsandbytes",
        "click",
        "composer",
        "datasets",
        "deepspeed",
        "fairscale",
        "fastapi",
        "filelock",
        "flash_attn",
        "fsspec",
        "grpc",
        "httpx",
        "huggingface_hub",
        "hydra",
        "lightning",
        "lightning_fabric",
        "mlflow",
        "numpy",
        "omegaconf",
        "pandas",
        "peft",
        "psutil",
        "pyarrow",
        "pytorch_lightning",
        "ray",
        "requests",
        "safetensors",
        "setproctitle",
        "sglang",
        "starlette",
        "streaming",
        "tensorboard",
        "tokenizers",
        "torchaudio",
        "torchdata",
        "torchvision",
        "tqdm",
        "transformers",
        "triton",
        "trl",
        "urllib3",
        "uvicorn",
        "uvloop",
        "vllm",
        "wandb",
        "xformers",
        "zmq",
    }
)
# What native code's file names end with (``--native`` frames: a library, or a source file
# where symbols have line information).
_NATIVE_FILE = re.compile(
    r"\.(so(\.\d+)*|dylib|dll|c|cc|cpp|cxx|c\+\+|h|hh|hpp|hxx|inl|cu|cuh|s|rs|pyx|pxd|pxi|f90)$", re.IGNORECASE
)
_PYTHON_FILE = re.compile(r"\.pyw?$")

# py-spy's words for a process that was gone (a refused ptrace and a process without
# Python read as ``pyspy`` reads them from a live run)
_GONE = ("no such process", "(os error 3)", "process not found", "no process")


@dataclass(frozen=True, slots=True)
class ProcessDump:
    """One dump of one process as a file shows it."""

    line: int  # where it starts in the file (1-based), for messages
    pid: int | None  # None when the file does not say
    cmdline: str = ""  # as shown (py-spy's header, ray stack's ps line, py-spy's JSON)
    # the lines just before it that are not py-spy's own: a loop's echo, a log prefix
    label: str = ""
    threads: tuple[ThreadStack, ...] = ()
    error: CaptureError | None = None  # py-spy failed on this process; no threads
    python: str = ""  # the interpreter version py-spy's header shows ("3.11.7")
    # what a pasted stack's label says (``dumpcondensed``): its rank, the words it was read
    # from, and a world size the text states
    rank: int | None = None
    rank_words: str = ""
    world_size: int | None = None


def is_native(filename: str, line: int | None) -> bool:
    """Whether a frame of py-spy's text is native code (``--native``): a library
    (``libc.so.6``), a native source file (``ProcessGroupGloo.cpp:12``), an executable
    without a line (``python3.12``), or no file at all (``?``)."""
    if filename.startswith("<") or _PYTHON_FILE.search(filename):
        return False
    if filename in ("?", "") or _NATIVE_FILE.search(filename):
        return True
    return line is None  # a Python script without a .py suffix still has a line number


def python_filename(shown: str, python: str = "") -> str:
    """The file name of a Python frame of py-spy's text, its origin made readable to
    ``model.frame_origin`` (see the module docstring). Absolute paths (``--full-filenames``)
    and ``<frozen ...>`` stay as they are."""
    if not shown or shown.startswith(("/", "<", ELIDED)) or ":" in shown[:3]:
        return shown
    top = shown.split("/", 1)[0].removesuffix(".py").removesuffix(".pyw")
    if top == "torch" or top in KNOWN_LIBRARIES:
        return f"{ELIDED}/site-packages/{shown}"
    if top in sys.stdlib_module_names:
        version = (
            ".".join(python.split(".")[:2])
            if re.match(r"3\.\d+", python)
            else f"{sys.version_info.major}.{sys.version_info.minor}"
        )
        return f"{ELIDED}/lib/python{version}/{shown}"
    return shown


@functools.lru_cache(maxsize=1 << 16)
def text_frame(function: str, shown: str, line: int | None, python: str = "") -> Frame:
    """A frame as py-spy's text names it: ``function (file:line)``; the same frame of
    another rank is the same object (interned, as a bundle stores it once)."""
    if is_native(shown, line):
        return Frame(function=function, filename=shown, line=line, native=True)
    return Frame(function=function, filename=python_filename(shown, python), line=line)


def capture_error(message: str) -> CaptureError:
    """What py-spy's error message (as printed in a dump file) says went wrong."""
    lowered = message.lower()
    text = clean_message(message) if message.strip() else "py-spy failed without a message"
    if any(p in lowered for p in DENIED_WORDS):
        return CaptureError(CaptureErrorKind.PTRACE_DENIED, text)
    if any(p in lowered for p in NOT_PYTHON_WORDS):
        return CaptureError(CaptureErrorKind.NOT_PYTHON, text)
    if any(p in lowered for p in _GONE):
        return CaptureError(CaptureErrorKind.PROCESS_GONE, text)
    return CaptureError(CaptureErrorKind.PYSPY_FAILED, text)
