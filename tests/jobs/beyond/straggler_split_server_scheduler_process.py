# hangdoc-expect: verdict=straggler culprits=0
# hangdoc-launch: mode=direct nproc=2
# hangdoc-root: cmd=--schedule thread=scheduler
"""The RL run stopped at step 4: the inference server's scheduler process deadlocked.

"The rollout server is two processes, as SGLang and vLLM are: an HTTP front end (aiohttp)
that rank 0 asks for rollouts, and a scheduler process that batches and decodes, reached
over a Unix socket the front end's event loop reads with asyncio streams. The scheduler's
KV cache keeps finished sequences for prefix reuse; the first allocation that does not fit
evicts, and ``evict`` takes the cache lock that ``allocate`` already holds (a plain
``threading.Lock``). The scheduler thread blocks on itself; the front end's event loop
waits for a reply that never comes; rank 0 blocks reading the HTTP reply and rank 1 waits
in the broadcast of the batch."
"""

import asyncio
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

import torch
import torch.distributed as dist
from _ready import mark_ready
from aiohttp import web
from torch import nn

VOCAB = 32
PROMPTS_PER_STEP = 4
PROMPT_LEN = 4
NEW_TOKENS = 8
BLOCK_TOKENS = 4  # tokens per KV-cache block
BLOCKS_PER_SEQ = (PROMPT_LEN + NEW_TOKENS) // BLOCK_TOKENS  # 3
CACHE_BLOCKS = 48  # 4 steps of 4 sequences x 3 blocks: the 5th step has to evict
HANG_STEP = CACHE_BLOCKS // (PROMPTS_PER_STEP * BLOCKS_PER_SEQ)  # where the cache is full
STEPS = 1000


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens).cumsum(dim=1)))


# ------------------------------------------------------------------ the rollout server


class KVCache:
    """Block allocator of the paged KV cache; finished sequences stay cached for reuse."""

    def __init__(self, blocks: int) -> None:
        self.lock = threading.Lock()
        self.free = list(range(blocks))
        self.cached: dict[int, list[int]] = {}  # sequence id -> its blocks, oldest first

    def allocate(self, seq_id: int, n: int) -> list[int]:
        with self.lock:
            if len(self.free) < n:
                self.evict(n - len(self.free))
            blocks = [self.free.pop() for _ in range(n)]
            self.cached[seq_id] = blocks
            return blocks

    def evict(self, n: int) -> None:
        """Drop the oldest cached sequences until ``n`` blocks are free."""
        mark_ready(int(os.environ["RANK"]))  # the scheduler inherits rank 0's environment
        with self.lock:  # also called from allocate, which holds the lock already
            while len(self.free) < n and self.cached:
                oldest = next(iter(self.cached))
                self.free.extend(self.cached.pop(oldest))


class Scheduler:
    """Batches the requests and decodes them on one thread."""

    def __init__(self) -> None:
        torch.manual_seed(1)
        self.model = TinyLM().eval()
        self.cache = KVCache(CACHE_BLOCKS)
        self.requests: queue.Queue = queue.Queue()
        self.next_seq = 0

    def run(self) -> None:
        while True:
            batch = [self.requests.get()]
            while not self.requests.empty():
                batch.append(self.requests.get_nowait())
            for prompts, reply in batch:
                for _ in prompts:
                    self.cache.allocate(self.next_seq, BLOCKS_PER_SEQ)
                    self.next_seq += 1
                reply(self.decode(prompts))

    @torch.no_grad()
    def decode(self, prompts: list[list[int]]) -> list[list[int]]:
        tokens = torch.tensor(prompts)
        for _ in range(NEW_TOKENS):
            logits = self.model(tokens)[:, -1]
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1)
            tokens = torch.cat([tokens, nxt], dim=1)
        return tokens.tolist()


def schedule(socket_path: str) -> None:
    """The scheduler process: requests arrive as JSON lines on a Unix socket."""
    torch.set_num_threads(1)
    scheduler = Scheduler()
    threading.Thread(target=scheduler.run, name="scheduler", daemon=True).start()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen()
    conn, _ = listener.accept()
    reader = conn.makefile("rb")
    lock = threading.Lock()
    while True:
        line = reader.readline()
        if not line:
            return
        done = threading.Event()
        result: list = []

        def reply(rollouts: list, done: threading.Event = done, result: list = result) -> None:
            result.append(rollouts)
            done.set()

        scheduler.requests.put((json.loads(line)["prompts"], reply))
        done.wait()
        with lock:
            conn.sendall(json.dumps({"rollouts": result[0]}).encode() + b"\n")


def serve(port_file: str) -> None:
    """The HTTP front end: forwards each request to the scheduler process and awaits it."""
    socket_path = os.path.join(os.path.dirname(port_file), "scheduler.sock")
    subprocess.Popen([sys.executable, __file__, "--schedule", socket_path])
    while not os.path.exists(socket_path):
        time.sleep(0.1)

    async def main() -> None:
        reader, writer = await asyncio.open_unix_connection(socket_path)
        lock = asyncio.Lock()

        async def generate(request: web.Request) -> web.Response:
            body = await request.json()
            async with lock:
                writer.write(json.dumps({"prompts": body["prompts"]}).encode() + b"\n")
                await writer.drain()
                reply = json.loads(await reader.readline())
            return web.json_response({"rollouts": reply["rollouts"]})

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
    with HTTP.open(req) as resp:  # no timeout: a long generation can take minutes
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

    for step in range(STEPS):
        batch: list = [None]
        if rank == 0:
            prompts = torch.randint(0, VOCAB, (PROMPTS_PER_STEP, PROMPT_LEN), generator=gen).tolist()
            # rank 0 is ready when the scheduler is about to block (KVCache.evict): marked
            # here, the front end could still be forwarding the request when sampled
            batch = [request_rollouts(url, prompts)]
        elif step == HANG_STEP:
            mark_ready(rank)
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
        if rank == 0:
            print(f"step {step} reward {rewards.mean().item():.3f}", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        server.terminate()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    elif sys.argv[1:2] == ["--schedule"]:
        schedule(sys.argv[2])
    else:
        main()
