"""Keep secrets on the node: what of an environment and a command line may leave in a snapshot.

Snapshots leave the node and get pasted into issues and chat; anything not known to be
harmless is replaced by ``<redacted>`` before it enters the data model.

Environment (``redact_env``; discover has already chosen the variables by name):

- a variable with a secret-looking name (``is_secret_name``) is hidden whole;
- a variable on the diagnostic allow-list (``RANK``, ``MASTER_ADDR``, ``NCCL_*``, ...) keeps its
  value; any other keeps it only when it has a plain shape (a number, boolean, identifier, list,
  ``host:port``, path, or URL without user or query, with no run of more than 16 letters and
  digits), and is hidden whole otherwise.

Command lines (``redact_argv``): the value of a secret option is hidden (``--hf-token X``,
``--api_key=X``, abbreviations such as ``--api-k``, ``--pw``, ``-p`` unless a port or a path),
even when it starts with ``-``; words of an argument with spaces are read as a command line too.

Inside every kept value and argument (``redact_value``): private-key blocks, URL credentials
(and a URL user that is not a short plain login name), well-known token formats,
``Bearer``/``Basic`` credentials, and the values of secret keys in ``key=value``,
``key: value``, JSON, Python dicts and HTTP headers (``Authorization``, ``X-Api-Key``, ...).

docs/security.md states the rules in full.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

REDACTED = "<redacted>"

# A name is secret when one of its words (split at "_", "-", ".") is one of these, or ends
# with one of them (APIKEY, HFTOKEN). Whole words keep TOKENIZERS_PARALLELISM and PWD innocent.
_SECRET_WORDS = (
    "TOKEN",
    "TOKENS",
    "KEY",
    "KEYS",
    "SECRET",
    "SECRETS",
    "PASSWORD",
    "PASSWORDS",
    "PASSWD",
    "PASS",
    "PW",
    "PASSPHRASE",
    "CREDENTIAL",
    "CREDENTIALS",
    "CREDS",
    "AUTH",
    "AUTHORIZATION",
    "COOKIE",
    "COOKIES",
    "SESSION",
    "PRIVATE",
    "SIGNATURE",
    "DSN",
    "JWT",
    "BEARER",
    "SALT",
    "HMAC",
    "APIKEY",
    "CONNSTR",
)
_SECRET_SUFFIXES = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIALS", "COOKIE")
_WORD_SPLIT = re.compile(r"[_.\-]+")
# Secret names whose abbreviations (4+ letters, as argparse accepts) are secret options too.
_SECRET_OPTIONS = (
    "APIKEY",
    "APITOKEN",
    "AUTHTOKEN",
    "ACCESSTOKEN",
    "SECRETKEY",
    "PRIVATEKEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIALS",
)
# Passwords for mysql, sshpass, ... but ports and working directories elsewhere.
_AMBIGUOUS_OPTIONS = ("p", "pwd")
# Single-dash options that are not "-p" with a password glued on (-pSECRET).
_P_OPTIONS = ("password", "passwd", "pass", "passphrase", "pw", "pwd")
_FILE_WORDS = ("FILE", "FILES", "FILENAME", "PATH", "DIR")
# A file's location, not its content: /x, ./x, ../x, ~/x.
_PATH = re.compile(r"(?:~|\.{1,2})?/[^\s:@=]*")

# Variables whose values diagnosis reads and that hold no credentials: shown as they are.
_DIAGNOSTIC_VARS = frozenset(
    (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "NODE_RANK",
        "NNODES",
        "MASTER_ADDR",
        "MASTER_PORT",
        "HOSTNAME",
        "OMP_NUM_THREADS",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_LAUNCH_BLOCKING",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "PYTORCH_CUDA_ALLOC_CONF",
        "TORCH_DISTRIBUTED_DEBUG",
        "TORCH_CPP_LOG_LEVEL",
        "TORCH_SHOW_CPP_STACKTRACES",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TP_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "CONDA_DEFAULT_ENV",
        "PYTHONPATH",
        "SLURM_JOB_ID",
        "SLURM_JOBID",
        "SLURM_STEP_ID",
        "SLURM_STEPID",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_NODEID",
        "SLURM_NTASKS",
        "SLURM_NPROCS",
        "SLURM_NTASKS_PER_NODE",
        "SLURM_TASKS_PER_NODE",
        "SLURM_NNODES",
        "SLURM_JOB_NUM_NODES",
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
        "SLURM_STEP_NODELIST",
        "SLURM_ARRAY_JOB_ID",
        "SLURM_ARRAY_TASK_ID",
        "SLURM_CPUS_PER_TASK",
        "SLURMD_NODENAME",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "PMI_RANK",
        "PMI_SIZE",
        "PMIX_RANK",
    )
)
_DIAGNOSTIC_PREFIXES = ("NCCL_", "TORCH_NCCL_")  # NCCL's tuning knobs

_PLAIN_CHARS = r"[A-Za-z0-9_.,+~\-]"
_PATH_CHARS = r"[A-Za-z0-9_.,+~/\-]"
_PLAIN_PATH = rf"{_PLAIN_CHARS}*/{_PATH_CHARS}*"
_PLAIN_VALUE = re.compile(
    # number, boolean, identifier, list, host:port; path, path list; URL without user or query
    rf"{_PLAIN_CHARS}*(?::\d{{1,5}})?"
    rf"|{_PLAIN_PATH}(?::{_PLAIN_PATH})*"
    rf"|[A-Za-z][A-Za-z0-9+.\-]*://[A-Za-z0-9.\-]+(?::\d{{1,5}})?(?:/{_PATH_CHARS}*)?"
)
_OPAQUE = re.compile(r"[A-Za-z0-9]{17,}")

_PRIVATE_KEY = re.compile(
    r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END[A-Z0-9 ]*PRIVATE KEY-----|\Z)",
    re.DOTALL,
)
# A URL runs to whitespace, a quote, "<" (as in <redacted>) or the next URL; its userinfo
# to its last "@", so that passwords with "/" or "@" in them are hidden whole.
_URL = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)"
    r"(?P<rest>(?:(?![A-Za-z][A-Za-z0-9+.\-]*://)[^\s\"'<>])*)"
)
_LOGIN_NAME = re.compile(r"[a-z_][a-z0-9_.\-]{0,15}")  # git, ubuntu, x-access-token

_AWS_KEY_ID_FORMAT = r"(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"
# Known token formats; each needs enough characters after the prefix to be a real token.
_TOKEN_FORMATS = (
    r"gh[pousr]_[A-Za-z0-9]{20,}",  # GitHub
    r"github_pat_[A-Za-z0-9_]{20,}",
    r"glpat-[A-Za-z0-9_\-]{20,}",  # GitLab
    r"hf_[A-Za-z0-9]{20,}",  # Hugging Face
    r"sk-[A-Za-z0-9_\-]{20,}",  # OpenAI, Anthropic (sk-ant-)
    r"[sr]k_(?:live|test)_[A-Za-z0-9]{16,}",  # Stripe
    r"xox[abposr]-[A-Za-z0-9\-]{10,}",  # Slack
    _AWS_KEY_ID_FORMAT,
    r"AIza[A-Za-z0-9_\-]{35}",  # Google API keys
    r"ya29\.[A-Za-z0-9_\-]{20,}",  # Google OAuth tokens
    r"eyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]*",  # JWT
    r"wandb_v1_[A-Za-z0-9_]{20,}",
    r"npm_[A-Za-z0-9]{36}",
    r"pypi-[A-Za-z0-9_\-]{50,}",
)
_TOKENS = re.compile(r"(?<![A-Za-z0-9])(?:" + "|".join(_TOKEN_FORMATS) + ")")
_AWS_KEY_ID = re.compile(r"(?<![A-Za-z0-9])" + _AWS_KEY_ID_FORMAT)
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_AUTH_SCHEME = re.compile(r"(?P<head>\b(?:Bearer|Basic)\s+)[A-Za-z0-9+/=._~\-]{8,}", re.IGNORECASE)

# key=value, key: value, "key": ..., 'key': ..., env['KEY'] = ...; the value is read apart.
_PAIR = re.compile(r"""(?<![A-Za-z0-9_.\-])(?P<q>["']?)(?P<key>[A-Za-z0-9_.\-]+)(?P=q)\]?\s*[=:]\s*""")
# An unquoted value ends at whitespace, a quote, or a , ; & that starts the next pair.
_BARE = re.compile(r"""(?:(?![,;&]\s*["']?[A-Za-z0-9_.\-]+["']?\s*[=:])[^\s"'])+""")
_HEADER_LINE = re.compile(r"[^\r\n\"']*")
_LINE_HEADERS = ("AUTHORIZATION", "COOKIE")  # their whole value is a credential

_OPTION = re.compile(r"--?(?P<name>[A-Za-z0-9_.\-]+)(?:=(?P<value>.*))?", re.DOTALL)


def _words(name: str) -> list[str]:
    return [w for w in _WORD_SPLIT.split(name.upper()) if w]


def is_secret_name(name: str) -> bool:
    """True when a variable or option name says its value is a credential."""
    return any(w in _SECRET_WORDS or w.endswith(_SECRET_SUFFIXES) for w in _words(name))


def _is_secret_option(name: str) -> bool:
    if name.lower() in _AMBIGUOUS_OPTIONS or is_secret_name(name):
        return True
    words = _words(name)
    tails = ("".join(words[i:]) for i in range(len(words)))
    return any(len(t) >= 4 and full.startswith(t) for t in tails for full in _SECRET_OPTIONS)


def _shows(name: str, value: str) -> bool:
    """Whether the value of a secret-named option, key or variable is evidently no secret."""
    short = name.lower().lstrip("-")
    if short == "p" and value.isdigit() and len(value) <= 5:
        return True  # -p 29500: a port
    words = _words(name)
    names_file = short in _AMBIGUOUS_OPTIONS or bool(words and words[-1] in _FILE_WORDS)
    return names_file and _PATH.fullmatch(value) is not None


# ------------------------------------------------------------------ values


def redact_value(value: str) -> str:
    """Hide the secrets inside an otherwise innocent value or argument."""
    return _redact_text(value, aws=False)


def _redact_text(value: str, aws: bool) -> str:
    aws = aws or _AWS_KEY_ID.search(value) is not None
    value = _PRIVATE_KEY.sub(REDACTED, value)
    value = _URL.sub(_redact_url, value)
    value = _TOKENS.sub(REDACTED, value)
    if aws:  # an AWS secret access key has no prefix: only its key id next to it betrays it
        value = _AWS_SECRET.sub(REDACTED, value)
    value = _AUTH_SCHEME.sub(lambda m: m["head"] + REDACTED, value)
    return _redact_pairs(value)


def _redact_url(m: re.Match[str]) -> str:
    rest = m["rest"]
    at = rest.rfind("@")
    user, colon, _ = rest[: max(at, 0)].partition(":")
    if at < 0 or any(c in user for c in "/?#"):
        return m[0]  # no userinfo; an "@" in the path or query
    if _LOGIN_NAME.fullmatch(user):
        return m[0] if not colon else f"{m['scheme']}{user}:{REDACTED}{rest[at:]}"
    return m["scheme"] + REDACTED + rest[at:]  # a token used as the user name


def _redact_pairs(text: str) -> str:
    out, pos = [], 0
    for m in _PAIR.finditer(text):
        if m.start() < pos or not is_secret_name(m["key"]):
            continue
        start, end = _value_span(text, m.end(), m["key"])
        if start == end or _shows(m["key"], text[start:end]):
            continue
        out += [text[pos:start], REDACTED]
        pos = end
    return "".join(out) + text[pos:]


def _value_span(text: str, i: int, key: str) -> tuple[int, int]:
    """Where the value of a secret key, starting at ``i``, lies in ``text``."""
    if i >= len(text):
        return i, i
    if text[i] in "\"'":
        j = i + 1
        while j < len(text) and text[j] != text[i]:
            j += 2 if text[j] == "\\" else 1
        return i + 1, min(j, len(text))
    if text[i] in "{[(":
        depth = 0
        for j in range(i, len(text)):
            depth += (text[j] in "{[(") - (text[j] in "}])")
            if depth == 0:
                return i, j + 1
        return i, len(text)
    words = _words(key)
    pattern = _HEADER_LINE if words and words[-1] in _LINE_HEADERS else _BARE
    match = pattern.match(text, i)
    return i, match.end() if match else i


# ------------------------------------------------------------------ environment


def redact_env(items: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Redact environment ``(name, value)`` pairs, keeping their order."""
    return tuple((name, _redact_env_value(name, value)) for name, value in items)


def _redact_env_value(name: str, value: str) -> str:
    if not value:
        return value
    if is_secret_name(name) and not _shows(name, value):
        return REDACTED
    if (
        name in _DIAGNOSTIC_VARS
        or name.startswith(_DIAGNOSTIC_PREFIXES)
        or (_PLAIN_VALUE.fullmatch(value) and not _OPAQUE.search(value))
    ):
        return redact_value(value)
    return REDACTED


# ------------------------------------------------------------------ command lines


def redact_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """Redact a command line: secret options' values, and secrets inside every argument."""
    aws = any(_AWS_KEY_ID.search(arg) for arg in argv)
    return tuple(_redact_args(argv, aws))


def _secret_option(arg: str) -> tuple[str, str | None, int] | None:
    """(name, value or None, where the value starts) when ``arg`` is a secret option."""
    m = _OPTION.fullmatch(arg)
    name = m["name"] if m else ""
    if arg.startswith("-p") and not arg.startswith("--") and name not in ("p", *_P_OPTIONS):
        return "p", arg[2:], 2  # -pVALUE, as mysql takes it
    if m and _is_secret_option(name):
        return name, m["value"], m.start("value")
    return None


def _redact_args(args: Sequence[str], aws: bool) -> list[str]:
    out: list[str] = []
    pending: str | None = None  # a secret option whose value is the next argument
    for arg in args:
        # The value of a secret option may start with "-"; only "--..." is the next option.
        if pending is not None and arg and not arg.startswith("--"):
            out.append(arg if _shows(pending, arg) else REDACTED)
            pending = None
            continue
        pending = None
        option = _secret_option(arg)
        if option is not None:
            name, value, at = option
            if value is None:
                pending = name
            elif value and not _shows(name, value):
                arg = arg[:at] + REDACTED
            out.append(arg)
            continue
        arg = _redact_text(arg, aws)
        if any(c.isspace() for c in arg):  # bash -c "sshpass -p X ...": a command line in one
            parts = re.split(r"(\s+)", arg)
            parts[::2] = _redact_args(parts[::2], aws)
            arg = "".join(parts)
        out.append(arg)
    return out
