#!/usr/bin/env python
"""Soak: mixed chat and pool traffic at 80 % of the measured capacity, for a long time (outside CI).

    .venv/bin/python benchmarks/soak.py                      # 30 minutes, writes docs/reliability_soak.png
    .venv/bin/python benchmarks/soak.py --minutes 2 --plot /tmp/soak.png    # a smoke run

Two servers on 127.0.0.1: `pipeline=llava_chat` (the embedded tiny LLaVA) and `pipeline=prithvi_flood`
(the demo flood model). The traffic mixes chat requests (an image question, streamed or not, 9 in 10)
and GeoTIFF requests (`/pooling`, a 512 x 512 scene, 1 in 10).
1. Capacity: 16 clients in a closed loop for --probe-s seconds; capacity = completed requests/s.
2. Soak: open-loop Poisson arrivals at --load x capacity for --minutes. Every --window-s seconds: p50 and
   p99 latency of each kind, requests, refusals (429: the server's queue was full) and errors in the
   window, the most requests each server held (running + waiting, from its /metrics) and the resident
   memory of each server (all its processes). Prints the table, the drift (last window vs the first full
   one) and draws the p99 latency and RSS over time into a PNG (Pillow, no plotting library).

The client puts no cap of its own on requests in flight: past the servers' queue bounds
(`server.limits.max_queued_requests`) the servers refuse with 429, which is the overload protection this
measures. (A client-side connection cap would queue the excess in the client, where it grows without
bound and takes the client's CPU from the servers on a shared host: what a first run here showed.)
"""
import argparse
import asyncio
import base64
import collections
import io
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from serve import Server, pct


def session_rss(pid: int) -> int:
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) != pid:
                continue
            with open(f"/proc/{entry}/status") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration, ProcessLookupError):
            pass
    return total


class Traffic:
    def __init__(self, chat_base: str, pool_base: str, images, scene_b64: str, seed: int = 0):
        self.chat_base, self.pool_base = chat_base, pool_base
        self.images, self.scene = images, scene_b64
        self.rng = random.Random(seed)
        self.samples = []  # (finished at, kind, seconds, outcome: "ok" | "refused" | "error")
        self.failures = collections.Counter()  # (kind, HTTP status or exception) of each error

    async def one(self, client: httpx.AsyncClient):
        kind = "pool" if self.rng.random() < 0.1 else "chat"
        start = time.monotonic()
        status = None
        try:
            if kind == "pool":
                response = await client.post(f"{self.pool_base}/pooling", json={"data": {
                    "data": self.scene, "data_format": "b64_json", "out_data_format": "b64_json"}})
                status = response.status_code
            else:
                stream = self.rng.random() < 0.5
                body = {"model": "llava-tiny", "max_tokens": 16, "temperature": 0, "stream": stream,
                        "messages": [{"role": "user", "content": [
                            {"type": "image_url", "image_url": {"url": self.rng.choice(self.images)}},
                            {"type": "text", "text": self.rng.choice(["What color is the shape?",
                                                                      "What shape is this?"])}]}]}
                if stream:
                    async with client.stream("POST", f"{self.chat_base}/v1/chat/completions", json=body) as r:
                        lines = [line async for line in r.aiter_lines() if line]
                    complete = r.status_code != 200 or (lines[-1] == "data: [DONE]" and '"error"' not in lines[-2])
                    status = r.status_code if complete else None
                else:
                    response = await client.post(f"{self.chat_base}/v1/chat/completions", json=body)
                    status = response.status_code
        except httpx.HTTPError as e:
            status = type(e).__name__
        outcome = "ok" if status == 200 else "refused" if status == 429 else "error"
        if outcome == "error":
            self.failures[(kind, status or "stream ended with an error")] += 1
        self.samples.append((time.monotonic(), kind, time.monotonic() - start, outcome))


async def capacity(traffic: Traffic, seconds: float, clients: int = 16) -> float:
    stop = time.monotonic() + seconds
    done = 0

    async def worker(client):
        nonlocal done
        while time.monotonic() < stop:
            await traffic.one(client)
            done += 1

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as client:
        await asyncio.gather(*[worker(client) for _ in range(clients)])
    return done / seconds


async def held(client: httpx.AsyncClient, base: str) -> float:
    """Requests the server holds (running + waiting), from its /metrics."""
    try:
        text = (await client.get(f"{base}/metrics", timeout=10)).text
    except httpx.HTTPError:
        return float("nan")
    return sum(float(v) for v in re.findall(r"^appliance_num_requests_(?:running|waiting)\{[^}]*\} (\S+)$", text, re.M))


async def soak(traffic: Traffic, rate: float, seconds: float, window: float, servers):
    rng = random.Random(1)
    start = time.monotonic()
    rss = []  # (t, chat rss, pool rss, chat held, pool held)
    tasks = set()

    async def sample_servers(probe):
        while time.monotonic() - start < seconds:
            rss.append((time.monotonic() - start, *(session_rss(s.proc.pid) for s in servers),
                        *[await held(probe, s.base) for s in servers]))
            await asyncio.sleep(min(5.0, window / 2))

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client, httpx.AsyncClient() as probe:
        sampler = asyncio.create_task(sample_servers(probe))
        next_at = start
        while time.monotonic() - start < seconds:
            next_at += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            task = asyncio.create_task(traffic.one(client))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        await sampler
    return start, rss


def windows(samples, start, rss, window, seconds):
    rows = []
    for i in range(int(seconds // window)):
        lo, hi = start + i * window, start + (i + 1) * window
        inside = [s for s in samples if lo <= s[0] < hi]
        mem = [r for r in rss if i * window <= r[0] < (i + 1) * window]
        row = {"t": (i + 1) * window, "requests": len(inside),
               "refused": sum(s[3] == "refused" for s in inside), "errors": sum(s[3] == "error" for s in inside)}
        for kind in ("chat", "pool"):
            lat = [s[2] for s in inside if s[1] == kind and s[3] == "ok"]
            row[f"{kind}_p50"], row[f"{kind}_p99"] = pct(lat, 50), pct(lat, 99)
        row["chat_rss"] = max((m[1] for m in mem), default=float("nan"))
        row["pool_rss"] = max((m[2] for m in mem), default=float("nan"))
        row["chat_held"] = max((m[3] for m in mem), default=float("nan"))
        row["pool_held"] = max((m[4] for m in mem), default=float("nan"))
        rows.append(row)
    return rows


def plot(rows, path: Path):
    """Two panels (p99 latency of each kind; RSS of each server) over time, drawn with Pillow."""
    from PIL import Image, ImageDraw

    width, height, margin = 900, 620, 60
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    t = [r["t"] / 60 for r in rows]
    panels = [("p99 latency (s)", [("chat", [r["chat_p99"] for r in rows], (30, 90, 200)),
                                   ("pool", [r["pool_p99"] for r in rows], (200, 80, 30))]),
              ("resident memory (MiB)", [("chat server", [r["chat_rss"] / 2 ** 20 for r in rows], (30, 90, 200)),
                                         ("pool server", [r["pool_rss"] / 2 ** 20 for r in rows], (200, 80, 30))])]
    panel_h = (height - 2 * margin) // 2
    for p, (title, series) in enumerate(panels):
        top = margin // 2 + p * (panel_h + margin)
        left, right, bottom = margin + 20, width - 20, top + panel_h
        values = [v for _, ys, _ in series for v in ys if v == v]
        lo, hi = 0.0, (max(values) * 1.1 if values else 0.0) or 1.0
        draw.rectangle([left, top, right, bottom], outline="black")
        draw.text((left + 5, top + 3), title, fill="black")
        for frac in (0, 0.5, 1):
            y = bottom - frac * (bottom - top)
            draw.text((4, y - 6), f"{lo + frac * (hi - lo):.2f}" if hi < 10 else f"{lo + frac * (hi - lo):.0f}",
                      fill="black")
        tmax = max(t) if t else 1
        for frac in (0, 0.5, 1):
            draw.text((left + frac * (right - left) - 10, bottom + 4), f"{frac * tmax:.0f} min", fill="black")
        for k, (name, ys, colour) in enumerate(series):
            points = [(left + (x / tmax) * (right - left), bottom - (y - lo) / (hi - lo) * (bottom - top))
                      for x, y in zip(t, ys) if y == y]
            if len(points) > 1:
                draw.line(points, fill=colour, width=2)
            draw.text((right - 140, top + 5 + 14 * k), name, fill=colour)
    image.save(path)


def make_inputs(tmp: Path):
    import numpy as np
    import rasterio

    from tests.chat.conftest import clear_samples, synthetic_shapes

    images = []
    for image, _ in clear_samples(synthetic_shapes(), 6, first_seed=7000):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        images.append("data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode())
    scene = tmp / "scene.tif"
    data = (np.random.default_rng(0).random((6, 512, 512)) * 3000).astype("uint16")
    with rasterio.open(scene, "w", driver="GTiff", height=512, width=512, count=6, dtype="uint16",
                       crs="EPSG:32615", transform=rasterio.Affine(30, 0, 0, 0, -30, 0)) as dst:
        dst.write(data)
    return images, base64.b64encode(scene.read_bytes()).decode()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--load", type=float, default=0.8, help="fraction of the measured capacity")
    ap.add_argument("--probe-s", type=float, default=60)
    ap.add_argument("--window-s", type=float, default=60)
    ap.add_argument("--max-queued", type=int, default=256, help="server.limits.max_queued_requests (its default)")
    ap.add_argument("--plot", default=str(REPO / "docs" / "reliability_soak.png"))
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        images, scene = make_inputs(Path(tmp))
        # the servers' own queue bound (the default), so that past capacity they refuse rather than queue
        bound = {"cwd": tmp, "max_queued": args.max_queued}
        with Server("pipeline=llava_chat", **bound) as chat, Server("pipeline=prithvi_flood", **bound) as pool:
            probe = Traffic(chat.base, pool.base, images, scene, seed=0)
            cap = asyncio.run(capacity(probe, args.probe_s))
            rate = args.load * cap
            print(f"capacity {cap:.2f} requests/s (16 clients, closed loop, {args.probe_s:.0f} s); "
                  f"soak at {rate:.2f} requests/s for {args.minutes:g} min")
            traffic = Traffic(chat.base, pool.base, images, scene, seed=1)
            seconds = args.minutes * 60
            start, rss = asyncio.run(soak(traffic, rate, seconds, args.window_s, [chat, pool]))
    rows = windows(traffic.samples, start, rss, args.window_s, seconds)
    print(f"\n{'t (s)':>6s} {'reqs':>5s} {'429':>5s} {'errors':>6s} {'chat p50':>9s} {'chat p99':>9s} "
          f"{'pool p50':>9s} {'pool p99':>9s} {'chat held':>9s} {'pool held':>9s} {'chat RSS MiB':>12s} "
          f"{'pool RSS MiB':>12s}")
    for r in rows:
        print(f"{r['t']:6.0f} {r['requests']:5d} {r['refused']:5d} {r['errors']:6d} {r['chat_p50']:9.3f} "
              f"{r['chat_p99']:9.3f} {r['pool_p50']:9.3f} {r['pool_p99']:9.3f} {r['chat_held']:9.0f} "
              f"{r['pool_held']:9.0f} {r['chat_rss'] / 2 ** 20:12.1f} {r['pool_rss'] / 2 ** 20:12.1f}")
    if len(rows) >= 3:
        first, last = rows[1], rows[-1]  # the first window includes warm-up
        drift = {k: last[k] - first[k] for k in ("chat_p99", "pool_p99", "chat_rss", "pool_rss")}
        print(f"\ndrift (last window - second window): chat p99 {drift['chat_p99']:+.3f} s, pool p99 "
              f"{drift['pool_p99']:+.3f} s, chat RSS {drift['chat_rss'] / 2 ** 20:+.1f} MiB, pool RSS "
              f"{drift['pool_rss'] / 2 ** 20:+.1f} MiB")
    total = len(traffic.samples)
    print(f"requests {total}, refused (429) {sum(s[3] == 'refused' for s in traffic.samples)}, errors "
          f"{sum(s[3] == 'error' for s in traffic.samples)}, median latency of answered requests "
          f"{statistics.median(s[2] for s in traffic.samples if s[3] == 'ok'):.3f} s")
    for (kind, what), count in traffic.failures.most_common():
        print(f"  error: {kind} {what} x{count}")
    plot(rows, Path(args.plot))
    print(f"plot: {args.plot}\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
