"""`stitch`: fan tiles with `logits` back in; emit finished row strips as soon as they are final.

Each output record is the scene's record (tile fields dropped) plus `strip`: a `MaskStrip` with the
rows' classes (uint8 argmax, 255 at nodata) or probabilities (float32 softmax, NaN at nodata), or both
(`classes_and_probabilities`: the writer puts the probabilities in a second file), and per-class pixel
counts. The writer turns strips into GeoTIFFs without ever holding the scene.

A record with `probabilities_file: false` (a server request: its routes answer one file) gets the
classes alone whatever `output` says.
"""
from dataclasses import dataclass
from enum import Enum
from typing import Dict, Iterator, Optional, Tuple

import numpy as np

from appliance.pipeline import Record, Stage, register_stage
from appliance.progress import DEFAULT_INTERVAL, Progress, check_interval
from appliance.stages.geo.blend import Blending, StripStitcher

NODATA_CLASS = 255
TILE_FIELDS = ("tile", "valid", "tensor", "logits", "pixels")


class StitchOutput(str, Enum):
    classes = "classes"  # uint8 argmax, nodata 255
    probabilities = "probabilities"  # float32 softmax, one band per class, nodata NaN
    classes_and_probabilities = "classes_and_probabilities"  # both: the probabilities in a second file


@dataclass
class StitchOptions:
    blending: Blending = Blending.cosine  # cosine | linear | none
    # classes (uint8, nodata 255) | probabilities (float32, NaN) | classes_and_probabilities (both, two files)
    output: StitchOutput = StitchOutput.classes
    progress: bool = True  # tiles done per scene on stderr: a tqdm bar on a terminal, else a line every interval
    progress_interval: float = DEFAULT_INTERVAL  # seconds between progress lines when stderr is not a terminal


@dataclass
class MaskStrip:
    row_off: int
    data: np.ndarray  # [bands, rows, W]: uint8 classes (1 band) or float32 probabilities (C bands)
    counts: np.ndarray  # int64 [C]: valid pixels per argmax class
    nodata_pixels: int
    index: int
    last: bool
    tiles: int  # tiles in the scene
    probabilities: Optional[np.ndarray] = None  # float32 [C, rows, W] beside the classes in `data`, when kept


def to_numpy(logits) -> np.ndarray:
    if hasattr(logits, "detach"):
        logits = logits.detach().to("cpu").float().numpy()
    return np.asarray(logits, dtype=np.float32)


def finish(logits: np.ndarray, valid: np.ndarray,
           output: StitchOutput) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """(data, counts, probabilities) for blended logits [C, rows, W] under `valid` [rows, W]: `data` the
    classes [1, rows, W] or (`output: probabilities`) the probabilities; `probabilities` the probabilities
    beside the classes for `classes_and_probabilities`, else None. The softmax works in `logits`' own
    memory (the strip's, finished with), so keeping both costs the strip's classes and no second copy."""
    classes = logits.argmax(axis=0)
    counts = np.bincount(classes[valid].ravel(), minlength=logits.shape[0]).astype(np.int64)
    if output is StitchOutput.classes:
        return class_map(classes, valid), counts, None
    logits -= logits.max(axis=0, keepdims=True)
    probs = np.exp(logits, out=logits)
    probs /= probs.sum(axis=0, keepdims=True)
    probs[:, ~valid] = np.nan
    if output is StitchOutput.probabilities:
        return probs, counts, None
    return class_map(classes, valid), counts, probs


def class_map(classes: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """The argmax as one uint8 band, nodata 255 where not valid."""
    data = classes.astype(np.uint8)
    data[~valid] = NODATA_CLASS
    return data[None]


def tiles_progress(total: int, label: str, options: StitchOptions) -> Progress:
    """The scene's tiles done, on stderr unless `progress` is off (appliance/progress.py)."""
    return Progress(total, label, "tile", interval=options.progress_interval, enabled=options.progress)


@register_stage
class Stitch(Stage):
    name = "stitch"
    consumes = ("logits", "tile", "valid")
    produces = ("strip",)
    Options = StitchOptions

    def __init__(self, options: StitchOptions, cfg):
        super().__init__(options, cfg)
        check_interval(options.progress_interval, f"{self.name}.progress_interval")

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        open_scenes: Dict[str, tuple] = {}  # scene key -> (stitcher, progress bar)
        try:
            for record in records:
                ref, logits = record["tile"], to_numpy(record["logits"])
                if ref.scene_key not in open_scenes:
                    label = getattr(record.get("scene"), "title", "tiles")
                    stitcher = StripStitcher(ref.plan, logits.shape[0], self.options.blending)
                    open_scenes[ref.scene_key] = (stitcher, tiles_progress(ref.count, label, self.options))
                stitcher, bar = open_scenes[ref.scene_key]
                strips = stitcher.add(ref.window, logits, record["valid"])
                bar.update(1)  # the scene's last tile ends the bar here, before its last strips go out
                base = {k: v for k, v in record.items() if k not in TILE_FIELDS}
                output = self.options.output
                if output is StitchOutput.classes_and_probabilities and not record.get("probabilities_file", True):
                    output = StitchOutput.classes
                for strip in strips:
                    data, counts, probs = finish(strip.logits, strip.valid, output)
                    nodata = int(strip.valid.size - strip.valid.sum())
                    mask = MaskStrip(strip.row_off, data, counts, nodata, strip.index, strip.last, ref.count, probs)
                    yield {**base, "strip": mask}
                if stitcher.finished:
                    bar.close()
                    del open_scenes[ref.scene_key]
            if open_scenes:
                raise RuntimeError(f"stitch: scenes {sorted(open_scenes)} ended before all their tiles arrived")
        finally:
            for _, bar in open_scenes.values():
                bar.close()
