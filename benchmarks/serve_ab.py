#!/usr/bin/env python
"""Two builds of `appliance serve` side by side: what a change does to the server's CPU per request.

    git worktree add /tmp/base <commit>
    .venv/bin/python benchmarks/serve_ab.py /tmp/base . --rounds 5
    .venv/bin/python benchmarks/serve_ab.py . .:server.preprocess_workers=2   # or two configs of one build

Each argument is a checkout (its `appliance` package is the one the server imports), optionally with
`:override` suffixes. All servers start at once on the last CPU; this process, the light client of
benchmarks/serve.py, runs on CPU 0. Every round sends the same 1024 tiny-LLaVA image questions (natural
answers, streamed, 64 in flight) to each server in turn, so a host that drifts (a VM's speed moves by
±15 % from minute to minute) moves every server's figures alike. Printed per server: output tokens/s
and the CPU time per request of its HTTP process and its engine process (medians over the rounds, then
each round's).
"""
import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import serve


async def one_round(server, bodies, concurrency):
    client = serve.LightClient(server.port)
    try:
        return await serve.drive(lambda: [lambda timings, b=b: client.chat(b, timings) for b in bodies], concurrency)
    finally:
        client.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("builds", nargs="+", help="checkout[:override...] per server")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[0]})
    tmp = Path(tempfile.mkdtemp())
    bodies = [serve.streamed_chat({"messages": m, "temperature": 0, "max_tokens": 16})
              for m in serve.llava_messages(tmp, args.requests)]
    results = {build: [] for build in args.builds}
    with contextlib.ExitStack() as stack:
        servers = {}
        for build in args.builds:
            checkout, *overrides = build.split(":")
            serve.REPO = Path(checkout).resolve()  # the server's PYTHONPATH
            servers[build] = stack.enter_context(serve.Server("pipeline=llava_chat", *overrides, cwd=tmp,
                                                              cpus={cpus[-1]}))
        for server in servers.values():  # warm-up: first use of each code path, caches filled
            asyncio.run(one_round(server, bodies, args.concurrency))
        for _ in range(args.rounds):
            for build, server in servers.items():
                before = server.cpu_seconds()
                wall, timings = asyncio.run(one_round(server, bodies, args.concurrency))
                ms = {role: (seconds - before[role]) / len(bodies) * 1e3
                      for role, seconds in server.cpu_seconds().items()}
                results[build].append((sum(t[2] for t in timings) / wall, ms["http"], ms["engine"]))
    print(f"{len(bodies)} tiny-LLaVA image questions per round, {args.concurrency} in flight, {args.rounds} rounds; "
          "CPU per request, median [each round]")
    print(f"{'build':40s} {'tok/s':>7s}  {'HTTP ms':>8s}  {'engine ms':>9s}")
    for build, rounds in results.items():
        rate, http, engine = (statistics.median(r[k] for r in rounds) for k in range(3))
        print(f"{build:40s} {rate:7.0f}  {http:8.3f}  {engine:9.3f}   HTTP [{' '.join(f'{r[1]:.3f}' for r in rounds)}]"
              f"  engine [{' '.join(f'{r[2]:.2f}' for r in rounds)}]")


if __name__ == "__main__":
    main()
