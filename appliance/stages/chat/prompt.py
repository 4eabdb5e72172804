"""`chat_prompt`: chat messages -> `prompt` (token ids), `mm_data` (ImageItems), `mm_ranges`.

For each request: render the messages with the checkpoint's chat template, count the images against
`model.vision_language.limit_per_prompt`, load and preprocess every image in a `PreprocessExecutor` (all
requests' images are submitted before the first is awaited, so decoding and resizing overlap with the
template work and each other; a run with a single image, such as a server's group of one request,
prepares it in the calling thread: `ImageJobs`), expand each single `<image>` token into the model's count of
placeholder tokens, and refuse a prompt that does not fit the context. Every request of the run is
checked before the first record goes on, so a bad request fails the run before the engine loads any
weights (the engine stage holds all requests of a run anyway: it batches them).

A text-only checkpoint (no `model.vision_language`) works too; images are then refused.

A record may carry `rendering` (a `ChatRendering`): the server's `/tokenize` sets the template's
options there and turns the context check off (it counts a prompt, it does not run it).

A record may carry `completion_prompt` instead of messages (a batch file's `/v1/completions` line, one
record per prompt): no template; a text is encoded with the pipeline's tokenizer, BOS included, and token
ids are taken as given (`prompt_token_ids`, what the server's `/v1/completions` runs), then checked to fit.
"""
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from appliance.config.schema import ImageInputType
from appliance.engine.multimodal import ImageItem, mm_ranges
from appliance.errors import ConfigError, InputError
from appliance.pipeline import Record, Stage, attempt, register_stage
from appliance.stages.chat.images import ImageReading, ImageSide
from appliance.stages.chat.template import (ChatRendering, check_image_tokens, encode_rendered,
                                            expand_placeholders, render_text, template_messages)
from appliance.stages.chat.tool_prompt import with_tools
from appliance.stages.engine_stage import (check_fits, check_text_fits, model_context, model_longest_token,
                                     model_tokenizer, prompt_token_ids)
from appliance.vision.image_load import is_web_image
from appliance.vl_config import declared_input_type

if TYPE_CHECKING:  # imported where setup() starts the pool
    from appliance.vision.preprocess_executor import PreprocessExecutor


CHAT_COMPLETION = ChatRendering()  # how a chat completion's prompt is made (frozen)


@dataclass
class ChatPromptOptions:
    workers: int = 2           # preprocessing threads
    content_format: str = "auto"  # how message content reaches the template: auto | parts | string


def at(where: str, field: str, typed: Optional[Dict[str, str]] = None) -> str:
    """How an error names a field of a request: as the person set it (`input=photo.png`, a single prompt's
    `typed` fields), `requests.jsonl line 3 (...): messages[0]...`, or just the field when the request is
    named by its field already (a server request: `messages`)."""
    if typed and field in typed:
        return typed[field]
    return field if field.startswith(where) else f"{where}: {field}"


def check_length(num_tokens: int, images: List[ImageItem], limit: int, where: str) -> None:
    """The prompt must fit the context (`check_fits`); the error counts text and image tokens apart."""
    image_tokens = sum(item.num_tokens for item in images)
    plural = "s" if len(images) != 1 else ""
    detail = f" ({num_tokens - image_tokens} text + {image_tokens} image tokens for {len(images)} image{plural})" \
        if images else ""
    check_fits(num_tokens, limit, where, "shorten the messages or send fewer or smaller images", detail, param=where)


@register_stage
class ChatPrompt(Stage):
    name = "chat_prompt"
    Options = ChatPromptOptions
    consumes = ("messages", "where", "media_dir")
    produces = ("prompt", "mm_data", "mm_ranges")

    def __init__(self, options: ChatPromptOptions, cfg):
        super().__init__(options, cfg)
        if options.content_format not in ("auto", "parts", "string"):
            raise ConfigError(f"chat_prompt.content_format: {options.content_format!r}; allowed: auto, parts, string")
        if options.workers < 1:
            raise ConfigError(f"chat_prompt.workers: {options.workers}; allowed: 1 or more")
        self.tokenizer: Any = None
        self.images: Optional[ImageSide] = None
        self.pool: Optional["PreprocessExecutor"] = None
        self.max_len = self.longest_token = 0
        # Read once: an OmegaConf lookup is slow beside a plain attribute, and every request asks.
        self.multimodal = cfg.model.get("vision_language") is not None

    def check(self) -> None:
        if self.multimodal:
            ImageSide.from_config(self.cfg)  # config.json, preprocessor_config.json, declared facts

    def preflight(self, records: List[Record]) -> None:
        """Every request's local images (files, data: URLs) read and decoded as `ImageSide.prepare` reads
        them, within `server.limits`; an http(s) image is the run's to fetch. Rendering the text takes the
        tokenizer, so the preflight ends here."""
        takes_pixels = self.multimodal and declared_input_type(self.cfg.model) is ImageInputType.pixel_values
        reading = ImageReading.from_server_config(self.cfg.server)
        for record in records:
            if record.get("messages") is None:
                continue  # a completion's prompt: text or token ids
            _, urls = template_messages(record["messages"], parts=True)
            self._check_takes_images(urls, record)
            for url, field in urls:
                if takes_pixels and not is_web_image(url):
                    reading.load(url, at(record["where"], field, record.get("typed_fields")), record["media_dir"])
        return None

    def setup(self) -> None:
        from appliance.vision.preprocess_executor import PreprocessExecutor

        if not self.cfg.model.path:
            raise ConfigError("model.path: required for chat (an HF directory with the tokenizer and chat template)")
        self.tokenizer = model_tokenizer(self)  # the engine's: one per pipeline
        self.images = ImageSide.from_config(self.cfg) if self.multimodal else None
        self.max_len = model_context(self)
        self.longest_token = model_longest_token(self)
        self.pool = PreprocessExecutor(workers=self.options.workers)

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        jobs: List[Tuple[Record, List[int], List[Future]]] = []
        images = ImageJobs(self.pool)
        try:
            for record in records:
                ids, futures = self._submit(record, images)
                jobs.append((record, ids, futures))
            images.run_held()
            done = [self._done(record, ids, futures) for record, ids, futures in jobs]
        except BaseException:
            for _, _, futures in jobs:
                for future in futures:
                    future.cancel()
            raise
        yield from done

    def process_each(self, records: List[Record]) -> List[Union[Record, Exception]]:
        """As `process`, but one request failing does not stop the others (a server's group of requests).
        A group's templates run back to back while its images are prepared in the pool, which costs less
        CPU per request than preparing each request alone (docs/serving.md, "Preparers")."""
        images = ImageJobs(self.pool)
        submitted = [attempt(self._submit, record, images) for record in records]
        images.run_held()
        return [entry if isinstance(entry, Exception) else attempt(self._done, record, *entry)
                for record, entry in zip(records, submitted)]

    def _submit(self, record: Record, images: "ImageJobs") -> Tuple[List[int], List[Future]]:
        """Render the text now; queue the images."""
        where = record["where"]
        if record.get("completion_prompt") is not None:
            return self._completion_ids(record), []
        parts = self.options.content_format == "parts" or (self.options.content_format == "auto" and self.multimodal)
        chat, tools = with_tools(record["messages"], record.get("tools"), self.tokenizer,
                                  bool(record.get("describe_tools")))
        messages, urls = template_messages(chat, parts)
        self._check_takes_images(urls, record)
        if self.images is not None and len(urls) > self.images.vl.limit_per_prompt:
            raise InputError(f"{where}: {len(urls)} images in one request; this model allows "
                             f"{self.images.vl.limit_per_prompt} (model.vision_language.limit_per_prompt)",
                             param=where)
        rendering = record.get("rendering") or CHAT_COMPLETION
        text = render_text(self.tokenizer, messages, rendering, tools)
        if rendering.fit_context:
            check_text_fits(text, self.longest_token, self.max_len, where, param=where)
        ids = encode_rendered(self.tokenizer, text, rendering.add_special_tokens)
        if self.images is not None:
            check_image_tokens(ids, self.images.vl.image_token_id, len(urls), where)
        typed = record.get("typed_fields")
        futures = [images.add(self._image_side().prepare, url, at(where, field, typed), record["media_dir"])
                   for url, field in urls]
        return ids, futures

    def _image_side(self) -> ImageSide:
        if self.images is None:
            raise RuntimeError(f"{self.name}: an image came before setup() read the model's image side")
        return self.images

    def _check_takes_images(self, urls: List[Tuple[str, str]], record: Record) -> None:
        if urls and not self.multimodal:
            named = at(record["where"], urls[0][1], record.get("typed_fields"))
            raise InputError(f"{named}: model {self.cfg.model.name} takes no images; "
                             "send text only or choose a vision-language model", param=urls[0][1])

    def _completion_ids(self, record: Record) -> List[int]:
        """A completion's prompt as token ids, checked to fit; errors name it (`prompt[1]` of several)."""
        field = "prompt" if record["prompt_count"] == 1 else f"prompt[{record['prompt_number']}]"
        ids = prompt_token_ids(self, record["completion_prompt"], at(record["where"], field))
        check_fits(len(ids), self.max_len, at(record["where"], field), "shorten it")
        return ids

    def _done(self, record: Record, ids: List[int], futures: List[Future]) -> Record:
        """The record with its prompt, once its images are ready."""
        items = [future.result() for future in futures]
        if items:
            ids, offsets = expand_placeholders(ids, self._image_side().vl.image_token_id,
                                               [i.num_tokens for i in items])
            for item, offset in zip(items, offsets):
                item.offset = offset
        if (record.get("rendering") or CHAT_COMPLETION).fit_context and record.get("completion_prompt") is None:
            check_length(len(ids), items, self.max_len, record["where"])
        return {**record, "prompt": ids, "mm_data": items or None, "mm_ranges": mm_ranges(items) or None}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close(wait=False)
            self.pool = None


class ImageJobs:
    """One run's image preparations, as futures. The first is held back until a second arrives: a run
    with one image (a server's preparer that found one request waiting) prepares it in the calling
    thread by `run_held`, because there is nothing to overlap it with and the hand-off to a pool thread
    and back would only add CPU."""

    def __init__(self, pool):
        self.pool = pool
        self.held: Optional[Tuple[Future, Callable, tuple]] = None
        self.count = 0

    def add(self, fn: Callable, *args) -> Future:
        future: Future = Future()
        self.count += 1
        if self.count == 1:
            self.held = (future, fn, args)
            return future
        if self.held is not None:
            self.pool.submit(run_into, *self.held)
            self.held = None
        self.pool.submit(run_into, future, fn, args)
        return future

    def run_held(self) -> None:
        if self.held is not None:
            held, self.held = self.held, None
            run_into(*held)


def run_into(future: Future, fn: Callable, args: tuple) -> None:
    """fn(*args) into `future`, unless it was cancelled meanwhile."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn(*args))
    except BaseException as e:  # noqa: BLE001 - the waiter re-raises it
        future.set_exception(e)
