"""Structured-config schemas, one dataclass per config group.

Hydra validates YAML against these at compose time; `compose.validate` re-checks the final tree so
that `+group.key=value` overrides (which Hydra 1.3 lets through) are rejected too.
"""
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from appliance.errors import ConfigError
from appliance.field_rules import rule

# Field metadata of AppConfig's per-run keys (read by `free_text_keys`): FREE_TEXT: the command line's
# `key=...` reaches the pipeline as the shell passed it, past Hydra's override grammar and OmegaConf's
# `${...}` (appliance/config/free_text.py).
FREE_TEXT = {"free_text": True}

# The engine group's schema lives with the engine (a plain dataclass; the engine imports no Hydra).
from appliance.engine.config import AttentionBackend, DType, EngineConfig, EngineKind  # noqa: E402, F401 - re-export


class ImageInputType(str, Enum):
    pixel_values = "pixel_values"  # the vision tower runs inside the appliance
    image_features = "image_features"  # requests carry tower outputs; projector + LM run here


@dataclass
class VisionLanguageConfig:
    """Multimodal facts of a VLM; each field is derived from the checkpoint when left unset."""

    image_input_type: ImageInputType = ImageInputType.pixel_values
    image_token_id: Optional[int] = None
    image_input_shape: Optional[List[int]] = None
    image_feature_size: Optional[int] = None
    limit_per_prompt: int = 1


class PrithviDecoder(str, Enum):
    """Which segmentation neck and head sit on the encoder (docs/prithvi.md, the two layouts)."""

    # terratorch's EncoderDecoderFactory (Prithvi-EO-2.0 fine-tunes): four selected blocks, a learned
    # pyramid, UperNet; keys encoder.*, neck.2.fpn*, decoder.*, head.*.
    upernet = "upernet"
    # hls-foundation-os (mmseg; the Prithvi-EO-1.0 fine-tunes): the last block, normalised, to a 16x
    # ConvTranspose neck, then an FCN head; keys backbone.*, neck.fpn{1,2}.*, decode_head.*.
    conv_transpose_fcn = "conv_transpose_fcn"


@dataclass
class PrithviConfig:
    """Architecture of a Prithvi-EO encoder plus its segmentation head."""

    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    patch_size: int = 16
    tubelet_size: int = 1
    num_frames: int = 1
    img_size: int = 224
    mlp_ratio: float = 4.0
    coords_encoding: List[str] = field(default_factory=list)  # subset of [time, location]
    coords_scale_learn: bool = False
    decoder: PrithviDecoder = PrithviDecoder.upernet
    selected_indices: List[int] = field(default_factory=lambda: [2, 5, 8, 11])  # upernet: the 4 blocks it reads
    decoder_channels: int = 256  # UperNet's channels, or the FCN head's
    num_classes: int = 2
    # conv_transpose_fcn only: the neck's output channels (null: embed_dim x frames) and the FCN head's convs.
    neck_channels: Optional[int] = None
    head_convs: int = 1
    # The checkpoint was trained on a date-major stack of T x C bands reshaped straight to [C, T] (as
    # hls-foundation-os's crop config does), so each "band" it saw holds T consecutive planes of that stack.
    # True feeds it the same: [C, T] tiles are flattened date-major and reshaped to [C, T].
    date_major_reshape: bool = False


class StackedBandOrder(str, Enum):
    """How a multi-date model's T x C bands lie in one stacked GeoTIFF (docs/geo.md, multi-date input)."""

    date_major = "date_major"  # all bands of date 1, then of date 2, ... (IBM's crop chips: 3 x 6 = 18 bands)
    band_major = "band_major"  # band 1 of every date, then band 2 of every date, ...


@dataclass
class GeoModelConfig:
    """Input contract of a raster model: which bands, how they are scaled and normalised."""

    bands: List[str] = MISSING
    means: List[float] = MISSING
    stds: List[float] = MISSING
    scale: float = 1.0  # DN -> reflectance multiplier applied before normalisation
    class_names: List[str] = MISSING
    # An [R, G, B] (0..255) per class name, in order: the mask's colour table, the quicklook, the STAC
    # item's classes and the scene report's palette. None: DEFAULT_CLASS_COLOURS (stages/geo/class_colours.py).
    class_colours: Optional[List[List[int]]] = None
    # STAC names of `bands`, in order: an item's asset serves a band when its eo:bands common_name or name
    # (or the asset key) is this name. None: the model takes no STAC items.
    stac_bands: Optional[List[str]] = None
    # Multi-date models (model.prithvi.num_frames > 1): the band order of one stacked GeoTIFF holding every date.
    stacked_band_order: StackedBandOrder = StackedBandOrder.date_major
    # The tile side the fine-tune was trained on (Sen1Floods11's 512-pixel chips; the Prithvi-EO-1.0
    # fine-tunes' 224 crops): the `tile` stage's tile_size unless the pipeline sets its own.
    tile_size: int = 512


class ToolCallParser(str, Enum):
    hermes = "hermes"  # <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks (Hermes, Qwen)


@dataclass
class ModelConfig:
    name: str = MISSING
    # registry key, e.g. LlamaForCausalLM, LlavaForConditionalGeneration, PrithviSegmentation
    architecture: str = MISSING
    path: Optional[str] = None  # directory in HF layout (config.json + safetensors + tokenizer)
    checkpoint: Optional[str] = None  # single-file checkpoint (terratorch .pt or .safetensors)
    vision_language: Optional[VisionLanguageConfig] = None
    prithvi: Optional[PrithviConfig] = None
    geo: Optional[GeoModelConfig] = None
    # reads tool calls out of a chat answer: what tool_choice "auto" needs (docs/serving.md); None: refused
    tool_call_parser: Optional[ToolCallParser] = None


class MetricsNames(str, Enum):
    appliance = "appliance"  # appliance_<name> for every series
    vllm = "vllm"            # vLLM's `vllm:<name>` for the series vLLM has (its dashboards, KEDA triggers)


class LogFormat(str, Enum):
    text = "text"  # TIME LEVEL LOGGER: MESSAGE
    json = "json"  # one JSON object per line (time, level, logger, message, a request line's fields)


@dataclass
class ServerLimits:
    max_request_bytes: int = field(default=20 * 1024 * 1024, metadata=rule(ge=1))  # an HTTP request body (413 above)
    # each image, image-features file or GeoTIFF a request names (URL, file, data URL)
    max_media_bytes: int = field(default=20 * 1024 * 1024, metadata=rule(ge=1))
    # an image's width x height, read from its header before decoding (8000 x 8000); under Pillow's own
    # decompression-bomb warning (89.5 million), so ours is the error users see
    max_image_pixels: int = field(default=64_000_000, metadata=rule(ge=1))
    # a request still unanswered after this long is aborted (504)
    request_timeout_s: float = field(default=600.0, metadata=rule(gt=0))
    # a URL the request names must arrive within this (images, GeoTIFFs)
    fetch_timeout_s: float = field(default=30.0, metadata=rule(gt=0))
    # accepted but not yet running; past it new requests get 429 at once
    max_queued_requests: int = field(default=256, metadata=rule(ge=0))


@dataclass
class ServerScenes:
    """`/v1/scenes` jobs (pooling servers; docs/serving.md): how long finished ones are kept, and their previews."""
    # a finished (done or failed) scene and its files are deleted this long after it ended
    keep_s: float = field(default=900.0, metadata=rule(gt=0))
    # at most this many finished scenes are kept; the oldest go first
    max_kept: int = field(default=16, metadata=rule(ge=1))
    # longer side of scene.png and mask.png in pixels (never upscaled)
    preview_size: int = field(default=1024, metadata=rule(ge=1))


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = field(default=8000, metadata=rule(ge=1, le=65535))
    served_model_name: Optional[str] = None  # the model name clients send and /v1/models lists; None: model.name
    api_key: Optional[str] = None  # Bearer key on inference routes; also read from $APPLIANCE_API_KEY
    ui: bool = True  # GET / answers a page for people (chat for generate pipelines); false: 404 (docs/serving.md)
    # origins (https://app.example.com) whose pages may call the API from a browser (CORS); none: no other origin
    cors_origins: List[str] = field(default_factory=list, metadata=rule(
        pattern=r"\*|https?://[^/\s?#]+", why="an origin as a browser sends it, scheme://host[:port] with no path or "
        "trailing slash (https://app.example.com), or *"))
    allowed_local_media_dir: Optional[str] = None  # client-named server files only under this directory
    allowed_media_domains: List[str] = field(default_factory=list)  # hosts fetched even at private addresses
    # s3:// buckets /pooling requests may name (read by GDAL with the server's AWS_* credentials); none: refused
    allowed_s3_buckets: List[str] = field(default_factory=list)
    output_dir: Optional[str] = None  # where /pooling writes outputs asked for as paths (out_data_format: path)
    spool_dir: Optional[str] = None  # uploads and outputs in flight; None: a private temp directory
    # threads that prepare requests (fetch, decode, tile) ahead of the engine; 0: for chat and completions
    # one per CPU the server may use, at most 4 (more only trade the GIL: docs/serving.md), else 4
    preprocess_workers: int = field(default=0, metadata=rule(ge=0, why="0: the default for the pipeline's kind"))
    # on SIGTERM: in-flight requests get this long to finish
    drain_timeout_s: float = field(default=30.0, metadata=rule(ge=0))
    # tokens per streamed chunk after the first (vLLM's --stream-interval): >1 saves CPU
    stream_interval: int = field(default=1, metadata=rule(ge=1, why="tokens per streamed chunk"))
    metrics_names: MetricsNames = MetricsNames.appliance  # how /metrics names its series (docs/serving.md)
    access_log: bool = True  # one INFO line per request (method, path, status, duration, id, tokens or tiles)
    # the engine's throughput and queue line every this many seconds while there is traffic; 0: never
    stats_interval_s: float = field(default=10.0, metadata=rule(ge=0, why="0: no stats line"))
    limits: ServerLimits = field(default_factory=ServerLimits)
    scenes: ServerScenes = field(default_factory=ServerScenes)


@dataclass
class PipelineConfig:
    name: str = MISSING
    inputs: List[str] = MISSING  # record fields the verb supplies (e.g. input, output, overwrite)
    # Ordered mapping: stage id -> {stage: <registered name, default: the id>, <option>: <value>, ...};
    # each node is checked against its stage's Options dataclass (appliance.stages.build.stage_nodes).
    stages: Dict[str, Any] = MISSING


@dataclass
class SearchConfig:
    """`appliance run`'s scenes from a STAC API search instead of `input=` (geo pipelines; docs/geo.md)."""
    url: Optional[str] = None  # the STAC API's root (its landing page); None: no search
    collections: List[str] = field(default_factory=list)  # collection ids to search; empty: all
    bbox: Optional[List[float]] = None  # [west, south, east, north] in lon/lat; None: the run's aoi
    datetime: Optional[str] = None  # START/END (ISO 8601, `..` open), or one date
    max_cloud_cover: Optional[float] = None  # percent, 0..100: items with more eo:cloud_cover are left out
    max_items: int = 100  # at most this many items found (every page counted)
    page_size: int = 100  # items per page the API is asked for
    api_timeout_s: float = 30.0  # each request to the API (a page of items) must be answered within this
    # Processes the scenes are split over, each mapping its share (search_shares.py): a Kubernetes Indexed
    # Job's completions. 1: one process maps them all and builds the region; more: `appliance assemble` does.
    shares: int = field(default=1, metadata=rule(ge=1, why="processes the search's scenes are split over"))
    share: Optional[int] = field(default=None, metadata=rule(ge=0, why="this process's share, 0 to shares - 1"))
    # None: $JOB_COMPLETION_INDEX, the index Kubernetes gives each pod of an Indexed Job

    @staticmethod
    def verify(node) -> None:
        """Rules between fields (check_fields calls it on the composed node)."""
        if node.shares > 1 and not node.url:
            raise ConfigError(f"search.shares: {node.shares} splits a search's scenes; give the search "
                              "(search.url) or leave search.shares at 1", param="search.shares")
        if node.share is not None and node.share >= node.shares:
            raise ConfigError(f"search.share: {node.share}; allowed: 0 to {node.shares - 1} (search.shares is "
                              f"{node.shares})", param="search.share")


@dataclass
class PublishConfig:
    """A region run's collection and items sent to a STAC API with the Transactions extension (docs/geo.md)."""
    url: Optional[str] = field(default=None, metadata=rule(
        pattern=r"https?://\S+", why="the STAC API's root, http(s)://host/path"))  # None: nothing is published
    asset_base: Optional[str] = None  # where the output directory is served (https://, s3://); None: its local path
    api_timeout_s: float = field(default=30.0, metadata=rule(gt=0))  # each request to the API


@dataclass
class AppConfig:
    pipeline: PipelineConfig = MISSING
    model: ModelConfig = MISSING
    engine: EngineConfig = field(default_factory=EngineConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    # Per-invocation arguments of `appliance run`.
    input: Optional[Any] = None  # a path or a list of paths
    aoi: Optional[Any] = None  # geo: [xmin, ymin, xmax, ymax] limiting the run (lon/lat unless aoi_crs)
    aoi_crs: Optional[str] = None
    date: Optional[Any] = None  # geo: the scenes' acquisition date (YYYY-MM-DD) when their sources lack one
    search: SearchConfig = field(default_factory=SearchConfig)  # geo: scenes from a STAC API search
    publish: PublishConfig = field(default_factory=PublishConfig)  # geo: a region's results to a STAC API
    output: Optional[Any] = None
    prompt: Optional[str] = field(default=None, metadata=FREE_TEXT)  # chat: the question
    # chat: the question read from a UTF-8 file (for long ones)
    prompt_file: Optional[str] = field(default=None, metadata=FREE_TEXT)
    system: Optional[str] = field(default=None, metadata=FREE_TEXT)  # chat: a system message before the question
    overwrite: bool = False
    log_level: Optional[str] = None  # None: INFO for `serve` (start-up, ready, request and stats lines), else WARNING
    log_format: LogFormat = LogFormat.text  # every process's lines: text, or json for log collectors
    plugins: List[str] = field(default_factory=list)  # modules imported first: they may register stages


def free_text_keys() -> List[str]:
    """Root keys whose command-line value is taken verbatim (FREE_TEXT)."""
    return [f.name for f in fields(AppConfig) if f.metadata.get("free_text")]


GROUP_SCHEMAS = {
    "pipeline": PipelineConfig,
    "model": ModelConfig,
    "engine": EngineConfig,
    "server": ServerConfig,
}


def register_schemas() -> None:
    """Register each group's schema as `<group>/schema`, which group YAML files extend."""
    cs = ConfigStore.instance()
    cs.store(name="app_schema", node=AppConfig)
    for group, schema in GROUP_SCHEMAS.items():
        cs.store(group=group, name="schema", node=schema)
