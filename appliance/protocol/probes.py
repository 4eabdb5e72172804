"""The answers of the routes every server has: its probes (`/health`, `/ready`) and `/version`, for the
OpenAPI document (serving/http/openapi.py) and the handlers (serving/http/routes_ops.py) alike."""
from typing import Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict

HealthStatus = Literal["ok", "dead"]
ReadyStatus = Literal["ready", "loading", "draining", "dead"]
ALIVE, DEAD = get_args(HealthStatus)
READY, LOADING, DRAINING, _ = get_args(ReadyStatus)


class Health(BaseModel):
    """200 while the engine lives, 503 (`dead`) once it died."""
    model_config = ConfigDict(extra="forbid")
    status: HealthStatus


class Readiness(BaseModel):
    """200 (`ready`) once the model is loaded and warm; 503 while loading, draining or dead."""
    model_config = ConfigDict(extra="forbid")
    status: ReadyStatus


class Version(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str
    pipeline: str
    model: Optional[str]
