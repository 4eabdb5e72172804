"""The quicklook's legend: a band under the picture with a swatch and a name per class, and nodata.

Class 0 (background, "land") is not painted in the quicklook, so its swatch is an empty frame: "as the
picture". Entries wrap into rows when the picture is narrower than they are.
"""
from typing import List, Optional, Sequence, Tuple

from PIL import Image, ImageDraw, ImageFont

Colour = Tuple[int, int, int]
SWATCH, GAP, PAD, ROW = 12, 4, 6, 18  # pixels
BACKGROUND, INK = (255, 255, 255), (0, 0, 0)


def legend_entries(class_names: Sequence[str], colours: Sequence[Colour],
                   nodata: Colour) -> List[Tuple[str, Optional[Colour]]]:
    """(name, swatch colour) per class, None for the unpainted class 0; nodata last."""
    return [(name, None if i == 0 else _rgb(colours[i])) for i, name in enumerate(class_names)] + [("nodata", nodata)]


def _rgb(colour: Colour) -> Colour:
    red, green, blue = colour  # a tuple, whatever sequence the colour came as
    return red, green, blue


def with_legend(picture: Image.Image, entries: Sequence[Tuple[str, Optional[Colour]]]) -> Image.Image:
    """`picture` with the legend band below it (as wide as the picture, or the widest entry)."""
    font = ImageFont.load_default()
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    widths = [SWATCH + GAP + round(measure.textlength(name, font=font)) + PAD for name, _ in entries]
    width = max(picture.width, max(widths) + PAD)
    places, x, y = [], PAD, PAD
    for entry_width in widths:  # wrap
        if x > PAD and x + entry_width > width:
            x, y = PAD, y + ROW
        places.append((x, y))
        x += entry_width
    out = Image.new("RGB", (width, picture.height + y + ROW + PAD // 2), BACKGROUND)
    out.paste(picture, (0, 0))
    draw = ImageDraw.Draw(out)
    for (name, colour), (x, y) in zip(entries, places):
        top = picture.height + y
        box = (x, top, x + SWATCH - 1, top + SWATCH - 1)
        draw.rectangle(box, fill=colour, outline=INK if colour is None else colour)
        left, upper, _, lower = draw.textbbox((0, 0), name, font=font)  # centred on the swatch
        draw.text((x + SWATCH + GAP - left, top + (SWATCH - (lower - upper)) // 2 - upper), name, fill=INK, font=font)
    return out
