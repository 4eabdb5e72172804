"""CLIP image preprocessing (LLaVA-1.5's and LLaVA-NeXT's tiles) in PIL + torch, no torchvision.

The steps and their order are those of transformers' CLIP/LLaVA image processors (the PIL backend, the
only one that runs without torchvision), the reference the parity tests hold us to:

1. `pad_to_square` (LLaVA-1.5 "pad" aspect mode, `LlavaImageProcessor` with `do_pad`): paste the image
   centred on a square of side max(h, w) filled with `int(255 * mean)` per channel.
2. resize, on the 8-bit image with Pillow (`resample` 3 = bicubic, Pillow's own antialiasing filter):
   `size: {shortest_edge: S}` scales the short side to S and the long side to `int(S * long / short)`
   (truncated, not rounded); `size: {height, width}` resizes to exactly that.
3. centre crop to `crop_size`: top = (h - ch) // 2, left = (w - cw) // 2; where the image is smaller
   than the crop the outside is black (0), as transformers pads it.
4. rescale and normalise fused into one multiply-add in float32:
   `x * (rescale_factor / std) - mean / std`.

With `resize_backend="pil"` (the default) resizing uses Pillow, like the reference, so steps 1-3 are
bit-exact with it and step 4 differs only by float rounding (< 1e-5). `resize_backend="torch"` uses
torch's uint8 `interpolate(..., antialias=True)`, its passes run in Pillow's order: faster to resize
(docs/benchmarks.md, "Image preprocessing"), the same filter (a = -0.5), but not bit-exact: its
fixed-point weights round differently, so pixels may be 1-2 levels off (<= 0.03 normalised). See
docs/vision.md.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import torch
from PIL import Image

from appliance.errors import ConfigError
from appliance.vision.image_load import to_rgb

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
_TORCH_MODES = {2: "bilinear", 3: "bicubic"}
# processor types whose `do_pad` means "pad to square before resizing" (LLaVA-1.5's "pad" mode);
# for LlavaNextImageProcessor `do_pad` only pads the tile count of a batch, which we do not need.
_PAD_TO_SQUARE_TYPES = {"LlavaImageProcessor", "LlavaImageProcessorPil", "LlavaImageProcessorFast"}


@dataclass(frozen=True)
class ClipPreprocessConfig:
    do_resize: bool = True
    shortest_edge: Optional[int] = 224          # size: {shortest_edge}
    resize_hw: Optional[tuple[int, int]] = None  # size: {height, width}; wins over shortest_edge
    resample: int = 3                            # PIL code; 3 = bicubic
    do_center_crop: bool = True
    crop_hw: tuple[int, int] = (224, 224)
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = OPENAI_CLIP_MEAN
    image_std: tuple[float, ...] = OPENAI_CLIP_STD
    do_convert_rgb: bool = True
    pad_to_square: bool = False
    image_grid_pinpoints: Optional[tuple[tuple[int, int], ...]] = None  # (height, width); LLaVA-NeXT only
    resize_backend: str = "pil"  # ours, not from the file: "pil" (matches transformers) or "torch" (faster)
    _scale: torch.Tensor = field(init=False, repr=False, compare=False)
    _offset: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.resize_backend not in ("pil", "torch"):
            raise ConfigError(f"resize_backend = {self.resize_backend!r}; allowed: pil, torch")
        mean = torch.tensor(self.image_mean, dtype=torch.float64) if self.do_normalize else torch.zeros(3)
        std = torch.tensor(self.image_std, dtype=torch.float64) if self.do_normalize else torch.ones(3)
        factor = self.rescale_factor if self.do_rescale else 1.0
        object.__setattr__(self, "_scale", (factor / std).float().view(3, 1, 1))
        object.__setattr__(self, "_offset", (-mean / std).float().view(3, 1, 1))

    @property
    def pad_color(self) -> tuple[int, ...]:
        return tuple(int(m * 255) for m in self.image_mean)

    @property
    def short_side(self) -> int:
        """`shortest_edge`, for the steps that resize to it; ConfigError when the file gives no size."""
        if self.shortest_edge is None:
            raise ConfigError("preprocessor_config.json: size gives neither shortest_edge nor height and width")
        return self.shortest_edge

    @property
    def output_hw(self) -> Optional[tuple[int, int]]:
        """(height, width) of every output, or None when it depends on the input (no crop, no fixed size)."""
        if self.do_center_crop:
            return self.crop_hw
        if self.do_resize and self.resize_hw:
            return self.resize_hw
        return None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "preprocessor_config.json",
                  resize_backend: str = "pil") -> "ClipPreprocessConfig":
        """Keys as transformers writes them; unknown keys (processor_class, ...) are ignored."""
        def need(cond, key, allowed):
            if not cond:
                raise ConfigError(f"{source}: {key} = {d.get(key)!r} is invalid; allowed: {allowed}")

        kw: dict[str, Any] = {}
        for key in ("do_resize", "do_center_crop", "do_rescale", "do_normalize", "do_convert_rgb"):
            if key in d:
                need(isinstance(d[key], bool), key, "true or false")
                kw[key] = d[key]
        if "size" in d:
            size = d["size"]
            if isinstance(size, int) and not isinstance(size, bool):  # old files: an int is the short edge
                size = {"shortest_edge": size}
            need(isinstance(size, Mapping) and not size.get("longest_edge") and not size.get("max_height"),
                 "size", "{shortest_edge: N} or {height: H, width: W} (longest_edge / max_* are not supported)")
            if size.get("height") and size.get("width"):
                kw["resize_hw"] = (int(size["height"]), int(size["width"]))
                kw["shortest_edge"] = None
            else:
                need(isinstance(size.get("shortest_edge"), int) and size["shortest_edge"] > 0, "size",
                     "{shortest_edge: N} or {height: H, width: W} with positive ints")
                kw["shortest_edge"] = int(size["shortest_edge"])
        if "crop_size" in d:
            crop = d["crop_size"]
            if isinstance(crop, int) and not isinstance(crop, bool):
                crop = {"height": crop, "width": crop}
            need(isinstance(crop, Mapping) and isinstance(crop.get("height"), int)
                 and isinstance(crop.get("width"), int), "crop_size", "{height: H, width: W}")
            kw["crop_hw"] = (int(crop["height"]), int(crop["width"]))
        if "resample" in d:
            need(type(d["resample"]) is int and d["resample"] in _RESAMPLE_NAMES, "resample",
                 ", ".join(f"{k} ({v})" for k, v in _RESAMPLE_NAMES.items()))
            kw["resample"] = int(d["resample"])
        if "rescale_factor" in d:
            need(isinstance(d["rescale_factor"], (int, float)) and d["rescale_factor"] > 0,
                 "rescale_factor", "a positive number")
            kw["rescale_factor"] = float(d["rescale_factor"])
        for key in ("image_mean", "image_std"):
            if key in d:
                value = d[key]
                if isinstance(value, (int, float)):
                    value = [value] * 3
                need(isinstance(value, (list, tuple)) and len(value) == 3
                     and all(isinstance(v, (int, float)) for v in value), key, "3 numbers (R, G, B)")
                kw[key] = tuple(float(v) for v in value)
        if "image_std" in kw:
            need(all(v > 0 for v in kw["image_std"]), "image_std", "3 positive numbers")
        kind = str(d.get("image_processor_type", ""))
        kw["pad_to_square"] = bool(d.get("do_pad")) and kind in _PAD_TO_SQUARE_TYPES
        if d.get("image_grid_pinpoints") is not None:
            pins = d["image_grid_pinpoints"]
            need(isinstance(pins, (list, tuple)) and pins and all(
                isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(v, int) and v > 0 for v in p)
                for p in pins), "image_grid_pinpoints", "a non-empty list of [height, width] pairs")
            kw["image_grid_pinpoints"] = tuple((int(h), int(w)) for h, w in pins)
        return cls(**kw, resize_backend=resize_backend)


def load_preprocess_config(path: str | os.PathLike, resize_backend: str = "pil") -> ClipPreprocessConfig:
    """Read `preprocessor_config.json` from a checkpoint directory (or the file itself)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "preprocessor_config.json")
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found; the checkpoint needs a preprocessor_config.json") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return ClipPreprocessConfig.from_dict(data, source=path, resize_backend=resize_backend)


def resize_output_hw(height: int, width: int, cfg: ClipPreprocessConfig) -> tuple[int, int]:
    """Target (height, width) of the resize step: exact size, or short side → S, long side truncated."""
    if cfg.resize_hw:
        return cfg.resize_hw
    short, long = (width, height) if width <= height else (height, width)
    new_short = cfg.short_side
    new_long = int(new_short * long / short)
    return (new_long, new_short) if width <= height else (new_short, new_long)


def resize_image(image: Image.Image, size_hw: tuple[int, int], resample: int = 3,
                 backend: str = "pil") -> Image.Image:
    """Resize an RGB image to (height, width). "torch" uses torch's antialiased uint8 kernels for
    bilinear/bicubic (other filters, and "pil", use Pillow, which is what transformers runs)."""
    height, width = size_hw
    if (image.height, image.width) == (height, width):
        return image
    if backend == "torch" and resample in _TORCH_MODES:
        out = torch.from_numpy(np.array(image)).permute(2, 0, 1)[None]  # channels-last: the fast uint8 path
        for size in _pillow_pass_sizes(image.height, image.width, height, width):
            out = torch.nn.functional.interpolate(out, size=size, mode=_TORCH_MODES[resample], antialias=True)
        return Image.fromarray(out[0].permute(1, 2, 0).contiguous().numpy())
    return image.resize((width, height), resample=resample)


def _pillow_pass_sizes(height: int, width: int, out_h: int, out_w: int) -> list[tuple[int, int]]:
    """Sizes to resize through so torch's passes run in Pillow's order (the 8-bit clipping between
    the passes then matches). torch resamples horizontally first; Pillow 13 goes vertically first
    when the height shrinks by more than twice as many pixels as the width (libImaging/Resample.c)."""
    if height - out_h > 0 and height - out_h > 2 * (width - out_w):
        return [(out_h, width), (out_h, out_w)]
    return [(out_h, out_w)]


def pad_to_square(image: Image.Image, color: tuple[int, ...]) -> Image.Image:
    width, height = image.size
    if width == height:
        return image
    side = max(width, height)
    canvas = Image.new("RGB", (side, side), color)
    canvas.paste(image, ((side - width) // 2, (side - height) // 2))
    return canvas


def center_crop(image: Image.Image, crop_hw: tuple[int, int]) -> Image.Image:
    """Centre crop; parts of the box outside a small image come out black, as in transformers."""
    width, height = image.size
    ch, cw = crop_hw
    if (height, width) == (ch, cw):
        return image
    top, left = (height - ch) // 2, (width - cw) // 2
    return image.crop((left, top, left + cw, top + ch))


def prepare_pixels(image: Image.Image, cfg: ClipPreprocessConfig) -> Image.Image:
    """The 8-bit geometric part: convert, pad to square, resize, centre crop."""
    if cfg.do_convert_rgb or image.mode != "RGB":
        image = to_rgb(image)
    if cfg.pad_to_square:
        image = pad_to_square(image, cfg.pad_color)
    if cfg.do_resize:
        image = resize_image(image, resize_output_hw(image.height, image.width, cfg), cfg.resample,
                             cfg.resize_backend)
    if cfg.do_center_crop:
        image = center_crop(image, cfg.crop_hw)
    return image


def to_normalized_tensor(image: Image.Image, cfg: ClipPreprocessConfig,
                         out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """RGB uint8 image → float32 [3, H, W], rescaled and normalised in one multiply-add."""
    chw = torch.from_numpy(np.array(image)).permute(2, 0, 1)
    if out is None:
        out = torch.empty(chw.shape, dtype=torch.float32)
    torch.mul(chw, cfg._scale, out=out)
    return out.add_(cfg._offset)


def clip_preprocess(image: Image.Image, cfg: ClipPreprocessConfig) -> torch.Tensor:
    """One image → float32 [3, H, W]."""
    return to_normalized_tensor(prepare_pixels(image, cfg), cfg)


def clip_preprocess_batch(images: Sequence[Image.Image], cfg: ClipPreprocessConfig) -> torch.Tensor:
    """Images → float32 [N, 3, H, W] (needs a fixed output size: centre crop or size {height, width})."""
    if cfg.output_hw is None:
        raise ConfigError("preprocessor_config.json: batching needs a fixed output size; "
                          "set do_center_crop with crop_size, or size {height, width}")
    height, width = cfg.output_hw
    out = torch.empty((len(images), 3, height, width), dtype=torch.float32)
    for i, image in enumerate(images):
        to_normalized_tensor(prepare_pixels(image, cfg), cfg, out=out[i])
    return out
