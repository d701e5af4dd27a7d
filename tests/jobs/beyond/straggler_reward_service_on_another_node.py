# hangdoc-expect: verdict=straggler culprits=0
# hangdoc-launch: mode=direct nproc=2
# hangdoc-root: cmd=--serve thread=reward-model
"""Rank 0 waits on the reward service another rank's node runs; its model thread deadlocked.

"Rank 1 starts the reward service (a ThreadingHTTPServer) on its node, listening on every
interface, and tells rank 0 its address (the one its node reaches the rendezvous from).
Every step rank 0 posts its responses to the service, reads back their scores and
broadcasts them. The service's handler threads queue the requests for the reward-model
thread and wait on a Future for the scores. Every 6 scored requests the reward-model thread
hot-reloads the latest weights under the weights lock, then scores a canary batch to check
them; ``score`` takes the weights lock too, and it is a plain ``threading.Lock``. The model
thread blocks on itself, rank 0 blocks reading the HTTP reply (on a multi-node job, from
another node), rank 1 waits in the broadcast of the scores."
"""
import datetime
import json
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

FEATURES = 8
RESPONSES_PER_RANK = 4
RELOAD_EVERY = 6  # scored requests between weight reloads
HANG_STEP = 6
STEPS = 1000


# ------------------------------------------------------------------ the reward service


class RewardModel:
    """Scores batches on one thread; reloads its weights now and then."""

    def __init__(self) -> None:
        torch.manual_seed(2)
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 1))
        self.weights_lock = threading.Lock()
        self.requests: queue.Queue = queue.Queue()
        self.scored = 0

    def run(self) -> None:
        while True:
            batch = [self.requests.get()]
            while not self.requests.empty():
                batch.append(self.requests.get_nowait())
            if self.scored >= RELOAD_EVERY:
                self.reload()
            for responses, future in batch:
                scores = self.score(torch.tensor(responses))
                self.scored += 1
                future.set_result(scores)

    @torch.no_grad()
    def score(self, responses: torch.Tensor) -> list[float]:
        with self.weights_lock:
            return self.net(responses).squeeze(-1).tolist()

    def reload(self) -> None:
        with self.weights_lock:
            fresh = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 1))
            self.net.load_state_dict(fresh.state_dict())  # the latest checkpoint
            self.scored = 0
            canary = self.score(torch.zeros(2, FEATURES))  # takes weights_lock again
            assert all(abs(s) < 1e3 for s in canary)


MODEL = RewardModel()


class RewardHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        future: Future = Future()
        MODEL.requests.put((body["responses"], future))
        reply = json.dumps({"scores": future.result()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(port_file: str) -> None:
    torch.set_num_threads(1)
    threading.Thread(target=MODEL.run, name="reward-model", daemon=True).start()
    server = ThreadingHTTPServer(("0.0.0.0", 0), RewardHandler)
    with open(port_file + ".tmp", "w") as out:
        out.write(str(server.server_address[1]))
    os.rename(port_file + ".tmp", port_file)
    server.serve_forever()


# ------------------------------------------------------------------ the trainer


def start_service() -> tuple[subprocess.Popen, int]:
    port_file = os.path.join(tempfile.mkdtemp(prefix="reward-"), "service.port")
    service = subprocess.Popen([sys.executable, __file__, "--serve", port_file])
    while not os.path.exists(port_file):
        if service.poll() is not None:
            raise RuntimeError(f"reward service exited with code {service.returncode}")
        time.sleep(0.1)
    with open(port_file) as f:
        return service, int(f.read())


def reachable_address() -> str:
    """This node's address on the way to the rendezvous: where the other ranks reach it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
        return probe.getsockname()[0]


HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the job's own network


def fetch_rewards(url: str, responses: torch.Tensor) -> torch.Tensor:
    req = urllib.request.Request(url, data=json.dumps({"responses": responses.tolist()}).encode(),
                                 headers={"Content-Type": "application/json"})
    with HTTP.open(req) as resp:  # no timeout: the reward model may queue for a while
        return torch.tensor(json.load(resp)["scores"])


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    address: list = [None]
    if rank == 1:
        service, port = start_service()
        address[0] = f"http://{reachable_address()}:{port}/score"
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    dist.broadcast_object_list(address, src=1)
    url = address[0]
    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, FEATURES))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)

    for step in range(STEPS):
        prompts = torch.randn(RESPONSES_PER_RANK, FEATURES, generator=gen)
        responses = policy(prompts)
        if step == HANG_STEP:
            mark_ready(rank)
        scored: list = [None]
        if rank == 0:
            scored[0] = fetch_rewards(url, responses.detach())
        dist.broadcast_object_list(scored, src=0)
        rewards = scored[0]
        loss = -(rewards - rewards.mean()).mul(responses.pow(2).mean(dim=1)).mean()
        opt.zero_grad()
        loss.backward()
        for param in policy.parameters():
            dist.all_reduce(param.grad)
            param.grad /= world_size
        opt.step()
        if rank == 0:
            print(f"step {step} mean reward {rewards.mean().item():.3f}", flush=True)
    dist.destroy_process_group()
    if rank == 1:
        service.terminate()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    else:
        main()
