"""Image loading: every bad input is an InputError naming the field; orientation and modes are normalised."""
import base64
import http.server
import os
import struct
import threading
import zlib

import numpy as np
import pytest
from PIL import Image

from appliance.config.schema import ServerConfig
from appliance.errors import InputError
from appliance.fetch import FetchPolicy
from appliance.vision.image_load import (content_hash, decode_data_url, decode_image, load_image, read_source,
                                         to_rgb)

from .helpers import encode, photo_like

LIMITS = ServerConfig().limits  # what a composed config gives
POLICY = FetchPolicy.from_server_config(ServerConfig())


def load(source, **kwargs):
    """`load_image` under the schema's server limits, any of them overridden."""
    return load_image(source, **{"max_bytes": LIMITS.max_media_bytes, "max_image_pixels": LIMITS.max_image_pixels,
                                 "fetch_policy": POLICY, **kwargs})


def decode(data, **kwargs):
    return decode_image(data, **{"max_image_pixels": LIMITS.max_image_pixels, **kwargs})


def read(source, **kwargs):
    return read_source(source, **{"max_bytes": LIMITS.max_media_bytes, "fetch_policy": POLICY, **kwargs})


def data_url(data, mime="image/png"):
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def fake_fetcher(body=None, error=None):
    calls = []

    def fetch(url, policy, field):
        calls.append((url, policy, field))
        if error is not None:
            raise error
        return body
    fetch.calls = calls
    return fetch


@pytest.fixture
def png():
    return encode(photo_like(40, 30))


# --- sources ---------------------------------------------------------------------------------

def test_same_picture_same_hash_from_every_source(png, tmp_path):
    (tmp_path / "a.png").write_bytes(png)
    fetch = fake_fetcher(png)
    policy = FetchPolicy(max_bytes=1 << 20, total_timeout_s=3)
    loaded = [
        load(png),
        load(data_url(png)),
        load("https://example.test/a.png", fetcher=fetch, fetch_policy=policy),
        load("a.png", allowed_dir=tmp_path),
        load(str(tmp_path / "a.png"), allowed_dir=tmp_path),
        load(f"file://{tmp_path}/a.png", allowed_dir=tmp_path),
    ]
    assert {im.content_hash for im in loaded} == {loaded[0].content_hash}
    assert loaded[0].size == (40, 30) and loaded[0].image.mode == "RGB"
    assert fetch.calls == [("https://example.test/a.png", policy, "image")]


def test_limits_have_no_defaults_of_their_own(png):
    """The limits come from the config (server.limits), never from a second copy here."""
    for call in (lambda: load_image(png, max_bytes=1 << 20, fetch_policy=POLICY),
                 lambda: load_image(png, max_image_pixels=10 ** 6, fetch_policy=POLICY),
                 lambda: load_image(png, max_bytes=1 << 20, max_image_pixels=10 ** 6),
                 lambda: decode_image(png), lambda: read_source(png, fetch_policy=POLICY)):
        with pytest.raises(TypeError, match="required keyword-only argument"):
            call()


def test_hash_changes_with_one_pixel_and_with_shape():
    a = Image.new("RGB", (2, 3), (10, 20, 30))
    b = a.copy()
    b.putpixel((1, 1), (10, 20, 31))
    assert content_hash(a) != content_hash(b)
    assert content_hash(a) != content_hash(Image.new("RGB", (3, 2), (10, 20, 30)))  # same bytes, other size
    assert content_hash(a) == content_hash(a.convert("RGBA"))  # opaque alpha: same picture


@pytest.mark.parametrize("source,fragment", [
    ("", "empty"),
    ("ftp://example.test/a.png", "unsupported URL scheme 'ftp'"),
    (b"", "0 bytes"),
    (b"hello, not an image", "not an image"),
    (12, "expected bytes or a string"),
])
def test_bad_sources(source, fragment):
    with pytest.raises(InputError, match=fragment) as e:
        load(source, allowed_dir="/tmp")
    assert str(e.value).startswith("image: ")


def test_field_name_is_in_the_message():
    with pytest.raises(InputError, match=r"^messages\[0\]\.content\[1\]\.image_url: "):
        load(b"junk", field="messages[0].content[1].image_url")


# --- data URLs -------------------------------------------------------------------------------

@pytest.mark.parametrize("url,fragment", [
    ("data:image/png;base64", "no ','"),
    ("data:text/plain;base64,aGVsbG8=", "mime type is 'text/plain'"),
    ("data:;base64,aGVsbG8=", "mime type is 'missing'"),
    ("data:image/png,rawbytes", "not base64-encoded"),
    ("data:image/png;base64,@@@notbase64!!", "not valid base64"),
    ("data:image/png;base64,", "0 bytes"),
])
def test_bad_data_urls(url, fragment):
    with pytest.raises(InputError, match=fragment):
        load(url)


def test_data_url_tolerates_whitespace_missing_padding_and_case(png):
    payload = base64.b64encode(png).decode().rstrip("=")
    wrapped = "\n".join(payload[i:i + 76] for i in range(0, len(payload), 76))
    assert load(f"DATA:Image/PNG;BASE64,{wrapped}").size == (40, 30)


def test_data_url_over_the_byte_limit_is_refused_before_decoding():
    with pytest.raises(InputError, match="limit is 1000 bytes"):
        decode_data_url(data_url(b"x" * 5000), max_bytes=1000)


# --- http(s) ---------------------------------------------------------------------------------

@pytest.mark.parametrize("error,fragment", [
    (TimeoutError("read timed out"), r"could not fetch the image from h\.test \(TimeoutError\)"),
    (ConnectionResetError("reset by peer"), r"could not fetch the image from h\.test \(ConnectionResetError\)"),
    (ValueError("https://h.test/x.png?token=SECRET"), r"\(ValueError\); the URL must be reachable"),
    (InputError("image: h.test answered HTTP 404; ..."), "^image: h.test answered HTTP 404"),  # passed through
])
def test_an_injected_fetchers_failures_become_input_errors(error, fragment):
    with pytest.raises(InputError, match=fragment) as e:
        load("https://user:pw@h.test/x.png?token=SECRET", fetcher=fake_fetcher(error=error))
    assert "SECRET" not in str(e.value) and "pw" not in str(e.value)


def test_fetched_body_over_the_limit_and_non_image(png):
    with pytest.raises(InputError, match="limit is 100 bytes"):
        load("http://h.test/a", fetcher=fake_fetcher(png), max_bytes=100)
    with pytest.raises(InputError, match="not an image"):
        load("http://h.test/a", fetcher=fake_fetcher(b"<html>404</html>"))
    with pytest.raises(InputError, match="0 bytes"):
        load("http://h.test/a", fetcher=fake_fetcher(b""))
    with pytest.raises(InputError, match="returned no bytes"):
        load("http://h.test/a", fetcher=fake_fetcher(None))


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):
        if self.path.startswith("/redirect-"):
            self.send_response(302)
            self.send_header("Location", {"/redirect-file": "file:///etc/passwd",
                                          "/redirect-ftp": "ftp://127.0.0.1/x.png"}[self.path])
            self.end_headers()
            return
        if self.path == "/slow":
            threading.Event().wait(2)
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def loopback_server(png):
    """A server on 127.0.0.1 (random port) for the default fetcher; no outside network."""
    _Handler.body = png
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_default_fetcher_is_the_safe_one(loopback_server, png):
    """Real fetches (the rule itself is tested in tests/fetch): loopback is refused unless allowed."""
    with pytest.raises(InputError, match=r"^image: host 127\.0\.0\.1:\d+ resolves to 127\.0\.0\.1, a loopback"):
        load(loopback_server + "/a.png")
    allowed = FetchPolicy(allowed_domains=("127.0.0.1",), max_bytes=1 << 20, total_timeout_s=LIMITS.fetch_timeout_s)
    assert load(loopback_server + "/a.png", fetch_policy=allowed).size == (40, 30)
    with pytest.raises(InputError, match="limit is 100 bytes"):
        load(loopback_server + "/a.png", fetch_policy=allowed, max_bytes=100)
    with pytest.raises(InputError, match="took longer than 0.3 s"):
        load(loopback_server + "/slow", fetch_policy=FetchPolicy(
            allowed_domains=("127.0.0.1",), max_bytes=1 << 20, total_timeout_s=0.3))
    for path, scheme in (("/redirect-file", "file:"), ("/redirect-ftp", "ftp:")):
        with pytest.raises(InputError, match=f"led to a {scheme} URL; only http:// and https://"):
            load(loopback_server + path, fetch_policy=allowed)


# --- local files -----------------------------------------------------------------------------

def test_local_paths_refused_without_an_allowed_dir(png, tmp_path):
    (tmp_path / "a.png").write_bytes(png)
    with pytest.raises(InputError, match="local paths are disabled"):
        load(str(tmp_path / "a.png"))


def test_local_path_escapes_are_refused(png, tmp_path):
    root, outside = tmp_path / "images", tmp_path / "secret"
    root.mkdir()
    outside.mkdir()
    (outside / "s.png").write_bytes(png)
    (root / "sub").mkdir()
    os.symlink(outside / "s.png", root / "link.png")
    os.symlink(outside, root / "sub" / "dirlink")
    for path in ["../secret/s.png", "sub/../../secret/s.png", str(outside / "s.png"), "link.png",
                 "sub/dirlink/s.png", "/etc/passwd"]:
        with pytest.raises(InputError, match="outside the allowed directory"):
            load(path, allowed_dir=root)
    # a prefix of the root's name is not inside it
    (tmp_path / "images2").mkdir()
    (tmp_path / "images2" / "x.png").write_bytes(png)
    with pytest.raises(InputError, match="outside"):
        load(str(tmp_path / "images2" / "x.png"), allowed_dir=root)


def test_local_symlink_inside_the_root_is_fine(png, tmp_path):
    (tmp_path / "a.png").write_bytes(png)
    os.symlink(tmp_path / "a.png", tmp_path / "b.png")
    assert load("b.png", allowed_dir=tmp_path).size == (40, 30)


def test_local_missing_directory_and_too_big(png, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "a.png").write_bytes(png)
    with pytest.raises(InputError, match="no such file"):
        load("nope.png", allowed_dir=tmp_path)
    with pytest.raises(InputError, match="is a directory"):
        load("d", allowed_dir=tmp_path)
    with pytest.raises(InputError, match="limit is 10 bytes"):
        read("a.png", allowed_dir=tmp_path, max_bytes=10)
    with pytest.raises(InputError, match="NUL"):
        load("a.png\0.jpg", allowed_dir=tmp_path)


# --- decoding --------------------------------------------------------------------------------

def _png_header_only(width, height):
    """A PNG whose header claims width x height, with one tiny (invalid) data chunk."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 10)) + \
        chunk(b"IEND", b"")


def test_pixel_limit_is_checked_from_the_header():
    with pytest.raises(InputError, match=f"10000x9000 = 90000000 pixels; the limit is {LIMITS.max_image_pixels}"):
        decode(_png_header_only(10000, 9000))
    with pytest.raises(InputError, match="pixels"):  # beyond Pillow's own bomb limit too
        decode(_png_header_only(30000, 30000))
    with pytest.raises(InputError, match="50x40 = 2000 pixels; the limit is 1000"):
        load(encode(photo_like(50, 40)), max_image_pixels=1000)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP"])
def test_truncated_images(fmt):
    data = encode(photo_like(64, 48), fmt)
    with pytest.raises(InputError, match="truncated or corrupt|not an image"):
        decode(data[: len(data) // 2])


def test_exif_orientation_is_applied():
    image = Image.new("RGB", (40, 20), (0, 0, 0))
    image.paste((255, 0, 0), (0, 0, 10, 10))  # red block top-left as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # stored image must be turned 90° clockwise to display
    loaded = decode(encode(image, "JPEG", exif=exif, quality=95))
    assert loaded.size == (20, 40)
    r, g, b = loaded.getpixel((15, 5))  # top-left moves to top-right
    assert r > 200 and g < 60 and b < 60
    assert loaded.getpixel((5, 35))[0] < 60


def _rgba_half_transparent():
    image = Image.new("RGBA", (4, 2), (255, 0, 0, 255))
    image.putpixel((0, 0), (0, 0, 255, 0))      # fully transparent blue → white
    image.putpixel((1, 0), (0, 0, 0, 128))      # half-transparent black → mid grey
    return image


def test_alpha_is_composited_on_white():
    rgb = decode(encode(_rgba_half_transparent()))
    assert rgb.mode == "RGB"
    assert rgb.getpixel((0, 0)) == (255, 255, 255)
    assert all(abs(v - 127) <= 1 for v in rgb.getpixel((1, 0)))
    assert rgb.getpixel((2, 0)) == (255, 0, 0)


@pytest.mark.parametrize("mode,fmt,expect", [
    ("LA", "PNG", (255, 255, 255)),
    ("L", "PNG", (200, 200, 200)),
    ("1", "PNG", (255, 255, 255)),
    ("CMYK", "JPEG", None),
    ("P", "PNG", None),
    ("P", "GIF", None),
])
def test_modes_convert_to_rgb(mode, fmt, expect):
    if mode == "LA":
        image = Image.new("LA", (8, 8), (0, 0))  # transparent
    elif mode in ("L", "1"):
        image = Image.new("L", (8, 8), 200).convert(mode)
    else:
        image = photo_like(8, 8).convert(mode)
    rgb = decode(encode(image, fmt))
    assert rgb.mode == "RGB" and rgb.size == (8, 8)
    if expect:
        assert rgb.getpixel((3, 3)) == expect


def test_palette_with_transparency_composites_on_white():
    image = Image.new("P", (4, 4), 0)
    image.putpalette([0, 0, 255] + [255, 0, 0] * 255)
    image.putpixel((1, 1), 1)
    image.info["transparency"] = 0
    rgb = decode(encode(image, "PNG", transparency=0))
    assert rgb.getpixel((0, 0)) == (255, 255, 255) and rgb.getpixel((1, 1)) == (255, 0, 0)


def test_16_bit_and_float_images_are_scaled_not_clipped():
    sixteen = Image.fromarray(np.full((4, 4), 32896, dtype=np.uint16))  # 0x8080 → 128
    assert decode(encode(sixteen, "PNG")).getpixel((0, 0)) == (128, 128, 128)
    as_int32 = Image.fromarray(np.full((4, 4), 65535, dtype=np.int32), mode="I")
    assert to_rgb(as_int32).getpixel((0, 0)) == (255, 255, 255)
    as_float = Image.fromarray(np.full((4, 4), 0.5, dtype=np.float32), mode="F")
    assert decode(encode(as_float, "TIFF")).getpixel((0, 0)) == (128, 128, 128)


def test_animated_images_are_refused_naming_the_frames():
    frames = [Image.new("RGB", (6, 6), c) for c in ((255, 0, 0), (0, 255, 0))]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    with pytest.raises(InputError, match="an animated GIF \\(2 frames\\)"):
        decode(data)
    assert decode(encode(frames[0], "GIF")).getpixel((2, 2)) == (255, 0, 0)  # one frame is fine


def test_a_data_url_whose_mime_type_lies_is_refused():
    jpeg = encode(Image.new("RGB", (4, 4), (1, 2, 3)), "JPEG")
    with pytest.raises(InputError, match="says image/png but the data is JPEG"):
        read(data_url(jpeg, "image/png"))
    assert read(data_url(jpeg, "image/jpeg")) == jpeg
    assert read(data_url(jpeg, "image/x-unknown")) == jpeg  # an undeclared kind: Pillow decides
