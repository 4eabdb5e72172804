"""Band selection rule: table-driven, pure."""
import pytest

from appliance.errors import InputError
from appliance.stages.geo.band_headers import select_bands

MODEL = ["BLUE", "GREEN", "RED", "NIR_NARROW", "SWIR_1", "SWIR_2"]
NAMED = ("BLUE", "GREEN", "RED", "NIR_NARROW", "SWIR_1", "SWIR_2")
UNNAMED = (None,) * 6


@pytest.mark.parametrize(
    "requested, descriptions, expected",
    [
        (None, NAMED, [1, 2, 3, 4, 5, 6]),  # names match the model
        (None, NAMED[::-1], [6, 5, 4, 3, 2, 1]),  # reordered by name
        (None, ("COASTAL",) + NAMED, [2, 3, 4, 5, 6, 7]),  # extra band ignored by name
        (None, UNNAMED, [1, 2, 3, 4, 5, 6]),  # no names, the model's band count: all bands in order
        (["blue", "green", "red", "nir narrow", "swir1", "swir-2"], NAMED, [1, 2, 3, 4, 5, 6]),  # case/punctuation
        (["1", "2", "3", "4", "5", "6"], UNNAMED, [1, 2, 3, 4, 5, 6]),
        ([6, 5, 4, 3, 2, 1], NAMED, [6, 5, 4, 3, 2, 1]),
        (["2", "GREEN", "3", "4", "5", "6"], NAMED, [2, 2, 3, 4, 5, 6]),  # repeats are the user's call
        (None, (None,) * 4, "has 4 bands but the model expects 6 (BLUE, GREEN, RED, NIR_NARROW, SWIR_1, SWIR_2)"),
        (None, ("A", "B", "C", "D", "E", "F", "G"), "bands: 1:A, 2:B"),
        (["Blue", "Green", "Red", "NIR", "SWIR_1", "SWIR_2"], NAMED,
         "has no band named NIR (available: 1:BLUE, 2:GREEN"),
        (["B02", "B03"], NAMED, "has no band named B02, B03"),
        (["7"], NAMED, "has no band 7: band indexes are 1..6"),
        (["0"], NAMED, "has no band 0"),
        (["1", "2"], NAMED, "2 bands selected but the model expects 6"),
    ],
)
def test_select_bands(requested, descriptions, expected):
    if isinstance(expected, list):
        assert select_bands(requested, descriptions, MODEL) == expected
    else:
        with pytest.raises(InputError) as info:
            select_bands(requested, descriptions, MODEL)
        assert expected in str(info.value)
