#!/usr/bin/env python
"""Geo I/O: a scene's time reading per-band COGs over loopback HTTP against the same files on disk, and
the cost of writing the mask as a COG against the plain tiled GeoTIFF.

    python benchmarks/geo_io.py              # a 2048^2 HLS-like scene, 256-pixel COG blocks, 3 rounds
    python benchmarks/geo_io.py --quick      # a smoke run: 512^2, 1 round
    python benchmarks/geo_io.py --side 3660 --rounds 5   # one HLS tile's size

The model is the tests' fake-logits stage (tests/geo/fake_engine.py: cheap numpy), so the times are
the pipeline's reading, tiling, stitching and writing, which is what the input and output formats
change. Cases, interleaved per round (best and median reported):
- local bands:  `input=[[B02.tif, ...]]`, six single-band COGs on disk;
- http item:    `input=http://127.0.0.1:PORT/item.json`, the same COGs from a loopback server that
                answers range requests (tests/geo/hls.py, in a child process; a fresh port each
                round, so GDAL's /vsicurl/ cache starts cold); goal: <= 1.2x local bands;
- served item:  the same item read the way `appliance serve`'s /pooling reads it: the SSRF-safe
                fetcher's range GETs over the request's kept-alive connections
                (stages/geo/served_scenes.py), the online stages fed the record the pool worker builds;
- local multi:  the same bands as one 6-band file (today's input);
- gtiff write:  local bands, raster_write.format=gtiff (no COG pass);
and the COG pass alone: GDAL's COG driver copying the finished draft (`cog.translate_to_cog`).
Loopback HTTP has no network latency: it measures GDAL's request overhead, not a WAN's. The server
answers with TCP_NODELAY, as web servers and object stores do: without it, Nagle's algorithm against
the client's delayed ACKs stalled responses by up to 40 ms, which the HTTP case once measured as 1.6x
local files with the very same 199 GETs (1.13x with it, 2048², on a busy host).
"""
import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from appliance.fetch import FetchPolicy
from appliance.pipeline import Pipeline
from appliance.serving.engine_process.records import SceneRecord, as_record
from appliance.stages.build import build_pipeline
from appliance.stages.geo.cog import translate_to_cog
from appliance.stages.geo.served_scenes import served_scene_spec
from tests.geo.conftest import GEO, make_cfg, synthetic  # registers the fake engine
from tests.geo.hls import file_sizes, split_bands, stac_item


SERVER = """
import sys
sys.path.insert(0, sys.argv[1])
from tests.geo.hls import RangeServer
with RangeServer(sys.argv[2]) as server:
    print(server.url, flush=True)
    sys.stdin.read()  # until the benchmark closes our stdin
    print(server.total_sent(), server.requests, server.heads, server.connections, flush=True)
"""


@contextlib.contextmanager
def http_server(root: Path):
    """The loopback range server in its own process (in ours it would share the GIL with the pipeline):
    yields (url, a list that receives (bytes sent, GETs, HEADs, connections) once it stops)."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(REPO), str(root)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    sent = []
    try:
        yield proc.stdout.readline().strip(), sent
    finally:
        proc.stdin.close()
        sent.append(tuple(int(v) for v in (proc.stdout.readline().split() or [0, 0, 0, 0])))
        proc.wait(timeout=30)


def run(input_value, output: Path, write=None) -> float:
    pipeline = build_pipeline(make_cfg(tile_size=512, overlap=64, write=write))
    pipeline.setup()
    start = time.perf_counter()
    try:
        for _ in pipeline.run([{"input": input_value, "output": str(output), "overwrite": True}]):
            pass
    finally:
        pipeline.close()
    return time.perf_counter() - start


def run_served(item_url: str, output: Path) -> float:
    """The item as /pooling reads it (pool_worker: served_scene_spec, then the stages after raster_inputs)."""
    pipeline = build_pipeline(make_cfg(tile_size=512, overlap=64))
    pipeline.setup()
    policy = FetchPolicy(allowed_domains=("127.0.0.1",), max_bytes=1 << 30)
    start = time.perf_counter()
    spec = served_scene_spec(item_url, OmegaConf.create(GEO), policy, "data.data", [])
    online = Pipeline(pipeline.stages[1:], ready=True)  # what follows raster_inputs
    try:
        for _ in online.run([as_record(SceneRecord(spec, str(output), False, None))]):
            pass
    finally:
        spec.fetch.close()
        pipeline.close()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--side", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--block", type=int, default=256, help="COG block size of the input bands")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.side, args.rounds = 512, 1
    tmp = Path(tempfile.mkdtemp(prefix="geo_io."))
    scene = tmp / "scene.tif"
    synthetic.write_scene(scene, args.side, args.side, seed=7)
    files = split_bands(scene, tmp / "hls", block=args.block)
    stac_item(tmp / "hls" / "item.json", [f.name for f in files])
    bands = [[str(f) for f in files]]
    times = {name: [] for name in ("local bands", "http item", "served item", "local multi", "gtiff write",
                                   "COG pass alone")}
    fetched = {"http item": [], "served item": []}
    for _ in range(args.rounds):
        times["local bands"].append(run(bands, tmp / "out" / "local.tif"))
        with http_server(tmp / "hls") as (url, sent):
            times["http item"].append(run(f"{url}/item.json", tmp / "out" / "http.tif"))
        fetched["http item"] += sent
        with http_server(tmp / "hls") as (url, sent):
            times["served item"].append(run_served(f"{url}/item.json", tmp / "out" / "served.tif"))
        fetched["served item"] += sent
        times["local multi"].append(run(str(scene), tmp / "out" / "multi.tif"))
        times["gtiff write"].append(run(bands, tmp / "out" / "plain.tif", write={"format": "gtiff", "stac": False}))
        start = time.perf_counter()
        translate_to_cog(str(tmp / "out" / "plain.tif"), str(tmp / "out" / "again.tif"), 256, "MODE")
        times["COG pass alone"].append(time.perf_counter() - start)
    base = statistics.median(times["local bands"])
    print(f"scene {args.side}x{args.side}, 6 int16 bands ({file_sizes(files) / 1e6:.1f} MB of band files), "
          f"input blocks {args.block}, tile 512 overlap 64, {args.rounds} round(s); a round over HTTP:")
    for name, counts in fetched.items():
        median = [statistics.median(f[i] for f in counts) for i in range(4)]
        print(f"  {name}: {median[0] / 1e6:.1f} MB in {median[1]:.0f} GETs and {median[2]:.0f} HEADs "
              f"on {median[3]:.0f} connections")
    print(f"{'case':<16} {'best s':>8} {'median s':>9} {'x local bands':>14}")
    for name, values in times.items():
        print(f"{name:<16} {min(values):>8.3f} {statistics.median(values):>9.3f} "
              f"{statistics.median(values) / base:>14.2f}")


if __name__ == "__main__":
    main()
