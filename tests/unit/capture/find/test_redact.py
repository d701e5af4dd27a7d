"""Redaction: secrets stay on the node in every form people pass them (secret-named
variables and options, abbreviations, hydra overrides, URL credentials, headers, JSON and
dicts, key=value lists, token formats), while what diagnosis reads is kept: the allow-listed
variables, plain values, the script and its ordinary options."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hangdoc.capture.find.rankenv import select_env
from hangdoc.capture.find.redact import (
    _DIAGNOSTIC_VARS,
    REDACTED,
    is_secret_name,
    redact_argv,
    redact_env,
    redact_value,
)

V = "Zk3qP9xV7mL2nB8cR4tY6wE1"  # a realistic password / opaque token
GH = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
GH_PAT = "github_pat_" + "11ABCDEFG0abcdefghijkl_mnopqrstuvwxyz0123456789ABCDEFGHIJ"
HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123"
OPENAI = "sk-" + "proj-abcdefghijklmnopqrstuvwxyz0123"
ANTHROPIC = "sk-ant-" + "api03-AbCdEfGhIjKlMnOpQrStUvWxYz-0123456789"
AWS = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_STS = "ASIA" + "Y34FZKBOKMUTVV7A"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"
SLACK = "xoxb-" + "123456789012-abcdefABCDEF"
SLACK_USER = "xoxp-" + "123456789012-123456789012-abcdef0123456789"
GITLAB = "glpat-" + "xY9zAbCdEfGhIjKlMnOp"
JWT = (
    "eyJ" + "hbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
)
PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n-----END OPENSSH PRIVATE KEY-----"
)
UUID = "3f1c9a7e-5b2d-4c8f-9e6a-1d2b3c4d5e6f"

# ------------------------------------------------------------------ environment

ENV_CASES = [
    # (name, value, expected value)
    # secret names: hidden whole, whatever the value
    ("HF_TOKEN", "anything", REDACTED),
    ("HUGGING_FACE_HUB_TOKEN", "x", REDACTED),
    ("WANDB_API_KEY", "0123456789abcdef", REDACTED),
    ("AWS_SECRET_ACCESS_KEY", "abc/def", REDACTED),
    ("DB_PASSWORD", "hunter2", REDACTED),
    ("MYSQL_PASSWD", "hunter2", REDACTED),
    ("REDIS_PASS", "hunter2", REDACTED),
    ("RAY_REDIS_PW", "hunter2", REDACTED),
    ("GOOGLE_APPLICATION_CREDENTIALS", "/etc/creds.json", REDACTED),
    ("HTTP_AUTHORIZATION", "Bearer abc", REDACTED),
    ("SSH_PRIVATE_KEY", "-----BEGIN", REDACTED),
    ("SENTRY_DSN", "https://abc@o1.ingest.sentry.io/1", REDACTED),
    ("NCCL_IB_AUTH_KEY", "k", REDACTED),  # a secret name wins over the allow-list
    ("my.secret.value", "abc", REDACTED),
    ("EMPTY_TOKEN", "", ""),  # nothing to hide
    ("HF_TOKEN_PATH", "/home/me/.cache/hf/token", "/home/me/.cache/hf/token"),  # where, not what
    ("HF_TOKEN_PATH", "token.txt", REDACTED),  # only /, ./, ../, ~/ paths are evidently paths
    # the diagnostic allow-list: values kept as they are
    ("MASTER_ADDR", "10.0.0.1", "10.0.0.1"),
    ("MASTER_PORT", "29500", "29500"),
    ("RANK", "3", "3"),
    ("WORLD_SIZE", "16", "16"),
    ("LOCAL_WORLD_SIZE", "8", "8"),
    ("NCCL_SOCKET_IFNAME", "eth0", "eth0"),
    ("NCCL_SOCKET_IFNAME", "^lo,docker0", "^lo,docker0"),
    ("NCCL_DEBUG", "INFO", "INFO"),
    ("NCCL_IB_HCA", "mlx5_0:1,mlx5_1:1", "mlx5_0:1,mlx5_1:1"),
    ("NCCL_DEBUG_FILE", "/tmp/nccl.%h.%p.log", "/tmp/nccl.%h.%p.log"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", "1"),
    ("TORCH_DISTRIBUTED_DEBUG", "DETAIL", "DETAIL"),
    ("CUDA_VISIBLE_DEVICES", "0,1", "0,1"),
    ("SLURM_JOB_ID", "123", "123"),
    ("SLURM_STEP_ID", "0", "0"),
    ("SLURM_JOB_NODELIST", "gpu-[001-004,017]", "gpu-[001-004,017]"),
    ("TORCHELASTIC_RUN_ID", UUID, UUID),
    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", "expandable_segments:True"),
    ("LD_LIBRARY_PATH", "/usr/local/cuda/lib64:/opt/x", "/usr/local/cuda/lib64:/opt/x"),
    # other variables discover selects: plain shapes are kept ...
    ("TOKENIZERS_PARALLELISM", "false", "false"),
    ("PYTHONUNBUFFERED", "1", "1"),
    ("PYTHONSTARTUP", "/home/me/.pythonrc.py", "/home/me/.pythonrc.py"),
    ("SLURM_JOB_NAME", "pretrain-llama-70b-v2", "pretrain-llama-70b-v2"),
    ("SLURM_SUBMIT_DIR", "/home/me/train", "/home/me/train"),
    ("OMP_PROC_BIND", "close", "close"),
    ("NVIDIA_VISIBLE_DEVICES", "GPU-" + UUID, "GPU-" + UUID),
    ("RAY_ADDRESS", "10.0.0.1:6379", "10.0.0.1:6379"),
    ("RAY_ADDRESS", "auto", "auto"),
    ("RAY_ADDRESS", "ray://head-node:10001", "ray://head-node:10001"),
    ("TORCH_HOME_URL", "https://github.com/pytorch/pytorch", "https://github.com/pytorch/pytorch"),
    ("PWD", "/home/me/train", "/home/me/train"),
    # ... anything else is hidden whole
    ("SLURM_JOB_COMMENT", f"token={V}", REDACTED),
    ("SLURM_JOB_COMMENT", "wandb run 7", REDACTED),
    ("TORCH_SOMETHING", f"https://u:{V}@h", REDACTED),
    ("RAY_ADDRESS", f"ray://admin:{V}@head:10001", REDACTED),
    ("RAY_ADDRESS", f"https://head:8265/?token={V}", REDACTED),
    ("PYTHONSTARTUP_ARGS", V, REDACTED),  # a long opaque run
    ("TORCH_RUN_HASH", "9fceb02d0ae598e95dc970b74767f19372d61af8", REDACTED),
    ("SLURM_WEBHOOK", "https://hooks.slack.com/services/T0/B0/" + V, REDACTED),
    ("DEEPSPEED_EXTRA", f"--push {GH}", REDACTED),
    ("PYTHONWARNINGS", "a=b", REDACTED),
    ("OMPI_MCA_x", "admin:hunter2", REDACTED),
    # allow-listed values are still scanned
    ("NCCL_NET_PLUGIN_ARGS", f"x token={V}", f"x token={REDACTED}"),
    ("MASTER_ADDR", f"https://u:{V}@h", f"https://u:{REDACTED}@h"),
    ("NCCL_X", HF, REDACTED),
]


@pytest.mark.parametrize(("name", "value", "expected"), ENV_CASES, ids=[f"{c[0]}={c[1][:20]}" for c in ENV_CASES])
def test_redact_env(name: str, value: str, expected: str) -> None:
    assert redact_env([(name, value)]) == ((name, expected),)


def test_redact_env_keeps_order_and_names() -> None:
    items = [("Z_TOKEN", "a"), ("RANK", "1"), ("M_KEY", "c")]
    assert redact_env(items) == (("Z_TOKEN", REDACTED), ("RANK", "1"), ("M_KEY", REDACTED))


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("GITHUB_TOKEN", True),
        ("api-key", True),
        ("ApiKey", True),
        ("HFTOKEN", True),
        ("wandb.api_key", True),
        ("X-Api-Key", True),
        ("Authorization", True),
        ("db_pw", True),
        ("KEYBOARD", False),
        ("TOKENIZERS_PARALLELISM", False),
        ("PASSTHROUGH", False),
        ("AUTHOR", False),
        ("RANK", False),
        ("OLDPWD", False),
        ("PWD", False),
        ("port", False),
    ],
)
def test_is_secret_name(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


# ------------------------------------------------------------------ values

VALUE_CASES = [
    # (value, expected)
    # URL credentials: the password runs to the URL's last "@"
    ("postgres://alice:s3cr3t@db:5432/x", f"postgres://alice:{REDACTED}@db:5432/x"),
    ("https://user:p@ss/w0rd@host/x", f"https://user:{REDACTED}@host/x"),
    ("postgres://u:a/b@db:5432/x", f"postgres://u:{REDACTED}@db:5432/x"),
    ("http://a:b@h1/,http://c:d@h2/", f"http://a:{REDACTED}@h1/,http://c:{REDACTED}@h2/"),
    # a URL user without password: a short plain login name stays, anything else is a token
    ("https://git@github.com/o/r.git", "https://git@github.com/o/r.git"),
    ("ssh://ubuntu@10.0.0.2/x", "ssh://ubuntu@10.0.0.2/x"),
    (f"https://{GH}@github.com/o/r", f"https://{REDACTED}@github.com/o/r"),
    ("https://SOMEOPAQUETOKEN@host/path", f"https://{REDACTED}@host/path"),
    (f"https://{V}:x-oauth-basic@github.com/o", f"https://{REDACTED}@github.com/o"),
    ("git@github.com:o/r.git", "git@github.com:o/r.git"),  # scp-like, no scheme
    # URLs without credentials
    ("http://proxy.corp:3128", "http://proxy.corp:3128"),
    ("https://registry.npmjs.org/@scope/pkg", "https://registry.npmjs.org/@scope/pkg"),
    ("https://h/x?email=a@b.c", "https://h/x?email=a@b.c"),
    (f"https://h/x?token={V}&page=2", f"https://h/x?token={REDACTED}&page=2"),
    # token formats anywhere
    (f"--push {GH}", f"--push {REDACTED}"),
    (f"push to {GH_PAT} now", f"push to {REDACTED} now"),
    (f"model=gpt;k={OPENAI}", f"model=gpt;k={REDACTED}"),
    (f"x {ANTHROPIC} y", f"x {REDACTED} y"),
    (f"{HF},{GITLAB}", f"{REDACTED},{REDACTED}"),
    (f"{SLACK} {SLACK_USER}", f"{REDACTED} {REDACTED}"),
    (f"{AWS_STS}", REDACTED),
    (f"id {AWS} key {AWS_SECRET}", f"id {REDACTED} key {REDACTED}"),
    (f"jwt {JWT}", f"jwt {REDACTED}"),
    (f"key:\n{PEM}\nend", f"key:\n{REDACTED}\nend"),
    ("sk-1 hf_x ghp_y", "sk-1 hf_x ghp_y"),  # too short to be tokens
    ("9fceb02d0ae598e95dc970b74767f19372d61af8", "9fceb02d0ae598e95dc970b74767f19372d61af8"),
    (AWS_SECRET, AWS_SECRET),  # 40 characters mean nothing without a key id next to them
    # secret keys in pairs, JSON, dicts, headers
    (f"token={V},lr=3", f"token={REDACTED},lr=3"),
    (f"token={V},{V}; lr=3", f"token={REDACTED}; lr=3"),
    (json.dumps({"api_key": V, "lr": 0.1}), f'{{"api_key": "{REDACTED}", "lr": 0.1}}'),
    (repr({"password": V, "epochs": 3}), f"{{'password': '{REDACTED}', 'epochs': 3}}"),
    (json.dumps({"credentials": {"user": "u", "pw": V}, "lr": 1}), f'{{"credentials": {REDACTED}, "lr": 1}}'),
    (json.dumps({"tokens": [V, V]}), f'{{"tokens": {REDACTED}}}'),
    ("os.environ['HF_TOKEN'] = 'abc'", f"os.environ['HF_TOKEN'] = '{REDACTED}'"),
    (f"Authorization: Bearer {V}", f"Authorization: {REDACTED}"),
    (f"Proxy-Authorization: Basic {V}", f"Proxy-Authorization: {REDACTED}"),
    (f"curl -H 'Authorization: Basic {V}' https://h", f"curl -H 'Authorization: {REDACTED}' https://h"),
    (f"Cookie: a=1; session={V}", f"Cookie: {REDACTED}"),
    (f"X-Api-Key: {V}", f"X-Api-Key: {REDACTED}"),
    (f"send Bearer {V}", f"send Bearer {REDACTED}"),
    ("Content-Type: application/json", "Content-Type: application/json"),
    ("lr=3e-4,warmup=100", "lr=3e-4,warmup=100"),
    ("host:29400", "host:29400"),
    ("tokenizer=bert-base", "tokenizer=bert-base"),
]


@pytest.mark.parametrize(("value", "expected"), VALUE_CASES, ids=range(len(VALUE_CASES)))
def test_redact_value(value: str, expected: str) -> None:
    assert redact_value(value) == expected


# ------------------------------------------------------------------ command lines

ARGV_CASES = [
    # (argv, expected)
    (
        ["python", "train.py", "--hf-token", "abc", "--lr", "3e-4"],
        ("python", "train.py", "--hf-token", REDACTED, "--lr", "3e-4"),
    ),
    (
        ["python", "train.py", "--api_key=abc", "--epochs=3"],
        ("python", "train.py", f"--api_key={REDACTED}", "--epochs=3"),
    ),
    (
        ["python", "-m", "x", "--password", "--verbose"],  # flag without value: nothing hidden
        ("python", "-m", "x", "--password", "--verbose"),
    ),
    (["x.py", "--password", f"-Xy7{V}"], ("x.py", "--password", REDACTED)),  # value starts with -
    (["x.py", "--db", f"mysql://u:{V}@h/db"], ("x.py", "--db", f"mysql://u:{REDACTED}@h/db")),
    (["python", "x.py", GH], ("python", "x.py", REDACTED)),
    # hydra overrides
    (
        [
            "train.py",
            f"wandb.api_key={V}",
            f"+db.password={V}",
            f"++trainer.secret={V}",
            f"model.hf_token={V}",
            "trainer.max_epochs=3",
            "+model.tokenizer=gpt2",
        ],
        (
            "train.py",
            f"wandb.api_key={REDACTED}",
            f"+db.password={REDACTED}",
            f"++trainer.secret={REDACTED}",
            f"model.hf_token={REDACTED}",
            "trainer.max_epochs=3",
            "+model.tokenizer=gpt2",
        ),
    ),
    # headers
    (
        ["x.py", "--header", f"Authorization: Bearer {V}", "-H", f"X-Api-Key: {V}", "-H", "Accept: application/json"],
        (
            "x.py",
            "--header",
            f"Authorization: {REDACTED}",
            "-H",
            f"X-Api-Key: {REDACTED}",
            "-H",
            "Accept: application/json",
        ),
    ),
    ([f"--header=Authorization: Basic {V}"], (f"--header=Authorization: {REDACTED}",)),
    # short, abbreviated and password-ish options
    (["mysql", "-u", "root", "-p", V], ("mysql", "-u", "root", "-p", REDACTED)),
    (["mysql", f"-p{V}", "db"], ("mysql", f"-p{REDACTED}", "db")),
    (["sshpass", f"-p={V}"], ("sshpass", f"-p={REDACTED}")),
    (
        ["x.py", "-p", "29500", "-p8080", "-p", "/data/run1"],  # ports and paths stay
        ("x.py", "-p", "29500", "-p8080", "-p", "/data/run1"),
    ),
    (
        ["x.py", f"--api-k={V}", f"--pw={V}", "--pwd", V, "--passwd", V, f"--token={V}", "--toke", V, "--secr", V],
        (
            "x.py",
            f"--api-k={REDACTED}",
            f"--pw={REDACTED}",
            "--pwd",
            REDACTED,
            "--passwd",
            REDACTED,
            f"--token={REDACTED}",
            "--toke",
            REDACTED,
            "--secr",
            REDACTED,
        ),
    ),
    (["x.py", "-password", V, "-passwd=" + V], ("x.py", "-password", REDACTED, f"-passwd={REDACTED}")),
    (
        [
            "x.py",
            "--pwd",
            "/home/me/run",
            "--key-file",
            "/etc/ssl/key.pem",
            "--token-path",
            "~/.cache/hf/token",
            "--password-file",
            "./pw.txt",
        ],
        (
            "x.py",
            "--pwd",
            "/home/me/run",
            "--key-file",
            "/etc/ssl/key.pem",
            "--token-path",
            "~/.cache/hf/token",
            "--password-file",
            "./pw.txt",
        ),
    ),
    (
        ["x.py", "--key-file", V, "--key-file=key.pem"],  # not evidently a path
        ("x.py", "--key-file", REDACTED, f"--key-file={REDACTED}"),
    ),
    # JSON, dicts and key=value lists in one argument
    (
        ["x.py", "--cfg", json.dumps({"api_key": V, "lr": 0.1})],
        ("x.py", "--cfg", f'{{"api_key": "{REDACTED}", "lr": 0.1}}'),
    ),
    (["x.py", repr({"password": V})], ("x.py", f"{{'password': '{REDACTED}'}}")),
    (["x.py", "--extra", f"token={V},lr=3"], ("x.py", "--extra", f"token={REDACTED},lr=3")),
    # a command line inside one argument
    (
        ["bash", "-c", f"sshpass -p {V} ssh h && python x.py --hf-token {V} --lr 3"],
        ("bash", "-c", f"sshpass -p {REDACTED} ssh h && python x.py --hf-token {REDACTED} --lr 3"),
    ),
    # an AWS secret access key in an argument next to the one with its key id
    (["aws-login", AWS, AWS_SECRET], ("aws-login", REDACTED, REDACTED)),
    # what diagnosis needs stays
    (
        [
            "python",
            "train.py",
            "--lr",
            "3e-4",
            "--batch-size",
            "32",
            "--master-port",
            "29500",
            "--config",
            "conf/x.yaml",
            "--port",
            "29500",
            "--top-k",
            "50",
            "--timeout-sec",
            "600",
            "--tokenizer",
            "gpt2",
            "--num-passes",
            "2",
        ],
        (
            "python",
            "train.py",
            "--lr",
            "3e-4",
            "--batch-size",
            "32",
            "--master-port",
            "29500",
            "--config",
            "conf/x.yaml",
            "--port",
            "29500",
            "--top-k",
            "50",
            "--timeout-sec",
            "600",
            "--tokenizer",
            "gpt2",
            "--num-passes",
            "2",
        ),
    ),
    (
        [
            "torchrun",
            "--nproc-per-node",
            "8",
            "--nnodes=2",
            "--rdzv-endpoint",
            "host:29400",
            "--rdzv-id",
            UUID,
            "--rdzv-backend=c10d",
            "train.py",
            "--rank",
            "3",
        ],
        (
            "torchrun",
            "--nproc-per-node",
            "8",
            "--nnodes=2",
            "--rdzv-endpoint",
            "host:29400",
            "--rdzv-id",
            UUID,
            "--rdzv-backend=c10d",
            "train.py",
            "--rank",
            "3",
        ),
    ),
    (
        ["python", "-u", "-X", "faulthandler", "-W", "ignore", "/opt/app/train.py", "--seed", "1"],
        ("python", "-u", "-X", "faulthandler", "-W", "ignore", "/opt/app/train.py", "--seed", "1"),
    ),
]


@pytest.mark.parametrize(("argv", "expected"), ARGV_CASES, ids=range(len(ARGV_CASES)))
def test_redact_argv(argv: list[str], expected: tuple[str, ...]) -> None:
    assert redact_argv(argv) == expected
    assert redact_argv(expected) == expected  # redacting twice changes nothing


# ------------------------------------------------------------------ properties

ARGV_SHAPES = [
    lambda s: ["train.py", f"wandb.api_key={s}"],
    lambda s: ["train.py", f"+db.password={s}"],
    lambda s: ["train.py", f"++trainer.secret={s}"],
    lambda s: ["train.py", f"model.hf_token={s}"],
    lambda s: ["x.py", "--db", f"https://user:p@ss/{s}@host/x"],
    lambda s: ["x.py", "--db", f"postgres://u:a/{s}@db:5432/x"],
    lambda s: ["git", "clone", f"https://{s}@host/path"],
    lambda s: ["git", "clone", f"https://x-access-token:{s}@github.com/o/r"],
    lambda s: ["curl", "--header", f"Authorization: Bearer {s}", "https://h"],
    lambda s: ["curl", "-H", f"X-Api-Key: {s}"],
    lambda s: ["curl", f"-HAuthorization: Basic {s}"],
    lambda s: ["sshpass", "-p", s, "ssh", "h"],
    lambda s: ["mysql", f"-p{s}"],
    lambda s: ["x.py", f"--api-k={s}"],
    lambda s: ["x.py", f"--pw={s}"],
    lambda s: ["x.py", "--pwd", s],
    lambda s: ["x.py", "--passwd", s],
    lambda s: ["x.py", f"--token={s}"],
    lambda s: ["x.py", "--key-file", s],
    lambda s: ["x.py", "--password", f"-{s}"],
    lambda s: ["x.py", "--cfg", json.dumps({"api_key": s, "lr": 0.1})],
    lambda s: ["x.py", repr({"password": s})],
    lambda s: ["x.py", "--extra", f"token={s},lr=3"],
    lambda s: ["bash", "-c", f"python x.py --hf-token {s} --lr 3"],
]
ENV_SHAPES = [
    lambda s: ("SLURM_JOB_COMMENT", f"token={s}"),
    lambda s: ("TORCH_SOMETHING", f"https://u:{s}@h"),
    lambda s: ("RAY_ADDRESS", f"ray://{s}@head:10001"),
    lambda s: ("PYTHONSTARTUP", s),
    lambda s: ("NCCL_PLUGIN_OPTS", f"password={s}"),
    lambda s: ("MASTER_ADDR", f"https://u:{s}@h"),
]
secrets = st.text(string.ascii_letters + string.digits, min_size=20, max_size=40)


@pytest.mark.parametrize("shape", ARGV_SHAPES, ids=range(len(ARGV_SHAPES)))
@settings(max_examples=40, deadline=None)
@given(secret=secrets)
def test_secret_never_leaves_argv(shape, secret: str) -> None:
    argv = shape(secret)
    out = redact_argv(argv)
    assert secret not in " ".join(out)
    assert out[0] == argv[0]  # the program stays


@pytest.mark.parametrize("shape", ENV_SHAPES, ids=range(len(ENV_SHAPES)))
@settings(max_examples=40, deadline=None)
@given(secret=secrets)
def test_secret_never_leaves_env(shape, secret: str) -> None:
    name, value = shape(secret)
    ((out_name, out_value),) = redact_env([(name, value)])
    assert out_name == name and secret not in out_value


def test_every_allow_listed_variable_is_one_a_rank_keeps() -> None:
    # two lists on purpose: rankenv chooses the variables a rank keeps, redact those of them
    # whose values are shown as they are; an allow-listed name never kept would be dead
    kept = {name for name, _ in select_env(dict.fromkeys(_DIAGNOSTIC_VARS, "1"))}
    assert kept == set(_DIAGNOSTIC_VARS)
