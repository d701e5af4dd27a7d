"""Redaction: secret-named variables, URL passwords and known token formats are hidden;
innocent values (even long random-looking ones) are kept."""

from __future__ import annotations

import pytest

from hangdoc.redact import REDACTED, is_secret_name, redact_argv, redact_env

GH = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123"
OPENAI = "sk-" + "proj-abcdefghijklmnopqrstuvwxyz0123"
AWS = "AKIA" + "IOSFODNN7EXAMPLE"
SLACK = "xoxb-" + "123456789012-abcdefABCDEF"

ENV_CASES = [
    # (name, value, expected value)
    ("HF_TOKEN", "anything", REDACTED),
    ("HUGGING_FACE_HUB_TOKEN", "x", REDACTED),
    ("WANDB_API_KEY", "0123456789abcdef", REDACTED),
    ("AWS_SECRET_ACCESS_KEY", "abc/def", REDACTED),
    ("AWS_SESSION_TOKEN", "abc", REDACTED),
    ("DB_PASSWORD", "hunter2", REDACTED),
    ("MYSQL_PASSWD", "hunter2", REDACTED),
    ("REDIS_PASS", "hunter2", REDACTED),
    ("GOOGLE_APPLICATION_CREDENTIALS", "/etc/creds.json", REDACTED),
    ("HTTP_AUTHORIZATION", "Bearer abc", REDACTED),
    ("SESSION_COOKIE", "abc", REDACTED),
    ("SSH_PRIVATE_KEY", "-----BEGIN", REDACTED),
    ("REQUEST_SIGNATURE", "abc", REDACTED),
    ("SENTRY_DSN", "https://abc@o1.ingest.sentry.io/1", REDACTED),
    ("OPENAI_APIKEY", "abc", REDACTED),
    ("my.secret.value", "abc", REDACTED),
    ("EMPTY_TOKEN", "", ""),  # nothing to hide
    # innocent names keep their values, even long random-looking ones
    ("MASTER_ADDR", "10.0.0.1", "10.0.0.1"),
    ("TORCHELASTIC_RUN_ID", "3f1c9a7e-5b2d-4c8f-9e6a-1d2b3c4d5e6f",
     "3f1c9a7e-5b2d-4c8f-9e6a-1d2b3c4d5e6f"),
    ("NCCL_DEBUG", "INFO", "INFO"),
    ("TOKENIZERS_PARALLELISM", "false", "false"),
    ("PWD", "/home/me/train", "/home/me/train"),
    ("CUDA_VISIBLE_DEVICES", "0,1,2,3", "0,1,2,3"),
    ("GIT_COMMIT", "9fceb02d0ae598e95dc970b74767f19372d61af8",
     "9fceb02d0ae598e95dc970b74767f19372d61af8"),
    ("RUN_HASH", "Zk3qP9xV7mL2nB8cR4tY6wE1aS5dF0gH", "Zk3qP9xV7mL2nB8cR4tY6wE1aS5dF0gH"),
    # URL passwords, anywhere in a value
    ("DATABASE_URL", "postgres://alice:s3cr3t@db:5432/x", f"postgres://alice:{REDACTED}@db:5432/x"),
    ("PIP_INDEX_URL", "https://user:pa55@pypi.corp/simple",
     f"https://user:{REDACTED}@pypi.corp/simple"),
    ("MIRRORS", "http://a:b@h1/,http://c:d@h2/",
     f"http://a:{REDACTED}@h1/,http://c:{REDACTED}@h2/"),
    ("HTTP_PROXY", "http://proxy.corp:3128", "http://proxy.corp:3128"),  # port, not password
    ("REPO_URL", "https://github.com/pytorch/pytorch", "https://github.com/pytorch/pytorch"),
    # known token formats in innocent names
    ("EXTRA_ARGS", f"--push {GH}", f"--push {REDACTED}"),
    ("HF_HOME_NOTE", HF, REDACTED),
    ("CLIENT_CONFIG", f"model=gpt;k={OPENAI}", f"model=gpt;k={REDACTED}"),
    ("AWS_ID", AWS, REDACTED),
    ("NOTIFY", SLACK, REDACTED),
    ("SHORT_PREFIXES", "sk-1 hf_x ghp_y", "sk-1 hf_x ghp_y"),  # too short to be tokens
]


@pytest.mark.parametrize(("name", "value", "expected"), ENV_CASES,
                         ids=[c[0] for c in ENV_CASES])
def test_redact_env(name: str, value: str, expected: str) -> None:
    assert redact_env([(name, value)]) == ((name, expected),)


def test_redact_env_keeps_order_and_names() -> None:
    items = [("Z_TOKEN", "a"), ("A", "b"), ("M_KEY", "c")]
    assert redact_env(items) == (("Z_TOKEN", REDACTED), ("A", "b"), ("M_KEY", REDACTED))


@pytest.mark.parametrize(("name", "secret"), [
    ("GITHUB_TOKEN", True), ("api-key", True), ("ApiKey", True), ("HFTOKEN", True),
    ("KEYBOARD", False), ("TOKENIZERS_PARALLELISM", False), ("PASSTHROUGH", False),
    ("AUTHOR", False), ("RANK", False), ("OLDPWD", False),
])
def test_is_secret_name(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


ARGV_CASES = [
    (["python", "train.py", "--hf-token", "abc", "--lr", "3e-4"],
     ("python", "train.py", "--hf-token", REDACTED, "--lr", "3e-4")),
    (["python", "train.py", "--api_key=abc", "--epochs=3"],
     ("python", "train.py", f"--api_key={REDACTED}", "--epochs=3")),
    (["python", "-m", "x", "--password", "--verbose"],  # flag without value: nothing hidden
     ("python", "-m", "x", "--password", "--verbose")),
    (["python", "x.py", "--db", "mysql://u:pw@h/db"],
     ("python", "x.py", "--db", f"mysql://u:{REDACTED}@h/db")),
    (["python", "x.py", GH], ("python", "x.py", REDACTED)),
    (["torchrun", "--nproc-per-node", "8", "train.py", "--rank", "3"],
     ("torchrun", "--nproc-per-node", "8", "train.py", "--rank", "3")),
]


@pytest.mark.parametrize(("argv", "expected"), ARGV_CASES, ids=range(len(ARGV_CASES)))
def test_redact_argv(argv: list[str], expected: tuple[str, ...]) -> None:
    assert redact_argv(argv) == expected
