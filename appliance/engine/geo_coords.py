"""Per-item coordinates for pool models with time and location encodings (Prithvi-EO-2.0 TL models).

A `GeoCoords` travels with a pool request and holds for all its items (the tiles of one scene share
their scene's). Items batched together must carry the same kind of coordinates (`coords_kind`), so
that `batch_coords` can stack them into the keyword arguments the model's forward takes.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

COORDS_FIELD = "coords"  # the pool record field holding its item's GeoCoords, when it has any


@dataclass(frozen=True)
class GeoCoords:
    temporal: Optional[torch.Tensor] = None  # [T, 2] float32: (year, day of year) of each of T frames
    location: Optional[torch.Tensor] = None  # [2] float32: (lat, lon) in degrees, latitude first


def coords_kind(coords: Optional[GeoCoords]) -> Optional[Tuple]:
    """What a batch must agree on: the frames of the time coordinates and whether a location is given."""
    if coords is None or (coords.temporal is None and coords.location is None):
        return None
    frames = None if coords.temporal is None else tuple(coords.temporal.shape)
    return frames, coords.location is not None


def batch_coords(coords: Sequence[Optional[GeoCoords]], device) -> Dict[str, torch.Tensor]:
    """`temporal_coords` [B, T, 2] and `location_coords` [B, 2] for a batch of one `coords_kind`; none
    of them when the items carry none (the model then runs as it does without coordinates)."""
    kind = coords_kind(coords[0])
    if kind is None:
        return {}
    frames, located = kind
    kwargs = {}
    if frames is not None:
        kwargs["temporal_coords"] = _stacked([None if c is None else c.temporal for c in coords], "temporal")
    if located:
        kwargs["location_coords"] = _stacked([None if c is None else c.location for c in coords], "location")
    return {name: value.to(device) for name, value in kwargs.items()}


def _stacked(parts: List[Optional[torch.Tensor]], what: str) -> torch.Tensor:
    present = [p for p in parts if p is not None]
    if len(present) != len(parts):
        raise ValueError(f"a batch mixes items with and without {what} coordinates; batch one coords_kind")
    return torch.stack(present)
