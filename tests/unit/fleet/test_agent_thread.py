"""The agent served from a background thread (``serve_in_thread``, what a Ray actor runs):
same API, same token check, same listen policy as ``hangdoc agent``; and the Ray module
imports without Ray."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from hangdoc.errors import UsageError
from hangdoc.fleet.agent import AgentConfig, serve_in_thread
from hangdoc.fleet.client import AgentAuth, AgentError, RemoteNode

TOKEN = "0123456789abcdef0123456789abcdef"

pytestmark = [pytest.mark.timeout(60)]


def test_a_thread_agent_answers_with_the_token_and_refuses_without() -> None:
    agent = serve_in_thread(AgentConfig(listen="127.0.0.1:0", token=TOKEN))
    try:
        assert agent.port > 0
        good = RemoteNode(f"127.0.0.1:{agent.port}", AgentAuth(token=TOKEN))
        assert good.info().hangdoc_version
        for auth in (AgentAuth(token="wrong-token-wrong-token"), AgentAuth()):
            bad = RemoteNode(f"127.0.0.1:{agent.port}", auth)
            with pytest.raises(AgentError, match="refused"):
                bad.info()
            bad.close()
        good.close()
    finally:
        agent.stop()
    # the server is gone: nothing listens on its port (binding the port again instead races
    # any other process on the machine that is handed the freed port meanwhile)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", agent.port), timeout=5).close()


def test_a_thread_agent_keeps_the_listen_policy() -> None:
    with pytest.raises(UsageError, match="without authentication"):
        serve_in_thread(AgentConfig(listen="0.0.0.0:0"))


def test_a_taken_port_is_an_error_not_a_hang() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(UsageError, match="cannot listen"):
            serve_in_thread(AgentConfig(listen=f"127.0.0.1:{port}", token=TOKEN), timeout=20)


def test_the_ray_module_imports_without_ray() -> None:
    code = (
        "import sys, hangdoc.fleet.ray_agents as r; "
        "assert 'ray' not in sys.modules, 'ray imported'; assert r.HangdocAgent.__name__ == 'HangdocAgent'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


def test_ray_agents_never_start_ray_themselves() -> None:
    pytest.importorskip("ray.util")  # not tests/live/ray, a namespace package without Ray
    code = (
        "import ray; from hangdoc.errors import UsageError\n"
        "from hangdoc.fleet.ray_agents import ray_agents, stop_ray_agents\n"
        "for call in (lambda: ray_agents(['ab' * 28], token='t' * 32).__enter__(), stop_ray_agents):\n"
        "    try:\n        call()\n    except UsageError as e:\n        assert 'ray.init' in str(e)\n"
        "    else:\n        raise AssertionError('no error')\n"
        "assert not ray.is_initialized()"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
