"""GeoTIFF routes of pooling pipelines: `POST /pooling` (vLLM's IO-processor body) and `POST /v1/pool`
(the GeoTIFF itself as the body, for curl; the answer is the output GeoTIFF, or its PNG quicklook with
`?quicklook=true`; `?date=YYYY-MM-DD` gives the acquisition date, as `/pooling`'s `data.date`).

A multi-date model's (T dates, stages/geo/multidate.py) scene is, in `/pooling`, a list of T dates in
`data.data` (URLs, STAC items, allowed paths or base64 GeoTIFFs, each spooled to its own file) or one
stacked file, with `data.date` a list of T; in `/v1/pool`, one stacked GeoTIFF as the body. The count of
dates and the dates given are checked here, by multidate.py's functions, before the request queues; the
dates' grids in the engine process, as `appliance run` checks them. Errors about date i name `data.data[i]`.

Inputs spool to files in the server's spool directory (a base64 body is decoded there, a raw body
streams there under the body limit); a path is used in place, inside `server.allowed_local_media_dir`
only; a URL (a GeoTIFF, a STAC item, or per-band files) is never downloaded whole: the engine process
reads it by windows through the SSRF-safe fetcher (stages/geo/served_scenes.py). The engine process writes
the output atomically; the spooled input and output are deleted once answered.
Outputs asked for as paths go to `server.output_dir`, named after the request id.
"""
import asyncio
import base64
import binascii
import os
from pathlib import Path
from typing import Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.errors import InputError
from appliance.fetch.local_files import allowed_path
from appliance.protocol.openai_responses import new_id
from appliance.protocol.pooling import parse_pooling, pooling_response
from appliance.serving.http.errors import APIError, error_response, parse_body
from appliance.serving.http.frontend import ClientGone, Frontend
from appliance.serving.http.body_types import content_type
from appliance.serving.http.geotiff_body import (checked_dates, query_dates, refuse_unknown_query,
                                                 spool_body, unsupported_body)
from appliance.serving.http.route_table import GEOTIFF_TYPES
from appliance.serving.messages import Done, Failed, PoolJob
from appliance.serving.http.routes_generate import check_model
from appliance.stages.geo.aoi import parse_aoi
from appliance.stages.geo.multidate import check_date_count, given_dates, model_bands, model_frames
from appliance.stages.geo.scene_sources import shown
from appliance.stages.geo.quicklook import quicklook_path
from appliance.stages.geo.served_scenes import allowed_s3_buckets, check_served_href
from appliance.stages.geo.stac_out import stac_path

RAW_QUERY = ("quicklook", "date")  # `/v1/pool`'s query parameters: any other is refused


class PoolRoutes:
    def __init__(self, frontend: Frontend, cfg, spool_dir: str):
        self.frontend = frontend
        self.spool = spool_dir
        self.media_dir = cfg.server.allowed_local_media_dir
        self.output_dir = cfg.server.output_dir
        self.s3_buckets = allowed_s3_buckets(cfg.server)
        self.frames, self.model_bands = model_frames(cfg), model_bands(cfg)

    async def pooling(self, request: Request):
        uid = new_id("pool")
        request.state.request_id = uid  # the request log's id, a refused body's too (access_log.py)
        parsed = await parse_body(request, lambda body: parse_pooling(body, self.frames))
        check_model(parsed.model, self.frontend.model_name)
        listed = isinstance(parsed.data, list)
        dates = listed and self.frames > 1  # a list is the model's dates (else per-band files)
        names = parsed.data if listed else [parsed.data]
        fields = [f"data.data[{i}]" if dates else "data.data" for i in range(len(names))]
        try:
            aoi = parse_aoi(parsed.aoi, parsed.aoi_crs, where="data.")  # appliance run's rule
            given_dates(parsed.date, self.frames, "data.date")
            if dates:
                check_date_count(names, self.frames, self.model_bands, "data.data",
                                 shown_as=shown if parsed.data_format != "b64_json" else lambda _: "base64")
            if parsed.data_format == "url":  # server policy (s3 buckets) before the request queues
                for href, field in zip(names, fields):
                    check_served_href(href, field, self.s3_buckets)
        except InputError as e:
            raise APIError.from_input(e) from None
        input_path, url, spooled = None, None, []
        if parsed.data_format == "path":
            paths = [self._allowed_path(name, field) for name, field in zip(names, fields)]
            input_path = paths if listed else paths[0]
        elif parsed.data_format == "url":
            url = parsed.data
        else:
            paths = [self._spool(uid, f".in{i}.tif" if listed else ".in.tif") for i in range(len(names))]
            spooled += paths
            try:
                for text, path, field in zip(names, paths, fields):
                    await asyncio.to_thread(write_base64, text, path, field)
            except BaseException:
                self._remove(spooled)
                raise
            input_path = paths if listed else paths[0]
        if parsed.out_data_format == "path":
            if not self.output_dir:
                self._remove(spooled)
                raise APIError(400, "data.out_data_format: path needs the server started with "
                                    "server.output_dir=DIR; use b64_json", param="data.out_data_format")
            output = os.path.join(self.output_dir, f"{uid}.tif")
        else:
            output = self._spool(uid, ".out.tif")
            spooled += [output, output + ".aux.xml", stac_path(output)]
        job = PoolJob(input_path, url, output, "data.data", bands=parsed.bands, aoi=aoi,
                      upload=parsed.data_format == "b64_json", date=parsed.date)
        parsed.data = None  # the scene is on disk now: a request waiting in the queue holds no copy of it
        result = await self._run(request, uid, job, spooled)
        if isinstance(result, Response):
            return result
        data = output if parsed.out_data_format == "path" else await asyncio.to_thread(read_base64, output)
        self._remove(spooled)
        return JSONResponse(pooling_response(uid, parsed.out_data_format, data))

    async def raw(self, request: Request):
        uid = new_id("pool")
        request.state.request_id = uid
        refuse_unknown_query(request, RAW_QUERY)
        kind = content_type(request)
        if kind not in GEOTIFF_TYPES:
            raise unsupported_body(kind, self.frames)
        given = request.query_params.get("quicklook", "false").lower()
        if given not in ("true", "false", "1", "0"):
            raise APIError(400, f"quicklook: {given!r}; allowed: true, false", param="quicklook")
        quicklook = given in ("true", "1")
        date = checked_dates(query_dates(request), self.frames, "date")
        input_path, output = self._spool(uid, ".in.tif"), self._spool(uid, ".out.tif")
        spooled = [input_path, output, output + ".aux.xml", quicklook_path(output), stac_path(output)]
        try:
            await spool_body(request, input_path)
        except BaseException:
            self._remove(spooled)
            raise
        job = PoolJob(input_path, None, output, "body", quicklook=quicklook, upload=True, date=date)
        result = await self._run(request, uid, job, spooled)
        if isinstance(result, Response):
            return result
        path, media = (quicklook_path(output), "image/png") if quicklook else (output, "image/tiff")
        content = await asyncio.to_thread(Path(path).read_bytes)
        self._remove(spooled)
        return Response(content, media_type=media, headers={"X-Request-Id": uid})

    async def _run(self, request: Request, uid: str, job: PoolJob, spooled) -> Optional[Response]:
        """Submit and wait; an error Response, or None once the output is written."""
        try:
            channel = self.frontend.open(uid, request)
        except APIError:
            self._remove(spooled)
            raise
        answered = False
        try:
            self.frontend.submit(channel, job)
            while True:
                event = await self.frontend.next_event(channel)
                if isinstance(event, Failed):
                    return error_response(event.status, event.message, event.param)
                if isinstance(event, Done):
                    request.state.tiles = event.result.get("tiles")  # for the request log
                    answered = True
                    return None
        except ClientGone:
            return JSONResponse({}, status_code=499)
        finally:
            self.frontend.close(channel)
            if not answered:
                self._remove(spooled)

    def _spool(self, uid: str, suffix: str) -> str:
        return os.path.join(self.spool, uid + suffix)

    def _allowed_path(self, name: str, field: str) -> str:
        try:
            full = allowed_path(name, self.media_dir, field)
        except InputError as e:
            raise APIError.from_input(e) from None
        if not os.path.isfile(full):
            raise APIError(400, f"{field}: {name!r} is not a file in the allowed directory", param=field)
        return full

    @staticmethod
    def _remove(paths) -> None:
        for path in paths:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass


def write_base64(text: str, path: str, field: str = "data.data") -> None:
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, f"{field}: not valid base64; with data_format b64_json send the GeoTIFF's bytes "
                            "base64-encoded", param=field) from None
    with open(path, "wb") as f:
        f.write(data)


def read_base64(path: str) -> str:
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode("ascii")
