# hangdoc-expect: verdict=not_hung culprits=none
# hangdoc-launch: mode=direct nproc=2
# hangdoc-root: none
"""Healthy RL loop: rank 0 asks its rollout server for a batch every step, a few tens of ms.

"Nothing is wrong with this one. Rank 0 starts the rollout server (an aiohttp app with
a scheduler thread that batches and decodes) next to it; every step it posts the prompts,
gets the rollouts back in 20-100 ms, broadcasts them, and both ranks take a policy step
with an all_reduce of the gradients. Most of the time rank 0 is reading the HTTP reply
and rank 1 is in the broadcast, but every step the reply comes."
"""

import asyncio
import datetime
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import torch
import torch.distributed as dist
from _ready import mark_ready
from aiohttp import web
from torch import nn

VOCAB = 32
PROMPTS_PER_STEP = 4
PROMPT_LEN = 4
NEW_TOKENS = 8
DECODE_SECONDS = 0.005  # per token, as a real model's decode step would take
WARMUP_STEPS = 3


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens).cumsum(dim=1)))


# ------------------------------------------------------------------ the rollout server


class Scheduler:
    """Batches the handlers' requests and decodes them on one thread."""

    def __init__(self) -> None:
        torch.manual_seed(1)
        self.model = TinyLM().eval()
        self.requests: queue.Queue = queue.Queue()

    def submit(self, prompts: list[list[int]], future: asyncio.Future, loop: asyncio.AbstractEventLoop) -> None:
        self.requests.put((prompts, future, loop))

    def run(self) -> None:
        while True:
            batch = [self.requests.get()]
            while not self.requests.empty():
                batch.append(self.requests.get_nowait())
            for prompts, future, loop in batch:
                rollouts = self.decode(prompts)
                loop.call_soon_threadsafe(future.set_result, rollouts)

    @torch.no_grad()
    def decode(self, prompts: list[list[int]]) -> list[list[int]]:
        tokens = torch.tensor(prompts)
        for _ in range(NEW_TOKENS):
            time.sleep(DECODE_SECONDS)
            logits = self.model(tokens)[:, -1]
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1)
            tokens = torch.cat([tokens, nxt], dim=1)
        return tokens.tolist()


def serve(port_file: str) -> None:
    torch.set_num_threads(1)
    scheduler = Scheduler()
    threading.Thread(target=scheduler.run, name="scheduler", daemon=True).start()

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        scheduler.submit(body["prompts"], future, loop)
        return web.json_response({"rollouts": await future})

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/generate", generate)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        with open(port_file + ".tmp", "w") as out:
            out.write(str(port))
        os.rename(port_file + ".tmp", port_file)
        await asyncio.Event().wait()

    asyncio.run(main())


# ------------------------------------------------------------------ the trainer


def start_server() -> tuple[subprocess.Popen, str]:
    port_file = os.path.join(tempfile.mkdtemp(prefix="rollout-"), "server.port")
    server = subprocess.Popen([sys.executable, __file__, "--serve", port_file])
    while not os.path.exists(port_file):
        if server.poll() is not None:
            raise RuntimeError(f"rollout server exited with code {server.returncode}")
        time.sleep(0.1)
    with open(port_file) as f:
        return server, f"http://127.0.0.1:{int(f.read())}/generate"


HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the server is local


def request_rollouts(url: str, prompts: list[list[int]]) -> list[list[int]]:
    req = urllib.request.Request(url, data=json.dumps({"prompts": prompts}).encode(),
                                 headers={"Content-Type": "application/json"})
    with HTTP.open(req) as resp:
        return json.load(resp)["rollouts"]


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank == 0:
        server, url = start_server()
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    policy = TinyLM()
    opt = torch.optim.SGD(policy.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)

    step = 0
    while True:
        if step == WARMUP_STEPS:
            mark_ready(rank)
        batch: list = [None]
        if rank == 0:
            prompts = torch.randint(0, VOCAB, (PROMPTS_PER_STEP, PROMPT_LEN), generator=gen).tolist()
            batch = [request_rollouts(url, prompts)]
        dist.broadcast_object_list(batch, src=0)
        tokens = torch.tensor(batch[0])
        rewards = (tokens[:, PROMPT_LEN:] % 2 == 0).float().mean(dim=1)  # even tokens are good
        logp = torch.log_softmax(policy(tokens[:, :-1]), dim=-1)
        taken = logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)[:, PROMPT_LEN - 1:]
        loss = -((rewards - rewards.mean())[:, None] * taken).mean()
        opt.zero_grad()
        loss.backward()
        for param in policy.parameters():
            dist.all_reduce(param.grad)
            param.grad /= world_size
        opt.step()
        if rank == 0 and step % 50 == 0:
            print(f"step {step} reward {rewards.mean().item():.3f}", flush=True)
        step += 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    else:
        main()
