"""Keep secrets out of snapshots: environment values and command lines are redacted here.

A snapshot is meant to be pasted into issues and chat, so anything that looks like a
credential is replaced by ``<redacted>`` before it enters the data model:

- the value of a variable whose *name* looks secret (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``,
  ``DB_PASSWORD``, ``SENTRY_DSN``, ...);
- the password of a URL with ``user:password@`` in it, wherever it appears;
- well-known token formats (GitHub ``ghp_``, Hugging Face ``hf_``, OpenAI ``sk-``, Slack
  ``xox?-``, AWS ``AKIA``...) wherever they appear.

Other long random-looking values (run ids, hashes) are kept: they help debugging and
guessing secrets by entropy redacts too much.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

REDACTED = "<redacted>"

# A name is secret when one of its words (split at "_", "-", ".") is one of these, or ends
# with one of them (APIKEY, HFTOKEN). Whole words keep TOKENIZERS_PARALLELISM and PWD innocent.
_SECRET_WORDS = (
    "TOKEN", "TOKENS", "KEY", "KEYS", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD",
    "PASS", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "CREDS", "AUTH", "AUTHORIZATION",
    "COOKIE", "COOKIES", "SESSION", "PRIVATE", "SIGNATURE", "DSN", "JWT", "BEARER", "SALT",
    "HMAC", "APIKEY", "CONNSTR",
)
_SECRET_SUFFIXES = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIALS", "COOKIE")
_WORD_SPLIT = re.compile(r"[_.\-]+")

# scheme://user:password@host -> keep the user, hide the password.
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:)[^@/\s]+(?=@)")

# Known token formats; each needs enough characters after the prefix to be a real token.
_TOKEN_FORMATS = (
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",  # GitHub
    r"\bgithub_pat_[A-Za-z0-9_]{20,}",
    r"\bglpat-[A-Za-z0-9_\-]{20,}",  # GitLab
    r"\bhf_[A-Za-z0-9]{20,}",  # Hugging Face
    r"\bsk-[A-Za-z0-9_\-]{20,}",  # OpenAI, Anthropic
    r"\b[sr]k_(?:live|test)_[A-Za-z0-9]{16,}",  # Stripe
    r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",  # Slack
    r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b",  # AWS access key ids
    r"\bAIza[A-Za-z0-9_\-]{35}",  # Google API keys
    r"\bya29\.[A-Za-z0-9_\-]{20,}",  # Google OAuth tokens
    r"\beyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]+",  # JWT
    r"\bwandb_v1_[A-Za-z0-9_]{20,}",
)
_TOKEN_PATTERNS = re.compile("|".join(_TOKEN_FORMATS))

# Command-line options whose value is secret: --hf-token X, --api_key=X, --password X.
_SECRET_OPTION = re.compile(r"^--?(?P<name>[A-Za-z0-9_.\-]+)(?:=(?P<value>.*))?$", re.DOTALL)


def is_secret_name(name: str) -> bool:
    """True when a variable or option name says its value is a credential."""
    words = [w for w in _WORD_SPLIT.split(name.upper()) if w]
    return any(w in _SECRET_WORDS or w.endswith(_SECRET_SUFFIXES) for w in words)


def redact_value(value: str) -> str:
    """Hide URL passwords and known token formats inside an otherwise innocent value."""
    value = _URL_PASSWORD.sub(lambda m: m["head"] + REDACTED, value)
    return _TOKEN_PATTERNS.sub(REDACTED, value)


def redact_env(items: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Redact environment ``(name, value)`` pairs, keeping their order."""
    return tuple(
        (name, REDACTED if value and is_secret_name(name) else redact_value(value))
        for name, value in items
    )


def redact_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """Redact a command line: values of secret-named options, URL passwords, known tokens."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        match = _SECRET_OPTION.match(arg)
        if match and is_secret_name(match["name"]):
            if match["value"] is None:
                hide_next = True
                out.append(arg)
            else:
                out.append(arg[: len(arg) - len(match["value"])] + REDACTED)
            continue
        out.append(redact_value(arg))
    return tuple(out)
