"""What travels between the HTTP process and the engine loop (pickled through two pipes: server.py).

HTTP -> engine loop, one tuple per message on the requests pipe: `(uid, arrival, message)` with
`arrival` from `time.monotonic()` (one clock for every process on the host) and `message` a job or an
`Abort`. Engine loop -> HTTP, on the events pipe: once per loop turn, one list of `(uid, event)` for
all requests; an event whose `final` is true is the request's last.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from appliance.protocol.openai_requests import GenerateRequest
from appliance.protocol.openai_responses import TokenLogprob
from appliance.protocol.tokenize import TokenizeRequest


# ---- jobs ------------------------------------------------------------------------------------------

@dataclass
class GenerateJob:
    request: GenerateRequest
    media_dir: Optional[str]  # client-named image files resolve inside it (None: refused)


@dataclass
class TokenizeJob:
    request: TokenizeRequest
    media_dir: Optional[str]  # as GenerateJob's: a chat's images are prepared as a chat completion's


@dataclass
class DetokenizeJob:
    tokens: List[int]


@dataclass
class TokenizerInfoJob:
    """`GET /tokenizer_info`: the engine process's tokenizer described."""


@dataclass
class PoolJob:
    input_path: Any             # a GeoTIFF on the server (spooled upload or an allowed file), or per-band files
    input_url: Any              # or a URL / per-band URLs, read by windows (stages/geo/served_scenes.py)
    output_path: str            # where the output GeoTIFF is written (atomically)
    field: str                  # how errors name the input (`data.data`, `body`)
    quicklook: bool = False     # also write <output stem>.quicklook.png
    bands: Optional[List[int]] = None  # 1-based band indexes to feed the model, in its band order
    aoi: Any = None             # stages.geo.aoi.Aoi: the window of the scene to run
    date: Optional[str] = None  # the scene's acquisition date as the request gives it (checked), else the source's
    upload: bool = False        # input_path holds the request's own bytes (spooled): the mask calls it `upload`
    report_dir: Optional[str] = None  # also write scene.png and mask.png there; Done.result["scene"]: the summary
    progress: bool = False      # send TileProgress events while the scene runs (scene jobs)


@dataclass
class PredictJob:
    record: Dict[str, Any]  # the pipeline's inputs (engine-less pipelines)


@dataclass
class Abort:
    """The HTTP side gave up an unfinished request (the client left, the deadline passed): stop it in the
    engine and free what it holds."""


# ---- events ----------------------------------------------------------------------------------------

@dataclass
class Admitted:
    """The request passed every check and waits for (or runs in) the engine."""
    prompt_tokens: int = 0
    final = False


@dataclass
class Tokens:
    """New output of one choice of a generation request (`index`: prompt number * n + answer number);
    a choice's last carries its `finish_reason`, and the request's very last is `final`. The counts are
    the request's: each prompt once, every choice's tokens."""
    text: str
    prompt_tokens: int
    completion_tokens: int           # so far, all choices
    logprobs: Optional[List[TokenLogprob]] = None
    finish_reason: Optional[str] = None
    index: int = 0
    final: bool = False


@dataclass
class TileProgress:
    """Tiles of a pool request's scene run by the engine so far, of its planned total: sent for jobs with
    `progress` only, once when the total is known, then at most once per engine step when it changed."""
    tiles_done: int
    tiles_total: int
    final = False


@dataclass
class Done:
    """A pool or predict request's result; a pool job with `report_dir` has its scene summary under
    `result["scene"]` (stages/geo/scene_report.py)."""
    result: Dict[str, Any] = field(default_factory=dict)
    final = True


@dataclass
class Failed:
    status: int
    message: str
    param: Optional[str] = None
    final = True
