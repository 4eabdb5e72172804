"""A multi-date scene posted to `/v1/scenes` as `multipart/form-data` (a browser's FormData, curl's `-F`):
the model's T dates as file parts all named `files`, in time order, and optionally their acquisition dates
as a `date` field (`d1,d2,d3`, or the field once per date: as `?date=` has them). No other part is taken.

Each file part streams to its own spool file as it arrives, as a GeoTIFF body does (spool_body; the
Gate's `server.limits.max_request_bytes` counts the whole form), through python-multipart's streaming
parser: Starlette's `request.form()` would first copy every part to a temporary file outside the spool.
The parser runs in a worker thread, as the body's writes do, so the event loop never writes a file.
Refusals are 400s naming the field: a part that is no `files` or `date`, too many or too few files, an
empty file, a form cut short; the files' contents are checked when the scene is opened (`files[i]`).
"""
import asyncio
import datetime
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request

from appliance.serving.http.errors import APIError

if TYPE_CHECKING:  # python-multipart defines it for type checkers only
    from python_multipart.multipart import MultipartCallbacks

FILES, DATE = "files", "date"
MAX_DATE_BYTES = 4096  # a date field: 64 dates of YYYY-MM-DD with commas fit many times over
EXAMPLE_DATE = datetime.date(2023, 4, 15)


@dataclass
class FormScene:
    files: List[str]   # the spooled dates, in the order sent
    date: Any = None   # the `date` field as sent: None, one date, or a list (as geotiff_body.query_dates)


def form_schema(frames: int) -> Dict[str, Any]:
    """The form's schema in `/openapi.json` (an array property is a part repeated, as OpenAPI reads forms)."""
    return {"type": "object", "required": [FILES], "additionalProperties": False, "properties": {
        FILES: {"type": "array", "minItems": frames, "maxItems": frames,
                "items": {"type": "string", "format": "binary"},
                "description": f"the model's {frames} dates, one GeoTIFF per part, all parts named files, in time "
                               "order; a bad date is a 400 naming files[i]"},
        DATE: {"type": "string", "examples": [",".join(str(EXAMPLE_DATE + datetime.timedelta(days=60 * i))
                                                        for i in range(frames))],
               "description": f"the {frames} acquisition dates, YYYY-MM-DD, in the order of the files: "
                              "comma-separated, or the field once per date; default: each file's own"}}}


def wrong_count(given: str, frames: int) -> APIError:
    return APIError(400, f"{FILES}: {given} but the model takes {frames} acquisitions of one place: send {frames} "
                         f"file parts named {FILES}, in time order, or one stacked GeoTIFF as the body", param=FILES)


async def spool_form(request: Request, paths: Sequence[str]) -> FormScene:
    """The form's files written to `paths` (one a date: len(paths) is the model's T) and its dates as sent."""
    _, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if not boundary:
        raise APIError(400, "Content-Type: multipart/form-data without a boundary; let the client build the form "
                            "(curl -F, a browser's FormData)", param="Content-Type")
    reader = _FormReader(paths)
    try:
        parser = MultipartParser(boundary, reader.callbacks())
        async for chunk in request.stream():
            await asyncio.to_thread(parser.write, chunk)
    except FormParserError as e:
        raise APIError(400, f"body: not a valid multipart/form-data body ({e})", param="body") from None
    finally:
        reader.close()
    if not reader.ended:
        raise APIError(400, "body: the form ended before its closing boundary; send the whole form", param="body")
    if len(reader.files) < len(paths):
        names = ", ".join(reader.names)
        raise wrong_count(f"{len(reader.files)} files given ({names})" if names else "no file given", len(paths))
    dates = [part.strip() for value in reader.dates for part in value.split(",")]
    return FormScene(reader.files, None if not dates else dates[0] if len(dates) == 1 else dates)


@dataclass
class _FormReader:
    """python-multipart's callbacks: each part's headers read, a file part's bytes to its path, a date kept."""
    paths: Sequence[str]
    files: List[str] = field(default_factory=list)   # the paths written so far
    names: List[str] = field(default_factory=list)   # the files' names as the client gave them (for messages)
    dates: List[str] = field(default_factory=list)
    ended: bool = False
    headers: Dict[bytes, bytes] = field(default_factory=dict)
    header: List[bytes] = field(default_factory=lambda: [b"", b""])  # the header line being read: name, value
    out: Any = None           # the open file of the file part being read
    size: int = 0             # its bytes so far
    text: Optional[bytearray] = None  # the date part being read

    def callbacks(self) -> "MultipartCallbacks":
        return {"on_part_begin": self.part_begin, "on_header_field": self.header_field,
                "on_header_value": self.header_value, "on_header_end": self.header_end,
                "on_headers_finished": self.headers_finished, "on_part_data": self.part_data,
                "on_part_end": self.part_end, "on_end": self.end}

    def part_begin(self) -> None:
        self.headers = {}

    def header_field(self, data: bytes, start: int, end: int) -> None:
        self.header[0] += data[start:end]

    def header_value(self, data: bytes, start: int, end: int) -> None:
        self.header[1] += data[start:end]

    def header_end(self) -> None:
        self.headers[self.header[0].strip().lower()] = self.header[1].strip()
        self.header = [b"", b""]

    def headers_finished(self) -> None:
        _, options = parse_options_header(self.headers.get(b"content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        if name == FILES:
            if len(self.files) == len(self.paths):
                raise wrong_count(f"more than {len(self.paths)} files given", len(self.paths))
            path = self.paths[len(self.files)]
            self.out, self.size = open(path, "wb"), 0
            self.files.append(path)
            self.names.append(options.get(b"filename", b"").decode("utf-8", "replace")[:100] or "upload")
        elif name == DATE:
            self.text = bytearray()
        elif name:
            raise APIError(400, f"{name[:100]}: unknown form field; a multi-date scene's form has {FILES} (a GeoTIFF "
                                f"per date, in time order) and {DATE} (their dates)", param=name[:100])
        else:
            raise APIError(400, f"body: a form part without a name; name the dates' parts {FILES}", param="body")

    def part_data(self, data: bytes, start: int, end: int) -> None:
        if self.out is not None:
            self.out.write(data[start:end])
            self.size += end - start
        elif self.text is not None:
            self.text += data[start:end]
            if len(self.text) > MAX_DATE_BYTES:
                raise APIError(400, f"{DATE}: longer than {MAX_DATE_BYTES} bytes; give the dates as YYYY-MM-DD",
                               param=DATE)

    def part_end(self) -> None:
        if self.out is not None:
            self.close()
            if self.size == 0:
                field_name = f"{FILES}[{len(self.files) - 1}]"
                raise APIError(400, f"{field_name}: empty; send the date's GeoTIFF", param=field_name)
        elif self.text is not None:
            try:
                self.dates.append(self.text.decode("utf-8"))
            except UnicodeDecodeError:
                raise APIError(400, f"{DATE}: not UTF-8 text; give the dates as YYYY-MM-DD", param=DATE) from None
            self.text = None

    def end(self) -> None:
        self.ended = True

    def close(self) -> None:
        if self.out is not None:
            self.out.close()
            self.out = None
