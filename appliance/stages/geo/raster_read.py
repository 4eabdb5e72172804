"""`raster_read`: validate each scene's header for the model and attach a `SceneInfo`.

Pixels are read later, one tile window at a time, by the `tile` stage (`window_reader.py`). `input_path` is a
`SceneSpec` (from `raster_inputs`) or a GeoTIFF path (a server request); a record's `aoi` / `aoi_crs`
cut the scene to an area of interest, and its `date` is the acquisition date when the source lacks one or
should be overridden. A model with time and location encodings (`model.prithvi.coords_encoding`) gets the
scene's coordinates as `scene.coords` (acquisition.py). A multi-date model's scene (multidate.py) is checked
date against date here; `resample` lets dates on another grid be warped onto the first date's.
"""
from dataclasses import dataclass, replace
from enum import Enum
from typing import Iterator, List, Optional

from appliance.errors import ConfigError
from appliance.pipeline import Record, Stage, register_stage
from appliance.stages.geo.acquisition import model_coords, model_encodings, parse_date
from appliance.stages.geo.aoi import Aoi, parse_aoi
from appliance.stages.geo.multidate import model_frames, parse_dates
from appliance.stages.geo.scene import inspect_scene


GEO_FIELDS = ("bands", "means", "stds", "scale", "class_names")


def geo_contract(cfg, stage: str, required: bool = True):
    """`cfg.model.geo`: the model's input contract. Missing: a ConfigError naming the stage that needs it,
    or None when not `required` (a stage that can do without)."""
    model = cfg.get("model") if cfg is not None else None
    geo = model.get("geo") if model is not None else None
    if geo is None and required:
        fields = ", ".join(f"model.geo.{name}" for name in GEO_FIELDS)
        raise ConfigError(f"{stage}: needs the model's geo contract ({fields}); model "
                          f"{model.get('name') if model is not None else None} has no `geo` block: choose a "
                          "geospatial model (conf/model/prithvi_*)")
    return geo


def record_aoi(record: Record):
    aoi = record.get("aoi")
    return aoi if isinstance(aoi, Aoi) or aoi is None else parse_aoi(aoi, record.get("aoi_crs"))


class Resample(str, Enum):
    """How a date on another grid is warped onto the first date's (rasterio's resampling methods)."""

    nearest = "nearest"
    bilinear = "bilinear"
    cubic = "cubic"
    average = "average"
    mode = "mode"


@dataclass
class RasterReadOptions:
    bands: Optional[List[str]] = None  # names (band descriptions) or 1-based indexes; None: model.geo.bands
    scale: Optional[float] = None  # DN -> reflectance; None: the file's scale tags, else model.geo.scale
    nodata: Optional[float] = None  # overrides the file's nodata value
    nodata_fill: float = 0.0  # reflectance the model sees at nodata pixels (Prithvi trained with 0)
    # Multi-date scenes: a date on another grid (CRS, transform, size) than the first is refused (null), or
    # warped onto the first date's grid as it is read with this method.
    resample: Optional[Resample] = None


@register_stage
class RasterRead(Stage):
    name = "raster_read"
    consumes = ("input_path",)
    produces = ("scene",)
    Options = RasterReadOptions

    def __init__(self, options, cfg):
        super().__init__(options, cfg)
        self.geo = geo_contract(cfg, self.name)
        self.encodings = model_encodings(cfg)
        self.frames = model_frames(cfg)
        self.stacked_order = str(self.geo.get("stacked_band_order") or "date_major").split(".")[-1]

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        # A record's own `bands` (a server request's band indexes) wins over the option.
        # Check every scene's header before the first tile is read: a bad third scene must not
        # surface after two masks were written. Records here are one per file, so buffering is cheap.
        pending = list(records)
        scenes = [
            inspect_scene(
                record["input_path"], record.get("scene_index", i), list(self.geo.bands),
                requested=record.get("bands") or self.options.bands, scale=self.options.scale,
                model_scale=self.geo.scale,
                nodata=self.options.nodata, nodata_fill=self.options.nodata_fill, aoi=record_aoi(record),
                date=self._date(record.get("date")), frames=self.frames, stacked_order=self.stacked_order,
                resample=self.options.resample.value if self.options.resample is not None else None,
            )
            for i, record in enumerate(pending)
        ]
        for record, scene in zip(pending, scenes):
            coords = model_coords(self.encodings, scene.acquisitions, scene.centre, scene.name)
            yield {**record, "scene": replace(scene, coords=coords)}

    def preflight(self, records: List[Record]) -> List[Record]:
        return list(self.process(iter(records)))  # headers only; raster_inputs passes on local scenes alone

    def _date(self, value):
        if self.frames > 1:
            return value if isinstance(value, tuple) else parse_dates(value, self.frames, "date")
        return parse_date(value, "date")
