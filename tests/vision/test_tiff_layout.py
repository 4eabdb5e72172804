"""A TIFF Pillow cannot open as a picture is refused saying what it holds and what the model takes."""
import io
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from appliance.config.schema import ServerLimits
from appliance.errors import InputError
from appliance.vision.image_load import decode_image
from appliance.vision.tiff_layout import tiff_layout

PIXELS = ServerLimits().max_image_pixels
SAMPLE = Path(__file__).resolve().parents[2] / "appliance" / "assets" / "samples" / "flood_sample.tif"


def _geotiff(tmp_path, bands, dtype, bigtiff="NO"):
    import rasterio

    path = tmp_path / "scene.tif"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # not georeferenced: no matter here
        with rasterio.open(path, "w", driver="GTiff", width=8, height=8, count=bands, dtype=dtype,
                           BIGTIFF=bigtiff) as out:
            out.write(np.zeros((bands, 8, 8), dtype))
    return path.read_bytes()


@pytest.mark.parametrize("bands, dtype, bigtiff, layout", [
    (6, "int16", "NO", (6, 16)), (6, "uint16", "YES", (6, 16)), (3, "uint8", "NO", (3, 8)),
    (2, "float32", "NO", (2, 32)),
])
def test_layout_of_classic_and_big_tiffs(tmp_path, bands, dtype, bigtiff, layout):
    assert tiff_layout(_geotiff(tmp_path, bands, dtype, bigtiff)) == layout


@pytest.mark.parametrize("mode, layout", [("RGB", (3, 8)), ("L", (1, 8)), ("RGBA", (4, 8))])
def test_layout_of_pillow_tiffs(mode, layout):
    data = io.BytesIO()
    Image.new(mode, (4, 4)).save(data, format="TIFF")
    assert tiff_layout(data.getvalue()) == layout


@pytest.mark.parametrize("data", [b"", b"\x89PNG\r\n\x1a\n" + b"\0" * 16, b"II*\0" + b"\0" * 20, b"MM\0*\0\0\0\xff"])
def test_no_layout_for_what_is_no_readable_tiff(data):
    assert tiff_layout(data) is None


def test_the_bundled_six_band_scene_sent_to_a_chat_model_says_why_it_is_refused():
    with pytest.raises(InputError) as caught:
        decode_image(SAMPLE.read_bytes(), field="input", max_image_pixels=PIXELS)
    message = str(caught.value)
    assert message.startswith("input: a TIFF with 6 bands of 16-bit samples")
    assert "takes RGB or greyscale images" in message and "prithvi_flood" in message
    assert "\n" not in message


def test_a_file_that_is_no_image_keeps_the_list_of_formats():
    with pytest.raises(InputError, match="input: not an image Pillow can read; send PNG, JPEG"):
        decode_image(b"hello", field="input", max_image_pixels=PIXELS)
