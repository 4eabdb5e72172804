"""`raster_write`: mask strips -> a Cloud-Optimized GeoTIFF (or a plain tiled one) with the input's grid,
atomically.

Strips are written by windows into a tiled GeoTIFF draft in the output directory; after the last strip
the draft is copied to a COG (`cog.py`: internal overviews, range-read layout) beside it, and that is
renamed over `output_path` (with `format: gtiff` the draft itself is). On any failure (or an abandoned
run) the temp files are removed, so a run never leaves a half-written mask. Strips that carry probabilities
beside the classes (`stitch.output: classes_and_probabilities`) also go, the same way, to a float32 COG
`<output stem>.probabilities.tif`; both files are finished before either is renamed into place, and a
failure leaves neither. Emits one record per scene with `display`.
"""
import contextlib
import logging
import os
import warnings
from dataclasses import dataclass, replace
from enum import Enum
from typing import Dict, Iterator, List, Optional

import numpy as np
import rasterio
from rasterio.errors import NotGeoreferencedWarning, RasterioError
from rasterio.windows import Window

from appliance.errors import ConfigError, InputError
from appliance.output_files import AtomicFile, sibling_path
from appliance.pipeline import Record, ResolvedOptions, Stage, register_stage
from appliance.stages.geo.acquisition import coords_tags
from appliance.stages.geo.cog import overview_resampling, translate_to_cog
from appliance.stages.geo.geotiff import open_raster, probe_geotiff
from appliance.stages.geo.class_colours import colours_tag, default_colours, model_colours
from appliance.stages.geo.quicklook import quicklook_path, write_quicklook
from appliance.stages.geo.raster_read import geo_contract
from appliance.stages.geo.scene_sources import is_remote
from appliance.stages.geo.stac_out import mask_item, stac_path, write_item
from appliance.stages.geo.stitch import NODATA_CLASS

log = logging.getLogger(__name__)


PROBABILITIES_SUFFIX = ".probabilities.tif"
OVERVIEW_RESAMPLINGS = ("nearest", "mode", "average", "bilinear", "cubic", "lanczos")  # GDAL's names


class MaskFormat(str, Enum):
    cog = "cog"  # Cloud-Optimized GeoTIFF: internal overviews, for web maps and range reads
    gtiff = "gtiff"  # the plain tiled GeoTIFF (no second pass)


class MaskWriter:
    """One scene's output: a temp GeoTIFF in the output directory until `commit` (`AtomicFile`); for a COG,
    a draft GeoTIFF that `commit` copies into the output's temp file first."""

    def __init__(self, scene, output_path: str, bands: int, dtype: str, class_names: List[str], class_colours,
                 block: int, cog: bool = True, resampling: Optional[str] = None):
        self.scene, self.output_path, self.class_names, self.block = scene, output_path, class_names, block
        self.class_colours = list(class_colours)
        # Strips go to the draft; a COG is made from it into a second temp file only at commit, so an
        # interrupted run has one temp file to remove. GDAL may leave statistics (.aux.xml) beside either.
        self.draft = AtomicFile(output_path, sidecars=(".aux.xml",))
        self.file: Optional[AtomicFile] = None
        self.cog = cog
        self.temp_path = self.draft.temp_path
        self.dtype = dtype
        self.resampling = overview_resampling(dtype == "uint8", resampling)
        self.counts = np.zeros(len(class_names), dtype=np.int64)
        self.nodata_pixels = 0
        is_classes = dtype == "uint8"
        profile = dict(
            driver="GTiff", width=scene.width, height=scene.height, count=bands, dtype=dtype,
            nodata=NODATA_CLASS if is_classes else float("nan"), crs=scene.crs, transform=scene.transform,
            tiled=True, blockxsize=block, blockysize=block, compress="deflate", BIGTIFF="IF_SAFER",
        )
        try:
            with warnings.catch_warnings(), self._writing():
                warnings.simplefilter("ignore", NotGeoreferencedWarning)
                self.dataset = rasterio.open(self.temp_path, "w", **profile)
            if is_classes:
                self.dataset.set_band_description(1, "class")
                colours = dict(enumerate(self.class_colours))
                self.dataset.write_colormap(1, {**colours, NODATA_CLASS: (0, 0, 0)})
            else:
                for band, name in enumerate(class_names, 1):
                    self.dataset.set_band_description(band, f"p({name})")
            self.dataset.update_tags(class_names=",".join(class_names), class_colours=colours_tag(self.class_colours),
                                     source=os.path.basename(scene.path), **coords_tags(scene))
        except BaseException:
            self.abort()
            raise

    def write(self, strip, data: Optional[np.ndarray] = None) -> None:
        """The strip's rows: its `data`, or `data` given (its probabilities, for a probabilities file)."""
        data = strip.data if data is None else data
        with self._writing():
            self.dataset.write(data, window=Window(0, strip.row_off, self.scene.width, data.shape[1]))
        self.counts += strip.counts
        self.nodata_pixels += strip.nodata_pixels

    def seal(self) -> None:
        """Finish the file under its temp name (for a COG: the COG copy), checked; `commit` renames it."""
        with self._writing():
            self.dataset.close()
            self._verify(self.temp_path)
            if not self.cog:
                return
            self.file = AtomicFile(self.output_path, sidecars=(".aux.xml",))
            translate_to_cog(self.draft.temp_path, self.file.temp_path, self.block, self.resampling)
            self.draft.abort()
            self._verify(self.file.temp_path)

    def commit(self) -> None:
        if not self.dataset.closed:
            self.seal()
        with self._writing():
            (self.file or self.draft).commit()

    def _verify(self, path: str) -> None:
        """GDAL reports a failed block or directory write (a full disk) only on stderr, and closing does not
        raise: re-read the header and block table before the rename, so a broken file never replaces one."""
        try:
            probe_geotiff(path)
            with open_raster(path) as ds:
                whole = (ds.width, ds.height) == (self.scene.width, self.scene.height)
        except InputError:
            raise OSError("the written file does not read back whole") from None
        if not whole:
            raise OSError("the written file does not read back whole")

    @contextlib.contextmanager
    def _writing(self):
        """GDAL's write errors as exceptions (inside a rasterio.Env; outside one GDAL only prints them), and a
        full disk or a vanished directory as one clear error for the user (the caller aborts)."""
        try:
            with rasterio.Env():
                yield
        except (RasterioError, OSError) as e:
            reason = getattr(e, "strerror", None) or str(e).splitlines()[0]
            raise InputError(f"output: writing {self.output_path} failed ({reason}); free space or choose "
                             "another directory; nothing was written", param="output") from None

    def abort(self) -> None:
        dataset = getattr(self, "dataset", None)
        if dataset is not None and not dataset.closed:
            try:
                dataset.close()
            except Exception:  # noqa: BLE001 - the temp file goes anyway
                pass
        self.draft.abort()
        if self.file is not None:
            self.file.abort()


def probabilities_path(output_path: str) -> str:
    """`m.tif` -> `m.probabilities.tif`: the per-class probabilities beside a class map."""
    return sibling_path(output_path, PROBABILITIES_SUFFIX)


def commit_together(writers: List[MaskWriter]) -> None:
    """Seal every file, then rename them; the first (the class map) last, and if it fails the others are
    removed again: a scene's files appear together or not at all."""
    for writer in writers:
        writer.seal()
    placed = []
    try:
        for writer in writers[1:] + writers[:1]:
            writer.commit()
            placed.append(writer.output_path)
    except BaseException:
        for path in placed:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        raise


def describe(output_path: str, scene, tiles: int, counts: np.ndarray, nodata: int, class_names: List[str]) -> str:
    """`wrote mask.tif: 1024x768, 12 tiles, water 13.2%[, nodata 4.0%]`."""
    valid = int(counts.sum())
    shares = []
    for index in range(1, len(class_names)) if len(class_names) > 1 else range(len(class_names)):
        share = f"{100.0 * counts[index] / valid:.1f}%" if valid else "n/a"
        shares.append(f"{class_names[index]} {share}")
    if nodata:
        shares.append(f"nodata {100.0 * nodata / (scene.width * scene.height):.1f}%")
    plural = "tile" if tiles == 1 else "tiles"
    return f"wrote {output_path}: {scene.width}x{scene.height}, {tiles} {plural}, " + ", ".join(shares)


@dataclass
class RasterWriteOptions:
    class_names: Optional[List[str]] = None  # None: model.geo.class_names
    block_size: int = 256  # GeoTIFF tile edge (multiple of 16)
    format: MaskFormat = MaskFormat.cog  # cog | gtiff (plain tiled GeoTIFF, no overviews)
    overview_resampling: Optional[str] = None  # COG overviews; None: mode for classes, average for probabilities
    quicklook: bool = False  # also write <output stem>.quicklook.png (mask over RGB, downsampled)
    quicklook_size: int = 1024  # longer side of the quicklook in pixels
    stac: bool = True  # also write <output stem>.stac.json, a STAC item describing the mask


@register_stage
class RasterWrite(Stage):
    name = "raster_write"
    consumes = ("strip", "scene", "output_path")
    produces = ("display",)
    Options = RasterWriteOptions

    def __init__(self, options, cfg):
        super().__init__(options, cfg)
        if options.block_size < 16 or options.block_size % 16:
            raise ConfigError(f"{self.name}.block_size: must be a multiple of 16 (got {options.block_size})")
        if options.overview_resampling is not None and options.overview_resampling.lower() not in OVERVIEW_RESAMPLINGS:
            raise ConfigError(f"{self.name}.overview_resampling: {options.overview_resampling!r}; choose one of "
                              f"{', '.join(OVERVIEW_RESAMPLINGS)} (or null: mode for classes, average otherwise)")
        geo = geo_contract(cfg, self.name, required=False)
        names = self.options.class_names
        if names is not None and not 1 <= len(names) < NODATA_CLASS:
            raise ConfigError(f"{self.name}.class_names: need 1..{NODATA_CLASS - 1} names (got {len(names)})")
        self.class_names = list(names) if names is not None else None
        names_key = "model.geo.class_names" if options.class_names is None else f"{self.name}.class_names"
        self.class_colours = model_colours(geo, names, names_key) if names is not None else None

    @classmethod
    def resolve_options(cls, options: RasterWriteOptions, cfg) -> ResolvedOptions:
        """class_names from model.geo when unset and the model has a geo contract."""
        geo = geo_contract(cfg, cls.name, required=False)
        if options.class_names is not None or geo is None:
            return ResolvedOptions(options)
        return ResolvedOptions(replace(options, class_names=list(geo.class_names)),
                               {"class_names": "model.geo.class_names"})

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        writers: Dict[str, List[MaskWriter]] = {}  # output path -> its class map (or probabilities)[, probabilities]
        try:
            for record in records:
                strip, path = record["strip"], record["output_path"]
                if path not in writers:
                    writers[path] = self._open(record)
                scene_writers = writers[path]
                scene_writers[0].write(strip)
                if len(scene_writers) > 1:
                    scene_writers[1].write(strip, strip.probabilities)
                if strip.last:
                    commit_together(scene_writers)
                    del writers[path]
                    yield self._finish(record, *scene_writers)
        finally:
            for scene_writers in writers.values():
                for writer in scene_writers:
                    writer.abort()

    def _open(self, record: Record) -> List[MaskWriter]:
        """The scene's writers: the mask at `output_path`, and its probabilities file when strips carry one."""
        writers = [self._writer(record, record["output_path"], record["strip"].data)]
        probabilities = record["strip"].probabilities
        if probabilities is not None:
            try:
                path = probabilities_path(record["output_path"])
                if os.path.abspath(path) in {os.path.abspath(f) for f in record["scene"].files if not is_remote(f)}:
                    raise InputError(f"output: the probabilities file {path} would replace the input; choose "
                                     "another output", param="output")
                writers.append(self._writer(record, path, probabilities))
            except BaseException:
                writers[0].abort()
                raise
        return writers

    def _writer(self, record: Record, path: str, data: np.ndarray) -> MaskWriter:
        strip, scene = record["strip"], record["scene"]
        channels = len(strip.counts)
        names = self.class_names or [f"class {i}" for i in range(channels)]
        colours = self.class_colours or default_colours(channels)
        if len(names) != channels:
            raise ConfigError(
                f"{self.name}: {len(names)} class names ({', '.join(names)}) but the model gave {channels} classes"
            )
        bands, dtype = (1, "uint8") if data.dtype == np.uint8 else (data.shape[0], "float32")
        return MaskWriter(scene, path, bands, dtype, names, colours, self.options.block_size,
                          cog=self.options.format is MaskFormat.cog, resampling=self.options.overview_resampling)

    def _finish(self, record: Record, writer: MaskWriter, probabilities: Optional[MaskWriter] = None) -> Record:
        scene, path = record["scene"], record["output_path"]
        text = describe(path, scene, record["strip"].tiles, writer.counts, writer.nodata_pixels, writer.class_names)
        if probabilities is not None:
            text += f" (probabilities {probabilities.output_path})"
        quicklook = None
        if record.get("quicklook", self.options.quicklook):  # a server request may ask for one
            quicklook = quicklook_path(path)
            write_quicklook(scene, path, quicklook, self.options.quicklook_size, writer.class_names,
                            writer.class_colours)
            text += f" (quicklook {quicklook})"
        if self.options.stac:
            item = mask_item(scene, path, writer.class_names, writer.class_colours, writer.dtype == "uint8",
                             self.cfg.model.name,
                             self.cfg.pipeline.name, quicklook,
                             probabilities.output_path if probabilities is not None else None)
            target = stac_path(path)
            try:
                write_item(item, target)
            except OSError as e:
                raise InputError(f"output: writing {target} failed ({e.strerror or e}); the mask {path} was "
                                 "written; free space or pass pipeline.stages.raster_write.stac=false",
                                 param="output") from None
        out = {k: v for k, v in record.items() if k != "strip"}
        out["display"] = text
        return out
