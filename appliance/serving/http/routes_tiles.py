"""A done scene's map tiles (docs/serving.md): `GET /v1/scenes/{id}/tiles/{layer}/{z}/{x}/{y}.png` and the
layer's TileJSON, for the map page, QGIS and web maps. The `mask` layer reads the mask COG; the `scene`
layer the uploaded input the job keeps (a scene given by URL was read where it lives, and has no scene
layer). Each tile is rendered in a worker thread (stages/geo/map_tiles.py), the event loop left free.
"""
import asyncio
import os

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.protocol.scenes import TILE_LAYERS
from appliance.serving.http.errors import APIError
from appliance.serving.http.scene_jobs import SceneJob, SceneJobs
from appliance.stages.geo.map_tiles import (MAX_ZOOM, mask_tile, read_rendering, rendering_files, scene_tile,
                                            tile_grid)
from appliance.stages.geo.scene_report import SCENE_RGB

PNG = "image/png"
CACHE = {"Cache-Control": "private, max-age=3600"}  # a done scene's tiles never change while it is kept


class SceneTileRoutes:
    def __init__(self, jobs: SceneJobs):
        self.jobs = jobs

    async def tile(self, request: Request):
        self.jobs.prune()
        job, layer = self._layer(request)
        z, x, y = (tile_index(request, name) for name in ("z", "x", "y"))
        if z > MAX_ZOOM:
            raise APIError(400, f"z: {z} is no zoom of the Web Mercator grid (0..{MAX_ZOOM})", param="z")
        for name, value in (("x", x), ("y", y)):
            if value >= 2 ** z:
                raise APIError(400, f"{name}: {value} is past zoom {z}'s tiles (0..{2 ** z - 1})", param=name)
        if layer == "mask":
            png = await asyncio.to_thread(mask_tile, job.output_path, z, x, y)
        else:
            png = await asyncio.to_thread(scene_tile, self._rendering(job), z, x, y)
        return Response(png, media_type=PNG, headers=CACHE)

    async def tilejson(self, request: Request):
        self.jobs.prune()
        job, layer = self._layer(request)
        if layer == "scene":
            self._rendering(job)  # a scene given by URL has no scene layer to describe
        grid = await asyncio.to_thread(tile_grid, job.output_path)
        west, south, east, north = grid.bounds
        template = f"{request.base_url}v1/scenes/{job.id}/tiles/{layer}/{{z}}/{{x}}/{{y}}.png"
        return JSONResponse({"tilejson": "3.0.0", "name": f"{job.id} {layer}", "scheme": "xyz", "tiles": [template],
                             "minzoom": grid.minzoom, "maxzoom": grid.maxzoom, "bounds": list(grid.bounds),
                             "center": [(west + east) / 2, (south + north) / 2, grid.minzoom]})

    def _layer(self, request: Request):
        """The done job the request names, and its layer; else the 4xx naming the field."""
        job = self.jobs.named(request.path_params["id"])
        layer = request.path_params["layer"]
        if layer not in TILE_LAYERS:
            raise APIError(404, f"layer: {layer!r}: no such layer; a scene's layers are {', '.join(TILE_LAYERS)}",
                           param="layer")
        self.jobs.require_done(job)
        if "mask.tif" not in job.files:
            raise APIError(404, f"layer: scene {job.id!r} has no mask.tif to tile", param="layer")
        if not (job.result or {}).get("crs"):
            raise APIError(404, f"layer: scene {job.id!r} has no CRS, so it has no place on a map: read its "
                                "mask.tif", param="layer")
        return job, layer

    @staticmethod
    def _rendering(job: SceneJob) -> dict:
        """scene_rgb.json, when the files it names are the upload the job keeps."""
        path = os.path.join(job.dir, SCENE_RGB)
        rendering = read_rendering(path) if os.path.isfile(path) else None
        inside = os.path.realpath(job.dir) + os.sep
        if rendering is None or not all(os.path.realpath(file).startswith(inside)
                                        for file in rendering_files(rendering)):
            raise APIError(404, f"layer: scene {job.id!r} was read from its URL, which is not kept here: it has "
                                "the mask layer only", param="layer")
        return rendering


def tile_index(request: Request, name: str) -> int:
    """Path parameter `name` as a tile index (an integer >= 0); else a 400 naming it."""
    text = request.path_params[name]
    if not (text.isascii() and text.isdigit()):
        raise APIError(400, f"{name}: {text!r} is not a tile index (an integer, 0 or more)", param=name)
    return int(text)
