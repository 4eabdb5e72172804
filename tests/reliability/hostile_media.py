"""Hostile media for the reliability tests: bytes that are not what they claim, and an HTTP host that
misbehaves on purpose (stalls, redirects to private addresses, answers HTML)."""
import base64
import http.server
import io
import struct
import threading
import zlib

import numpy as np
from PIL import Image


def png(width=8, height=8, colour=(200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buffer, format="JPEG")
    return buffer.getvalue()


def animated_gif() -> bytes:
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 255, 0))]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:])
    return buffer.getvalue()


def bomb_png(side=20000) -> bytes:
    """A valid PNG header and zlib stream for side x side grey pixels: ~400 MB decoded, a few hundred KB sent."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = zlib.compress(b"\x00" * (side + 1) * side, 9)
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"><rect width="8" height="8"/></svg>'
HTML = b"<!doctype html><html><body>not an image</body></html>"


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def tiff_header_only(samples_per_pixel=0, width=8, height=8) -> bytes:
    """A TIFF whose header says `samples_per_pixel` bands (GDAL cannot write a 0-band file)."""
    tags = [(256, 3, 1, width), (257, 3, 1, height), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
            (273, 4, 1, 0), (277, 3, 1, samples_per_pixel), (278, 3, 1, height), (279, 4, 1, 0)]
    ifd = struct.pack("<H", len(tags)) + b"".join(struct.pack("<HHII", *t) for t in tags) + struct.pack("<I", 0)
    return b"II*\x00" + struct.pack("<I", 8) + ifd


def geotiff(height, width, bands=6) -> bytes:
    import rasterio
    from rasterio.io import MemoryFile

    data = np.full((bands, height, width), 300, np.uint16)
    with MemoryFile() as memory:
        with memory.open(driver="GTiff", height=height, width=width, count=bands, dtype="uint16",
                         crs="EPSG:32615", transform=rasterio.Affine(30, 0, 0, 0, -30, 0)) as dst:
            dst.write(data)
        return memory.read()


class HostileHost:
    """127.0.0.1 HTTP host: /ok.png, /slow.png (stalls past any fetch timeout), /private (302 to
    10.1.2.3), /metadata (302 to 169.254.169.254), /html, /loop (redirects to itself)."""

    def __init__(self):
        self.stop = threading.Event()
        stop = self.stop

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/slow.png":
                    stop.wait(30)
                    return self._send(200, png(), "image/png")
                if self.path in ("/private", "/metadata", "/loop"):
                    target = {"/private": "http://10.1.2.3/x.png", "/metadata": "http://169.254.169.254/latest",
                              "/loop": self.path}[self.path]
                    self.send_response(302)
                    self.send_header("Location", target)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                if self.path == "/html":
                    return self._send(200, HTML, "text/html")
                return self._send(200, png(), "image/png")

            def _send(self, status, body, kind):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.stop.set()
        self.httpd.shutdown()
