"""The records the server hands a pipeline's online stages, one definition per API: what the workers
build from a request, and what `split_online` checks the stages against."""
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Optional, Tuple

from appliance.engine.config import EngineKind
from appliance.stages.chat.template import ChatRendering


@dataclass
class ChatRecord:
    """A chat request, as `chat_requests` makes it offline, for `chat_prompt`."""
    messages: List[Dict[str, Any]]
    sampling: Dict[str, Any]
    where: str                  # how errors name the request's fields
    media_dir: Optional[str]    # client-named image files resolve inside it (None: refused)
    custom_id: str
    model_name: Optional[str]
    rendering: Optional[ChatRendering] = None  # None: a chat completion's (ChatRendering's defaults)
    tools: Optional[List[Dict[str, Any]]] = None  # the request's tools, rendered into the prompt
    describe_tools: bool = False  # a template without tools gets them in a system message (tool_prompt.py)


@dataclass
class SceneRecord:
    """A GeoTIFF request, as `raster_inputs` makes it offline, for `raster_read`."""
    input_path: Any  # a GeoTIFF path, or the scene spec of a STAC item read by windows
    output_path: str
    quicklook: bool
    bands: Optional[List[int]]
    aoi: Any = None             # stages.geo.aoi.Aoi, or None: the whole scene
    date: Any = None            # the acquisition date the request gives (checked), or None: the source's
    scene_index: int = 0
    overwrite: bool = True      # the output is the request's own spool or output file
    probabilities_file: bool = False  # the answer is one file: never a probabilities COG beside it (stitch.py)


def as_record(value) -> Dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in fields(value)}


def record_fields(kind: EngineKind) -> Tuple[str, ...]:
    """The fields the server supplies to the online stages of a `generate` or `pool` pipeline."""
    return tuple(f.name for f in fields(ChatRecord if kind is EngineKind.generate else SceneRecord))
