"""Read windows of a scene from its file(s): one multi-band GeoTIFF or one file per band, local or
remote, offset to the scene's area of interest. Each file is opened once for the whole scene. A
multi-date scene's files on another grid than its first date's (`scene.warped`) are read through a
WarpedVRT onto the first file's grid (rasterio's reprojection, a window at a time).

`read` gives float32 reflectance [C, h, w] (nodata pixels set to `nodata_fill`) and a validity mask;
`read_decimated` gives whole-scene bands at a small size (the quicklook).
"""
import contextlib
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import numpy as np
from rasterio.enums import Resampling
from rasterio.errors import RasterioError
from rasterio.vrt import WarpedVRT
from rasterio.windows import Window

from appliance.errors import InputError
from appliance.stages.geo.geotiff import file_param, first_line, open_raster
from appliance.stages.geo.scene import SceneInfo


class SceneReader:
    def __init__(self, scene: SceneInfo, datasets: Dict[str, Any]):  # rasterio datasets
        self.scene, self.datasets = scene, datasets
        # (file, positions in the model's order, 1-based bands in that file): one read call per file.
        groups: Dict[str, Tuple[List[int], List[int]]] = {}
        for position, (file, band) in enumerate(zip(scene.files, scene.band_indexes)):
            groups.setdefault(file, ([], []))
            groups[file][0].append(position)
            groups[file][1].append(band)
        self.groups = [(file, positions, bands) for file, (positions, bands) in groups.items()]

    @property
    def block_height(self) -> int:
        return next(iter(self.datasets.values())).block_shapes[0][0]

    @property
    def itemsize(self) -> int:
        return np.dtype(next(iter(self.datasets.values())).dtypes[0]).itemsize

    def read(self, y: int, x: int, height: int, width: int) -> Tuple[np.ndarray, np.ndarray]:
        """A pixel is invalid when any band is its nodata value or NaN, or a file's mask band says so."""
        scene = self.scene
        row, col = scene.offset
        window = Window(col + x, row + y, width, height)
        data = np.empty((len(scene.files), height, width), dtype=np.float32)
        invalid = np.zeros((height, width), dtype=bool)
        for file, positions, bands in self.groups:
            ds = self.datasets[file]
            try:
                data[positions] = ds.read(bands, window=window, out_dtype="float32")
                if scene.mask_band:
                    invalid |= ds.read_masks(bands[0], window=window) == 0
            except RasterioError as e:
                label = scene.labels[positions[0]] if scene.labels else file
                param = file_param(label)
                if scene.fetch is not None:  # serve mode: the request's field leads (the error's param)
                    label, param = f"{scene.fetch.field}: {label}", scene.fetch.field
                raise InputError(
                    f"{label}: cannot read the window of rows {y}..{y + height - 1}, columns {x}..{x + width - 1} "
                    f"({first_line(e)}); the file may be truncated, corrupt or no longer reachable", param=param
                ) from None
        invalid |= np.isnan(data).any(axis=0)
        for band, value in enumerate(scene.nodata):
            if value is not None and not np.isnan(value):
                invalid |= data[band] == np.float32(value)
        data *= np.asarray(scene.scales, dtype=np.float32)[:, None, None]
        data += np.asarray(scene.offsets, dtype=np.float32)[:, None, None]
        data[:, invalid] = scene.nodata_fill
        return data, ~invalid

    def read_decimated(self, positions: Sequence[int], shape: Tuple[int, int]) -> np.ndarray:
        """Model bands `positions` of the whole scene resampled (nearest) to `shape`, as DN."""
        row, col = self.scene.offset
        window = Window(col, row, self.scene.width, self.scene.height)
        out = np.empty((len(positions), *shape), dtype=np.float32)
        for i, position in enumerate(positions):
            ds = self.datasets[self.scene.files[position]]
            out[i] = ds.read(self.scene.band_indexes[position], window=window, out_shape=shape,
                             resampling=Resampling.nearest, out_dtype="float32")
        return out


@contextlib.contextmanager
def open_scene(scene: SceneInfo) -> Iterator[SceneReader]:
    with contextlib.ExitStack() as stack:
        datasets = {}
        for position, file in enumerate(scene.files):
            if file not in datasets:
                label = scene.labels[position] if scene.labels else None
                datasets[file] = stack.enter_context(open_raster(file, label, scene.fetch))
                if file in scene.warped:
                    grid = datasets[scene.files[0]]  # date 1's file: the scene's grid
                    datasets[file] = stack.enter_context(WarpedVRT(
                        datasets[file], crs=grid.crs, transform=grid.transform, width=grid.width,
                        height=grid.height, resampling=Resampling[scene.resampling]))
        yield SceneReader(scene, datasets)
