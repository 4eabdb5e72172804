"""Test helpers for HLS-like inputs: per-band COGs cut from a synthetic scene, a STAC item listing them,
and a loopback HTTP server (127.0.0.1, an ephemeral port) that answers range requests and counts the
bytes it sends."""
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import rasterio
import rasterio.shutil

# HLS S30 asset keys and the eo:bands common names STAC catalogs give them, in the model's order.
HLS_BANDS = [("B02", "blue"), ("B03", "green"), ("B04", "red"), ("B8A", "nir08"), ("B11", "swir16"),
             ("B12", "swir22")]
STAC_BANDS = [common for _, common in HLS_BANDS]


def split_bands(scene: Path, directory: Path, prefix="HLS.S30.T15RYP.2024100T165849.v2.0", cog=True,
                block=256) -> list:
    """One single-band file per band of `scene` (COG, or a striped plain GeoTIFF): the paths, in order."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    with rasterio.open(scene) as src:
        for band, (key, _) in enumerate(HLS_BANDS, 1):
            profile = dict(driver="GTiff", width=src.width, height=src.height, count=1, dtype=src.dtypes[0],
                           crs=src.crs, transform=src.transform, nodata=src.nodata)
            path = directory / f"{prefix}.{key}.tif"
            data = src.read(band)
            if cog:
                draft = directory / f".{key}.draft.tif"
                with rasterio.open(draft, "w", **profile) as dst:
                    dst.write(data, 1)
                rasterio.shutil.copy(draft, path, driver="COG", COMPRESS="DEFLATE", BLOCKSIZE=block)
                draft.unlink()
            else:
                with rasterio.open(path, "w", **profile) as dst:  # striped, not tiled: not a COG
                    dst.write(data, 1)
            paths.append(path)
    return paths


def stac_item(path: Path, hrefs: list, bands=HLS_BANDS, datetime="2024-04-09T16:58:49Z") -> Path:
    """A STAC item (1.0, eo:bands) with one asset per band at `hrefs` (relative or absolute)."""
    assets = {key: {"href": str(href), "type": "image/tiff; application=geotiff; profile=cloud-optimized",
                    "roles": ["data"], "eo:bands": [{"name": key, "common_name": common}]}
              for (key, common), href in zip(bands, hrefs)}
    assets["Fmask"] = {"href": "Fmask.tif", "type": "image/tiff", "roles": ["data"]}
    item = {"type": "Feature", "stac_version": "1.0.0", "id": path.stem,
            "stac_extensions": ["https://stac-extensions.github.io/eo/v1.1.0/schema.json"],
            "geometry": None, "properties": {"datetime": datetime}, "links": [], "assets": assets}
    path.write_text(json.dumps(item))
    return path


class RangeServer:
    """Serves `root` over HTTP on 127.0.0.1 with Range support. `sent` counts body bytes per file name,
    `requests` the GETs answered, `heads` the HEADs and `connections` the TCP connections accepted;
    `redirects` maps a path to a Location to answer 302 with; `ranges=False` ignores Range headers;
    each request waits for `before_answer()` to return (a test can hold the answers back)."""

    def __init__(self, root: Path, ranges=True, before_answer=lambda: None):
        self.root, self.ranges, self.before_answer = Path(root), ranges, before_answer
        self.sent, self.redirects, self.lock = {}, {}, threading.Lock()
        self.requests = self.heads = self.connections = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as object stores and web servers do
            disable_nagle_algorithm = True  # TCP_NODELAY, as nginx and object stores: no 40 ms delayed-ACK stalls

            def log_message(self, *args):
                pass

            def setup(self):  # once per connection: a kept-alive connection serves many requests
                super().setup()
                with server.lock:
                    server.connections += 1

            def do_HEAD(self):
                with server.lock:
                    server.heads += 1
                self.answer(body=False)

            def do_GET(self):
                self.answer(body=True)

            def answer(self, body):
                server.before_answer()
                name = self.path.split("?", 1)[0].lstrip("/")
                if "/" + name in server.redirects:
                    self.send_response(302)
                    self.send_header("Location", server.redirects["/" + name])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                path = server.root / name
                if not path.is_file():
                    self.send_error(404)
                    return
                size = path.stat().st_size
                start, end, status = 0, size - 1, 200
                spec = self.headers.get("Range")
                if spec and server.ranges and spec.startswith("bytes="):
                    first, _, last = spec[6:].split(",")[0].partition("-")
                    start, end = int(first), min(int(last) if last else size - 1, size - 1)
                    status = 206
                self.send_response(status)
                self.send_header("Content-Length", str(end - start + 1))
                self.send_header("Accept-Ranges", "bytes" if server.ranges else "none")
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                self.end_headers()
                if body:
                    with open(path, "rb") as f:  # only the range: a benchmark must not time the server
                        f.seek(start)
                        self.wfile.write(f.read(end - start + 1))
                    with server.lock:
                        server.sent[name] = server.sent.get(name, 0) + end - start + 1
                        server.requests += 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()

    def total_sent(self) -> int:
        with self.lock:
            return sum(self.sent.values())


def file_sizes(paths) -> int:
    return sum(os.path.getsize(p) for p in paths)


def masks_equal(a, b) -> bool:
    with rasterio.open(a) as x, rasterio.open(b) as y:
        return x.transform == y.transform and x.crs == y.crs and np.array_equal(x.read(), y.read())
