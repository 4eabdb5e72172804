"""What the engine loop's inbox holds: one dataclass per kind of message. Each is handled on the loop's
thread by the driver method its `message_handlers()` table names (driver.py and the driver kinds), so
every sender (`driver.post(Message(...))`) and every receiver is found by the class name.

Senders: loop.py's receiver thread (`Arrived`); the driver's preparer threads (the rest).
"""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from appliance.serving.messages import Failed


@dataclass(frozen=True)
class Arrived:
    """A job, or an `Abort`, from the HTTP process (loop.py's receiver). Every driver kind."""
    uid: str
    message: Any
    arrival: float


@dataclass(frozen=True)
class Unanswerable:
    """Preparing or running the request failed on a preparer thread; `failure` is its answer. Every kind."""
    uid: str
    failure: Failed


@dataclass(frozen=True)
class Prepared:
    """A generate request's prompts, ready for the engine: (token ids, images or None) per prompt."""
    uid: str
    prompts: List[Tuple[List[int], Optional[list]]]


@dataclass(frozen=True)
class Tokenized:
    """The answer to a /tokenize, /detokenize or /tokenizer_info job (generate workers)."""
    uid: str
    result: Dict[str, Any]


@dataclass(frozen=True)
class TileReady:
    """One tile of a pooling request's scene, for the engine; `seq` orders it within the request, `total`
    is the scene's planned tile count (None when the tile records do not say); `coords` its scene's
    GeoCoords for a model with time and location encodings."""
    uid: str
    seq: int
    tile: Any
    total: Optional[int] = None
    coords: Any = None


@dataclass(frozen=True)
class Finished:
    """A pooling or plain request ran to its end on its preparer thread; `result` is its answer."""
    uid: str
    result: Dict[str, Any]
