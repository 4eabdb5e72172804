"""What a TIFF holds, read from its first image directory without decoding it: enough to say why a file
Pillow cannot open as a picture (a 6-band int16 GeoTIFF, say) is refused."""
import struct
from typing import Optional, Tuple

SAMPLES_PER_PIXEL, BITS_PER_SAMPLE = 277, 258
SHORT, LONG = 3, 4


def tiff_layout(data: bytes) -> Optional[Tuple[int, int]]:
    """(samples per pixel, bits of the first sample), or None when `data` is no TIFF or is cut short.
    Classic TIFF and BigTIFF; a directory without the tags takes TIFF's defaults (1 sample of 1 bit)."""
    order = {b"II": "<", b"MM": ">"}.get(data[:2])
    if order is None or len(data) < 16:
        return None
    magic = struct.unpack_from(order + "H", data, 2)[0]
    if magic == 42:
        offset_format, count_format, entry_size, value_at = "I", "H", 12, 8
        offset = struct.unpack_from(order + "I", data, 4)[0]
    elif magic == 43:
        offset_format, count_format, entry_size, value_at = "Q", "Q", 20, 12
        offset = struct.unpack_from(order + "Q", data, 8)[0]
    else:
        return None
    try:
        (entries,) = struct.unpack_from(order + count_format, data, offset)
        start = offset + struct.calcsize(count_format)
        found = {}
        for i in range(entries):
            at = start + i * entry_size
            tag, kind = struct.unpack_from(order + "HH", data, at)
            if tag in (SAMPLES_PER_PIXEL, BITS_PER_SAMPLE) and kind in (SHORT, LONG):
                (count,) = struct.unpack_from(order + offset_format, data, at + 4)
                value_size = 2 if kind == SHORT else 4
                inline = count * value_size <= struct.calcsize(offset_format)
                where = at + value_at if inline else struct.unpack_from(order + offset_format, data, at + value_at)[0]
                found[tag] = struct.unpack_from(order + ("H" if kind == SHORT else "I"), data, where)[0]
    except struct.error:
        return None
    return found.get(SAMPLES_PER_PIXEL, 1), found.get(BITS_PER_SAMPLE, 1)
