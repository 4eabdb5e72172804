"""Class colours (RGB 0..255): the mask's colour table and `class_colours` tag, the quicklook, the STAC
item's classes and the scene report's palette all take them from here.

A model declares one colour per class in `model.geo.class_colours`, beside `class_names`; a model that
declares none gets DEFAULT_CLASS_COLOURS (class i: entry i modulo its length).
"""
from typing import List, Optional, Sequence, Tuple

from appliance.errors import ConfigError

Colour = Tuple[int, int, int]
DEFAULT_CLASS_COLOURS: Tuple[Colour, ...] = ((200, 200, 200), (0, 90, 255), (230, 60, 40), (40, 170, 60),
                                             (250, 200, 0))
NODATA_GREY: Colour = (60, 60, 60)
COLOURS_KEY = "model.geo.class_colours"


def default_colours(count: int) -> List[Colour]:
    return [DEFAULT_CLASS_COLOURS[i % len(DEFAULT_CLASS_COLOURS)] for i in range(count)]


def checked_colours(colours: Sequence, class_names: Sequence[str], key: str = COLOURS_KEY) -> List[Colour]:
    """`colours` as RGB tuples, one per class name; else a ConfigError naming `key`."""
    if len(colours) != len(class_names):
        raise ConfigError(f"{key}: {len(colours)} colour{'s' * (len(colours) != 1)} for {len(class_names)} classes "
                          f"({', '.join(class_names)}); give one [R, G, B] per class, in order "
                          "(or null for the defaults)")
    out = []
    for name, colour in zip(class_names, colours):
        values = list(colour) if isinstance(colour, Sequence) and not isinstance(colour, str) else None
        if (values is None or len(values) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255 for v in values)):
            raise ConfigError(f"{key}: {name}'s colour {_shown(colour)} is not an [R, G, B] of three integers 0..255")
        out.append(tuple(values))
    return out


def model_colours(geo, class_names: Sequence[str], names_key: str) -> List[Colour]:
    """The colours of `class_names`: `geo.class_colours` (checked against them) when the model declares
    some, else the defaults. `names_key` names where the names came from, for the error."""
    declared = geo.get("class_colours") if geo is not None else None
    if declared is None:
        return default_colours(len(class_names))
    if len(declared) != len(class_names) and names_key != "model.geo.class_names":
        raise ConfigError(f"{names_key}: {len(class_names)} class names but {COLOURS_KEY} has {len(declared)} "
                          f"colours; set {COLOURS_KEY} to one [R, G, B] per name (or null for the defaults)")
    return checked_colours(list(declared), class_names)


def colours_tag(colours: Sequence[Colour]) -> str:
    """`#C8C8C8,#005AFF`: the mask's `class_colours` tag (float masks have no colour table)."""
    return ",".join("#%02X%02X%02X" % tuple(c) for c in colours)


def parse_colours_tag(text: Optional[str], count: int) -> List[Colour]:
    """The colours in a mask's `class_colours` tag; the defaults when it has none or it does not fit."""
    parts = text.split(",") if text else []
    try:
        colours = [_hex_colour(p) for p in parts]
    except ValueError:
        colours = []
    return colours if len(colours) == count and all(len(p.strip()) == 7 for p in parts) else default_colours(count)


def _hex_colour(text: str) -> Colour:
    """`#0B1621` -> (11, 22, 33); ValueError when the digits are not hex."""
    text = text.strip()
    return int(text[1:3], 16), int(text[3:5], 16), int(text[5:7], 16)


def _shown(value) -> str:
    try:
        return str(list(value)) if not isinstance(value, (str, int, float)) else repr(value)
    except TypeError:
        return repr(value)
