#!/usr/bin/env python
"""`appliance serve` under load, beside the offline engine on the same requests, in one run.

    .venv/bin/python benchmarks/serve.py                       # all three parts
    .venv/bin/python benchmarks/serve.py --parts llama --concurrency 1,4,16,64
    .venv/bin/python benchmarks/serve.py --quick               # a smoke run
    .venv/bin/python benchmarks/serve.py --parts llava --concurrency 64 --access-log on,off  # the request log's cost

Parts (each starts its own `appliance serve` process on 127.0.0.1, drives it with the official `openai`
client from this process, and runs the offline path on the same requests):
- llama: the engine benchmark's random 58M Llama (benchmarks/engine_throughput.py) over
  `/v1/completions` with token-id prompts, streaming, forced output lengths (ignore_eos). At each
  concurrency: TTFT, TPOT = (E2E - TTFT) / (tokens - 1), ITL and E2E (p50, p99), output tokens/s; the
  offline row is `LLMEngine` with `max_num_seqs` = the concurrency, on the same requests, run once the
  server has stopped (with `--rounds N`, N rounds of a fresh server over every level, then the offline
  runs; the round with the median ratio is shown). In the last round the highest concurrency runs once
  more while /health, /ready, /version and /metrics are each polled every 50 ms: their p50 / p95
  latency (that pass is not timed: 20 scrapes a second cost the server CPU that Prometheus never
  would).
- llava: the embedded tiny LLaVA over `/v1/chat/completions`, one image question per request (a few
  distinct images, so the encoder and prefix caches see repeats, as a real workload would); offline:
  `appliance run`'s pipeline on the same requests as a batch file, before and after the server that
  served every level (the baseline is the mean of the two runs around it; with `--rounds N`, N rounds,
  each with a fresh server, N + 1 offline runs, and the median round).
  Answers are the model's own (3-6 tokens) or, with `--llava-tokens N`, N tokens each. Beside each
  level: the CPU time all server processes spent per request, and the offline run's: what serving
  costs, whatever the client costs. With `--llava-client light`, a minimal HTTP client of this file
  replaces `openai` (~0.1 ms of client CPU per request instead of ~2.6): on a host whose client gets
  one core, the official client cannot keep 64 streams coming fast enough to saturate the server, and
  the light one shows what the server can do.
- pool: the demo flood model over `/pooling` (base64 in and out), scenes/s at concurrency 1 and 4,
  beside `appliance run`'s pipeline on the same scenes.
With `--access-log on,off` every part runs twice, its servers first with the request log (one INFO line
per request: `server.access_log`, on by default) and then without it, printed one after the other under
a `server.access_log=...` heading: what the request log costs at each level.
By default the client shares the host's cores with the server and the offline baselines. With
`--client-cpus 0` the client (this process) runs on CPU 0 only, and the server and every offline baseline
on the other CPUs, as when clients are other machines: served/offline is then the cost of serving
alone. Offline baselines run in a child process on the server's CPUs either way. Figures are for one
host, quiet otherwise.
"""
import argparse
import asyncio
import base64
import json
import multiprocessing as mp
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from engine_throughput import build_model, make_requests

SAMPLE_IMAGE = REPO / "appliance" / "assets" / "samples" / "orange_star.png"


# ---- the server ----------------------------------------------------------------------------------

class Server:
    def __init__(self, *overrides, cwd, max_queued: int = 4096, cpus=None, env=None, startup_s: float = 300):
        """`max_queued`: the server's queue bound; the benchmark's own levels must not meet it.
        `cpus`: the CPUs its processes run on (None: all of this process's). `env`: added to ours."""
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.startup_s = startup_s
        env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        self.log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a pipe nobody reads stalls the server
        self.proc = subprocess.Popen([sys.executable, "-m", "appliance.cli", "serve", *overrides,
                                      f"server.port={self.port}", f"server.limits.max_queued_requests={max_queued}"],
                                     cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=self.log,
                                     start_new_session=True,  # its session: all its processes, for RSS
                                     preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)

    def __enter__(self):
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                last = (self.log_text().strip().splitlines() or ["no message"])[-1]
                raise RuntimeError(f"the server exited during start-up: {last}")
            try:
                if httpx.get(f"{self.base}/ready", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError("the server did not become ready")

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(120)
        self.log.close()

    def log_text(self) -> str:
        """What the server wrote to stderr so far (its log). pread: the server shares the file's offset."""
        fd = self.log.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def pids(self) -> list:
        """The server's processes: every process of its session."""
        pids = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3]) == self.proc.pid:
                    pids.append(pid)
            except OSError:  # gone meanwhile
                pass
        return pids

    def cpu_seconds(self) -> dict:
        """CPU time (user + system) of the server's processes so far, by role: `engine` (LitServe's
        spawned inference worker), `http` (the forked uvicorn process) and `other` (this main process,
        LitServe's manager)."""
        own = Path(f"/proc/{self.proc.pid}/cmdline").read_bytes()
        seconds = {"engine": 0.0, "http": 0.0, "other": 0.0}
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:  # gone meanwhile
                continue
            role = ("engine" if b"spawn_main" in command else
                    "http" if command == own and int(pid) != self.proc.pid else "other")
            seconds[role] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return seconds


def on_cpus(cpus, fn, *args):
    """fn(*args) in a fresh process that runs on `cpus` with as many torch threads (None: all of ours)."""
    with mp.get_context("spawn").Pool(1, initializer=_pin, initargs=(cpus or os.sched_getaffinity(0),)) as pool:
        return pool.apply(fn, args)


def _pin(cpus) -> None:
    import torch

    os.sched_setaffinity(0, cpus)  # before torch starts its thread pool, which inherits it
    torch.set_num_threads(len(cpus))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- measuring ------------------------------------------------------------------------------------

OPS_ROUTES = ("/health", "/ready", "/version", "/metrics")  # each must answer fast while the engine is saturated


def pct(values, p):
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


async def stream_one(create, timings):
    """One streaming request; appends (ttft, e2e, tokens, itls)."""
    start = time.perf_counter()
    first, last, itls, tokens = None, None, [], 0
    async for chunk in await create():
        if getattr(chunk, "usage", None):
            tokens = chunk.usage.completion_tokens
        if not chunk.choices:
            continue
        piece = chunk.choices[0].text if hasattr(chunk.choices[0], "text") else chunk.choices[0].delta.content
        if piece:
            now = time.perf_counter()
            if first is None:
                first = now
            else:
                itls.append(now - last)
            last = now
    timings.append((first - start, last - start, tokens, itls))


class LightClient:
    """A minimal HTTP/1.1 client for SSE chat streams on keep-alive connections: it costs ~0.1 ms of CPU
    per request where the `openai` client costs ~2.6 (vLLM's own serving benchmark uses aiohttp rather
    than `openai` for the same reason), so the server, not the client, sets the pace."""

    def __init__(self, port: int):
        self.port = port
        self.idle = []  # open connections, (reader, writer)

    async def chat(self, body: bytes, timings) -> None:
        """One streaming request; appends (ttft, e2e, tokens, itls) as `stream_one` does. The answer's
        first body write is its first token (the server sends the role chunk with it)."""
        reader, writer = self.idle.pop() if self.idle else await asyncio.open_connection("127.0.0.1", self.port)
        start = time.perf_counter()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        received, arrivals = b"", []
        while not received.endswith(b"\r\n0\r\n\r\n"):  # the end of a chunked body
            data = await reader.read(1 << 16)
            if not data:
                raise RuntimeError("the server closed the connection")
            received += data
            if b"\r\n\r\n" in received and not received.startswith(b"HTTP/1.1 200"):  # an error: not chunked
                raise RuntimeError(received[:300].decode(errors="replace"))
            if b"data: " in data:
                arrivals.append(time.perf_counter() - start)
        tokens = int(re.findall(rb'"completion_tokens": ?(\d+)', received)[-1])
        timings.append((arrivals[0], arrivals[-1], tokens, [b - a for a, b in zip(arrivals, arrivals[1:])]))
        self.idle.append((reader, writer))

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


async def drive(make_calls, concurrency):
    """All calls (each `await call(timings)` makes one request and appends its timings), at most
    `concurrency` in flight; (wall seconds, timings)."""
    gate = asyncio.Semaphore(concurrency)
    timings = []

    async def one(call):
        async with gate:
            await call(timings)

    start = time.perf_counter()
    await asyncio.gather(*[one(c) for c in make_calls()])
    return time.perf_counter() - start, timings


async def poll(base, path, stop, latencies):
    async with httpx.AsyncClient(timeout=10) as client:
        while not stop.is_set():
            t = time.perf_counter()
            await client.get(f"{base}{path}")
            latencies.append(time.perf_counter() - t)
            await asyncio.sleep(0.05)


def median_round(c, rounds):
    """Rounds of one level as (served/offline, wall, timings, offline tok/s, ...): the one with the median
    ratio; each round is printed when there are several."""
    if len(rounds) > 1:
        print(f"c={c} rounds (served tok/s, offline tok/s, ratio): " + ", ".join(
            f"({sum(t[2] for t in r[2]) / r[1]:.1f}, {r[3]:.1f}, {r[0]:.2f})" for r in rounds), flush=True)
    return sorted(rounds, key=lambda r: r[0])[len(rounds) // 2]


def row(label, wall, timings):
    ttft = [t[0] for t in timings]
    e2e = [t[1] for t in timings]
    tpot = [(t[1] - t[0]) / (t[2] - 1) for t in timings if t[2] > 1]
    itl = [x for t in timings for x in t[3]]
    tokens = sum(t[2] for t in timings)
    def ms(v):
        return f"{v * 1e3:7.1f}"
    return (f"{label:14s} {tokens / wall:9.1f} {ms(pct(ttft, 50))} {ms(pct(ttft, 99))} {ms(pct(tpot, 50))} "
            f"{ms(pct(tpot, 99))} {ms(pct(itl, 50))} {ms(pct(itl, 99))} {ms(pct(e2e, 50))} {ms(pct(e2e, 99))}")


HEADER = (f"{'run':14s} {'out tok/s':>9s} {'TTFT50':>7s} {'TTFT99':>7s} {'TPOT50':>7s} {'TPOT99':>7s} "
          f"{'ITL50':>7s} {'ITL99':>7s} {'E2E50':>7s} {'E2E99':>7s}   (ms)")


# ---- parts ----------------------------------------------------------------------------------------

def llama_part(args, tmp):
    import openai

    model = Path(tmp) / "llama"
    build_model(str(model))
    levels = [int(c) for c in args.concurrency.split(",")]
    requests = {c: make_requests(max(8, args.per_level * c), seed=c) for c in levels}

    async def run(server, c, probe=False):
        async with openai.AsyncOpenAI(base_url=f"{server.base}/v1", api_key="x", max_retries=0,
                                      timeout=600) as client:
            def calls():
                return [lambda timings, p=p, n=n: stream_one(lambda: client.completions.create(
                    model="bench-llama", prompt=p, max_tokens=n, temperature=0, stream=True,
                    stream_options={"include_usage": True}, extra_body={"ignore_eos": True}), timings)
                    for p, n in requests[c]]

            stop, latencies = asyncio.Event(), {path: [] for path in OPS_ROUTES}
            pollers = [asyncio.create_task(poll(server.base, path, stop, values))
                       for path, values in latencies.items()] if probe else []
            result = await drive(calls, c)
            stop.set()
            await asyncio.gather(*pollers)
            return result, latencies

    # Rounds alternate served and offline, so that a host whose speed drifts shifts both alike; as in the
    # llava part, each round's server is stopped before the offline runs.
    rounds = {c: [] for c in levels}
    probes = {}
    for round_ in range(args.rounds):
        measured = {}
        with Server(args.access_log_override, "pipeline=llava_chat", f"model.path={model}", "model.name=bench-llama",
                    "model.architecture=LlamaForCausalLM", "model.vision_language=null", "engine.max_num_seqs=64",
                    "engine.kv_cache_memory_bytes=536870912", "engine.enable_prefix_caching=false",
                    f"server.stream_interval={args.stream_interval}", cwd=tmp, cpus=args.server_cpus) as server:
            for c in levels:
                measured[c] = asyncio.run(run(server, c))[0]
            if round_ == args.rounds - 1:  # the highest level once more, probed every 50 ms (not timed: it
                _, probes = asyncio.run(run(server, max(levels), probe=True))  # costs the server CPU)
        for c, (wall, timings) in measured.items():
            offline = on_cpus(args.server_cpus, offline_engine, str(model), requests[c], c)
            rounds[c].append((sum(t[2] for t in timings) / wall / offline, wall, timings, offline))
    served = {c: median_round(c, rounds[c]) for c in levels}
    print(f"\nllama 58M over /v1/completions (streaming), {args.per_level} x concurrency requests per level"
          + (f", the median of {args.rounds} rounds" if args.rounds > 1 else ""))
    print(HEADER)
    for c in levels:
        ratio, wall, timings, offline = served[c]
        print(row(f"serve c={c}", wall, timings))
        print(f"{'offline':14s} {offline:9.1f}   served/offline = {ratio:.2f}")
    for path, values in probes.items():
        print(f"{path} while c={max(levels)} runs again: p50 {pct(values, 50) * 1e3:.1f} ms, "
              f"p95 {pct(values, 95) * 1e3:.1f} ms, max {max(values) * 1e3:.1f} ms ({len(values)} probes)")


def offline_engine(model, requests, max_seqs) -> float:
    from appliance.config.schema import EngineConfig
    from appliance.engine.llm_engine import LLMEngine
    from appliance.engine.sampling_params import SamplingParams
    from appliance.gc_tuning import settle_heap

    engine = LLMEngine(str(model), EngineConfig(kv_cache_memory_bytes=512 * 2 ** 20, max_num_seqs=max_seqs,
                                                enable_prefix_caching=False))
    engine.generate([requests[0][0][:8]], SamplingParams(temperature=0, max_tokens=2))
    settle_heap()  # as the server's engine loop does after its warm-up
    start = time.perf_counter()
    outs = engine.generate([p for p, _ in requests],
                           [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in requests])
    wall = time.perf_counter() - start
    engine.close()
    return sum(len(o.token_ids) for o in outs) / wall


def llava_messages(tmp, n_requests: int) -> list:
    """`n_requests` one-image questions' messages over 8 distinct images (saved under `tmp`), so the
    encoder and prefix caches see repeats as a real workload's would."""
    from tests.chat.conftest import clear_samples, synthetic_shapes

    images = [image for image, _ in clear_samples(synthetic_shapes(), 8, first_seed=5000)]
    urls = []
    for i, image in enumerate(images):
        image.save(Path(tmp) / f"{i}.png")
        urls.append("data:image/png;base64," + base64.b64encode((Path(tmp) / f"{i}.png").read_bytes()).decode())
    questions = [(urls[i % len(urls)], ("What color is the shape?", "What shape is this?")[i % 2])
                 for i in range(n_requests)]
    return [[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}},
                                          {"type": "text", "text": q}]}] for u, q in questions]


def streamed_chat(body: dict) -> bytes:
    """A chat body as the light client sends it: streamed, with the usage chunk."""
    streamed = {"stream": True, "stream_options": {"include_usage": True}}
    return json.dumps({**body, "model": "llava-tiny", **streamed}).encode()


def llava_part(args, tmp):
    import openai

    levels = [int(c) for c in args.concurrency.split(",")]
    n_requests = max(levels) * args.llava_per_level
    messages = llava_messages(tmp, n_requests)
    # Natural answers (the tiny model's are 3-6 tokens), or with --llava-tokens N every answer N tokens long.
    length = {"max_tokens": args.llava_tokens, "ignore_eos": True} if args.llava_tokens else {"max_tokens": 16}
    bodies = [{"messages": m, "temperature": 0, **length} for m in messages]
    batch, answers = Path(tmp) / "llava.jsonl", Path(tmp) / "llava_answers.jsonl"
    batch.write_text("".join(json.dumps({"custom_id": str(i), "body": body}) + "\n" for i, body in enumerate(bodies)))
    streamed = [streamed_chat(body) for body in bodies] if args.llava_client == "light" else []

    def offline():
        """`appliance run` on the same requests as one batch file: (tok/s, CPU seconds)."""
        answers.unlink(missing_ok=True)  # a chat batch run never overwrites its output
        wall, cpu = on_cpus(args.server_cpus, offline_pipeline,
                            ["pipeline=llava_chat", f"input={batch}", f"output={answers}"])
        lines = answers.read_text().splitlines()
        return sum(json.loads(line)["response"]["body"]["usage"]["completion_tokens"] for line in lines) / wall, cpu

    async def run(server, c):
        if args.llava_client == "light":
            client = LightClient(server.port)
            try:
                return await drive(lambda: [lambda timings, b=b: client.chat(b, timings) for b in streamed], c)
            finally:
                client.close()
        async with openai.AsyncOpenAI(base_url=f"{server.base}/v1", api_key="x", max_retries=0,
                                      timeout=600) as client:
            def calls():
                return [lambda timings, m=m: stream_one(lambda: client.chat.completions.create(
                    model="llava-tiny", messages=m, max_tokens=length["max_tokens"], temperature=0,
                    stream=True, stream_options={"include_usage": True},
                    extra_body={k: v for k, v in length.items() if k != "max_tokens"}), timings)
                    for m in messages]

            return await drive(calls, c)

    # Each round: a fresh server serves every level, then is stopped, and `appliance run` gets the host
    # as a user's batch job does. (An idle server left beside it made its page faults, and so its CPU,
    # cost up to 30 % more on a VM host.) Each starts with cold caches.
    # Every served round sits between two offline runs and is measured against their mean, so a host
    # whose speed drifts steadily moves a round's baseline with it.
    rounds = {c: [] for c in levels}
    before_round = offline()
    for _ in range(args.rounds):
        measured = {}
        with Server(args.access_log_override, "pipeline=llava_chat", f"server.stream_interval={args.stream_interval}",
                    cwd=tmp, cpus=args.server_cpus) as server:
            for c in levels:
                before = server.cpu_seconds()
                wall, timings = asyncio.run(run(server, c))
                measured[c] = wall, timings, {role: seconds - before[role]
                                              for role, seconds in server.cpu_seconds().items()}
        after_round = offline()
        offline_rate, offline_cpu = ((a + b) / 2 for a, b in zip(before_round, after_round))
        before_round = after_round
        for c, (wall, timings, cpu) in measured.items():
            rate = sum(t[2] for t in timings) / wall
            rounds[c].append((rate / offline_rate, wall, timings, offline_rate, cpu, offline_cpu))
    served = {c: median_round(c, rounds[c]) for c in levels}
    tokens = sum(t[2] for t in served[levels[0]][2])
    print(f"\ntiny LLaVA over /v1/chat/completions (streaming, {args.llava_client} client), {n_requests} image "
          "questions per level, "
          + (f"{args.llava_tokens}-token answers" if args.llava_tokens else "natural answers")
          + f" ({tokens / n_requests:.1f} tokens on average)" + (f", the median of {args.rounds} rounds"
                                                                  if args.rounds > 1 else "")
          + "; CPU: every server process, per request")
    print(HEADER + "   server CPU: all (HTTP process, engine process)")
    for c in levels:
        ratio, wall, timings, offline_rate, cpu, offline_cpu = served[c]
        ms = {role: seconds / n_requests * 1e3 for role, seconds in cpu.items()}
        print(row(f"serve c={c}", wall, timings)
              + f"   {sum(ms.values()):.2f} ms ({ms['http']:.2f}, {ms['engine']:.2f})")
        print(f"{'offline run':14s} {offline_rate:9.1f}   served/offline = {ratio:.2f} (appliance run on the same "
              f"batch, model loaded, the mean of the runs before and after; CPU {offline_cpu / n_requests * 1e3:.2f} "
              "ms per request)")


def offline_pipeline(overrides):
    """`appliance run`'s pipeline in this process: (wall, CPU) seconds for the records, after set-up."""
    from omegaconf import OmegaConf

    from appliance.config.compose import compose
    from appliance.gc_tuning import settle_heap
    from appliance.stages.build import build_pipeline

    cfg = compose(overrides)
    pipeline = build_pipeline(cfg)
    pipeline.check()
    pipeline.setup()
    settle_heap()  # as `appliance run` does once its stages are set up
    record = {f: OmegaConf.to_object(v) if OmegaConf.is_config(v) else v
              for f, v in ((f, cfg.get(f)) for f in cfg.pipeline.inputs)}
    start, cpu = time.perf_counter(), time.process_time()
    for _ in pipeline.run([record]):
        pass
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    pipeline.close()
    return wall, cpu


def pool_part(args, tmp):
    import numpy as np
    import rasterio

    scenes = []
    for i in range(args.scenes):
        path = Path(tmp) / f"scene{i}.tif"
        rng = np.random.default_rng(i)
        data = (rng.random((6, 1024, 1024)) * 3000).astype("uint16")
        with rasterio.open(path, "w", driver="GTiff", height=1024, width=1024, count=6, dtype="uint16",
                           crs="EPSG:32615", transform=rasterio.Affine(30, 0, 0, 0, -30, 0)) as dst:
            dst.write(data)
        scenes.append(path)
    bodies = [{"data": {"data": base64.b64encode(p.read_bytes()).decode(), "data_format": "b64_json",
                        "out_data_format": "b64_json"}} for p in scenes]
    results = {}
    with Server(args.access_log_override, "pipeline=prithvi_flood", "server.limits.max_request_bytes=104857600",
                cwd=tmp, cpus=args.server_cpus) as server:
        async def run(c):
            gate = asyncio.Semaphore(c)
            async with httpx.AsyncClient(timeout=600) as client:
                async def one(body):
                    async with gate:
                        response = await client.post(f"{server.base}/pooling", json=body)
                        assert response.status_code == 200, response.text

                start = time.perf_counter()
                await asyncio.gather(*[one(b) for b in bodies])
                return time.perf_counter() - start

        for c in (1, 4):
            results[c] = asyncio.run(run(c))
    out = Path(tmp) / "masks"
    wall, _ = on_cpus(args.server_cpus, offline_pipeline, ["pipeline=prithvi_flood",
                                                        f"input=[{','.join(str(p) for p in scenes)}]",
                                                        f"output={out}", "overwrite=true"])
    print(f"\nflood demo model over /pooling (base64 in and out), {len(scenes)} scenes of 1024x1024x6")
    print(f"{'run':14s} {'scenes/s':>9s}")
    for c, seconds in results.items():
        print(f"{'serve c=' + str(c):14s} {len(scenes) / seconds:9.2f}")
    print(f"{'appliance run':14s} {len(scenes) / wall:9.2f}   (one run over all scenes, model loaded)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="llama,llava,pool")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--per-level", type=int, default=2, help="requests per level = this x concurrency (min 8)")
    ap.add_argument("--scenes", type=int, default=8)
    ap.add_argument("--llava-per-level", type=int, default=2,
                    help="llava: this x the highest concurrency requests at every level")
    ap.add_argument("--llava-tokens", type=int, default=None,
                    help="llava: every answer this many tokens (ignore_eos); default: the model's own answers")
    ap.add_argument("--rounds", type=int, default=1,
                    help="llama, llava: served and offline runs per level, alternating")
    ap.add_argument("--stream-interval", type=int, default=1,
                    help="llama, llava: the server's stream_interval (tokens per streamed chunk after the first)")
    ap.add_argument("--llava-client", choices=["openai", "light"], default="openai",
                    help="llava: the official client, or a minimal one that costs the client ~0.1 ms per request")
    ap.add_argument("--access-log", default="on", type=access_log_settings,
                    help="on, off, or on,off: run every part with each setting of server.access_log in turn")
    ap.add_argument("--quick", action="store_true", help="concurrency 1,4; 4 scenes")
    ap.add_argument("--client-cpus", default=None,
                    help="CPUs for the client, e.g. 0 or 0-1; the server and the offline baselines get the rest")
    args = ap.parse_args()
    if args.quick:
        args.concurrency, args.scenes = "1,4", 4
    args.server_cpus = None
    if args.client_cpus:
        client = cpu_list(args.client_cpus)
        args.server_cpus = os.sched_getaffinity(0) - client
        if not args.server_cpus or not client <= os.sched_getaffinity(0):
            ap.error(f"--client-cpus {args.client_cpus}: must name some, not all, of {sorted(os.sched_getaffinity(0))}")
        os.sched_setaffinity(0, client)
        print(f"client on CPUs {sorted(client)}; server and offline baselines on CPUs {sorted(args.server_cpus)}")
    print(f"load average before: {os.getloadavg()}")
    for setting in args.access_log:
        args.access_log_override = f"server.access_log={'true' if setting == 'on' else 'false'}"
        if len(args.access_log) > 1:
            print(f"\n=== {args.access_log_override}")
        with tempfile.TemporaryDirectory() as tmp:
            for part in args.parts.split(","):
                {"llama": llama_part, "llava": llava_part, "pool": pool_part}[part](args, tmp)
    print(f"\nload average after: {os.getloadavg()}")


def access_log_settings(text: str) -> list:
    """'on', 'off' or 'on,off' -> the settings to run, in order."""
    settings = text.split(",")
    if not settings or any(s not in ("on", "off") for s in settings):
        raise argparse.ArgumentTypeError(f"{text!r}: on, off, or both as on,off")
    return settings


def cpu_list(text: str) -> set:
    """'0', '0-1', '0,2' -> a set of CPU numbers."""
    cpus = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


if __name__ == "__main__":
    main()
