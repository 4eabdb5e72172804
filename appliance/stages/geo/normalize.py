"""`normalize`: reflectance `pixels` -> model input `tensor`, (x - mean) / std per band ([C, S, S], or
[C, T, S, S] for a multi-date scene: the same means and stds for every date).

Works in place on the tile's array and drops `pixels` from the record (the tensor shares its
memory), so a tile costs one float32 array however many stages it passes.
"""
from dataclasses import dataclass, replace
from typing import List, Optional

import numpy as np
import torch

from appliance.errors import ConfigError
from appliance.pipeline import Record, ResolvedOptions, Stage, register_stage
from appliance.stages.geo.raster_read import geo_contract


@dataclass
class NormalizeOptions:
    means: Optional[List[float]] = None  # None: model.geo.means (reflectance units, after scale)
    stds: Optional[List[float]] = None  # None: model.geo.stds


@register_stage
class Normalize(Stage):
    name = "normalize"
    consumes = ("pixels",)
    produces = ("tensor",)
    Options = NormalizeOptions

    def __init__(self, options, cfg):
        super().__init__(options, cfg)
        geo = geo_contract(cfg, self.name)
        means, stds = list(self.options.means), list(self.options.stds)
        bands = len(geo.bands)
        if len(means) != bands or len(stds) != bands:
            raise ConfigError(
                f"{self.name}: {len(means)} means and {len(stds)} stds for {bands} bands ({', '.join(geo.bands)})"
            )
        if any(s <= 0 for s in stds):
            raise ConfigError(f"{self.name}.stds: must all be > 0 (got {stds})")
        self.means = np.asarray(means, dtype=np.float32)[:, None, None]
        self.stds = np.asarray(stds, dtype=np.float32)[:, None, None]

    @classmethod
    def resolve_options(cls, options: NormalizeOptions, cfg) -> ResolvedOptions:
        """means and stds from model.geo when unset."""
        geo = geo_contract(cfg, cls.name)
        unset = [name for name in ("means", "stds") if getattr(options, name) is None]
        values = {name: list(geo[name]) for name in unset}
        return ResolvedOptions(replace(options, **values), {name: f"model.geo.{name}" for name in unset})

    def map(self, record: Record) -> Record:
        out = dict(record)
        pixels = out.pop("pixels")
        channels = (slice(None),) + (None,) * (pixels.ndim - 3)  # and a date axis
        pixels -= self.means[channels]
        pixels /= self.stds[channels]
        out["tensor"] = torch.from_numpy(pixels)
        return out
