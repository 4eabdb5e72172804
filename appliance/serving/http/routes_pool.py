"""GeoTIFF routes of pooling pipelines: `POST /pooling` (vLLM's IO-processor body) and `POST /v1/pool`
(the GeoTIFF itself as the body, for curl; the answer is the output GeoTIFF, or its PNG quicklook with
`?quicklook=true`; `?date=YYYY-MM-DD` gives the acquisition date, as `/pooling`'s `data.date`).

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
from appliance.protocol.pooling import GEOTIFF_TYPES, parse_pooling, pooling_response
from appliance.serving.http.errors import APIError, error_response, parse_body
from appliance.serving.http.frontend import ClientGone, Frontend
from appliance.serving.http.geotiff_body import checked_date, content_type, refuse_unknown_query, spool_body
from appliance.serving.messages import Done, Failed, PoolJob
from appliance.serving.http.routes_generate import check_model
from appliance.stages.geo.acquisition import parse_date
from appliance.stages.geo.aoi import parse_aoi
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

    async def pooling(self, request: Request):
        uid = new_id("pool")
        request.state.request_id = uid  # the request log's id, a refused body's too (access_log.py)
        parsed = await parse_body(request, parse_pooling)
        check_model(parsed.model, self.frontend.model_name)
        try:
            aoi = parse_aoi(parsed.aoi, parsed.aoi_crs, where="data.")  # appliance run's rule
            parse_date(parsed.date, "data.date")
            if parsed.data_format == "url":  # server policy (s3 buckets) before the request queues
                for href in parsed.data if isinstance(parsed.data, list) else [parsed.data]:
                    check_served_href(href, "data.data", self.s3_buckets)
        except InputError as e:
            raise APIError.from_input(e) from None
        input_path, url, spooled = None, None, []
        if parsed.data_format == "path":
            names = parsed.data if isinstance(parsed.data, list) else [parsed.data]
            paths = [self._allowed_path(name) for name in names]
            input_path = paths if isinstance(parsed.data, list) else paths[0]
        elif parsed.data_format == "url":
            url = parsed.data
        else:
            input_path = self._spool(uid, ".in.tif")
            spooled.append(input_path)
            await asyncio.to_thread(write_base64, parsed.data, input_path)
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
            raise APIError(415, f"Content-Type: {kind or 'missing'}; send the GeoTIFF as the body with "
                                f"Content-Type: {GEOTIFF_TYPES[0]}")
        quicklook = request.query_params.get("quicklook", "false").lower()
        if quicklook not in ("true", "false", "1", "0"):
            raise APIError(400, f"quicklook: {quicklook!r}; allowed: true, false", param="quicklook")
        quicklook = quicklook in ("true", "1")
        date = checked_date(request.query_params.get("date"), "date")
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

    def _allowed_path(self, name: str) -> str:
        try:
            full = allowed_path(name, self.media_dir, "data.data")
        except InputError as e:
            raise APIError.from_input(e) from None
        if not os.path.isfile(full):
            raise APIError(400, f"data.data: {name!r} is not a file in the allowed directory", param="data.data")
        return full

    @staticmethod
    def _remove(paths) -> None:
        for path in paths:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass


def write_base64(text: str, path: str) -> None:
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, "data.data: not valid base64; with data_format b64_json send the GeoTIFF's bytes "
                            "base64-encoded", param="data.data") from None
    with open(path, "wb") as f:
        f.write(data)


def read_base64(path: str) -> str:
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode("ascii")
