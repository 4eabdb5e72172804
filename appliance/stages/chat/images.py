"""One image part of a request -> an `ImageItem` (offset filled in later) for the checkpoint at hand.

`ImageSide.from_config` reads what the request side needs from the checkpoint, once: the resolved
`vision_language` facts, `preprocessor_config.json`, and for LLaVA-NeXT the anyres grid. `prepare` is
safe to run in a thread pool (no shared mutable state):
  - pixel_values, LLaVA-1.5: load (server limits), CLIP preprocess -> [3, S, S]; `image_feature_size` tokens;
    http(s) URLs are fetched under `FetchPolicy.from_server_config`, the same rule in the server and the CLI;
  - pixel_values, LLaVA-NeXT: load, anyres -> [1 + tiles, 3, S, S]; `llava_next_feature_count` tokens;
  - image_features (LLaVA-1.5 only): a `.safetensors` (one tensor) or `.pt` file inside the allowed media
    directory holding the vision tower's output `image_input_shape` = [tokens, hidden]; no pixels here.
"""
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch

from appliance.anyres_plan import AnyresConfig, llava_next_feature_count
from appliance.config.schema import ImageInputType
from appliance.engine.multimodal import ImageItem
from appliance.errors import ConfigError, InputError
from appliance.fetch import FetchPolicy
from appliance.vision.anyres import anyres_preprocess
from appliance.vision.clip_preprocess import ClipPreprocessConfig, clip_preprocess, load_preprocess_config
from appliance.vision.image_load import LoadedImage, load_image, read_local
from appliance.vl_config import ResolvedVL, resolve_vision_language

FEATURE_SUFFIXES = (".safetensors", ".pt")


@dataclass(frozen=True)
class ImageReading:
    """How a request's image file or URL is read: `server.limits` and the fetch rule, the same for the
    server and the offline CLI. Needs nothing of the checkpoint, so a run checks its images with it
    before the model's files are read (`ChatPrompt.preflight`)."""
    max_bytes: int
    max_image_pixels: int
    fetch_policy: FetchPolicy

    @classmethod
    def from_server_config(cls, server: Any) -> "ImageReading":
        limits = server.limits
        return cls(int(limits.max_media_bytes), int(limits.max_image_pixels), FetchPolicy.from_server_config(server))

    def load(self, url: str, field: str, media_dir: Optional[str]) -> LoadedImage:
        return load_image(url, field=field, max_bytes=self.max_bytes, max_image_pixels=self.max_image_pixels,
                          allowed_dir=media_dir, fetch_policy=self.fetch_policy)


@dataclass(frozen=True)
class ImageSide:
    vl: ResolvedVL
    preprocess: Optional[ClipPreprocessConfig]  # None for image_features
    anyres: Optional[AnyresConfig]              # LLaVA-NeXT only
    reading: ImageReading

    @classmethod
    def from_config(cls, cfg: Any) -> "ImageSide":
        vl = resolve_vision_language(cfg.model)
        features = vl.image_input_type is ImageInputType.image_features
        anyres = None
        if vl.dynamic_feature_size:
            if features:
                raise ConfigError("model.vision_language.image_input_type: image_features is supported for "
                                  "LLaVA-1.5 only (LLaVA-NeXT's feature count depends on each image); use pixel_values")
            with open(os.path.join(cfg.model.path, "config.json")) as f:
                anyres = AnyresConfig.from_model_config(json.load(f))
        preprocess = None if features else load_preprocess_config(cfg.model.path)
        if preprocess is not None and not vl.dynamic_feature_size and preprocess.output_hw is not None \
                and tuple(vl.image_input_shape[1:]) != tuple(preprocess.output_hw):
            raise ConfigError(f"model.path: preprocessor_config.json makes {list(preprocess.output_hw)} images, "
                              f"the vision tower takes {list(vl.image_input_shape[1:])}")
        return cls(vl, preprocess, anyres, ImageReading.from_server_config(cfg.server))

    def prepare(self, url: str, field: str, media_dir: Optional[str]) -> ImageItem:
        """Load and preprocess one image; `offset` is left 0 for the caller to set."""
        if self.preprocess is None:
            return self._features(url, field, media_dir)
        loaded = self.reading.load(url, field, media_dir)
        size = (loaded.image.height, loaded.image.width)
        if self.anyres is not None:
            pixels = anyres_preprocess(loaded.image, self.preprocess).pixel_values
            count = llava_next_feature_count(size, self.anyres)
        else:
            if self.vl.image_feature_size is None:  # from_config builds `anyres` exactly when it is None
                raise RuntimeError("a LLaVA-1.5 image side has no image_feature_size: build it with from_config")
            pixels, count = clip_preprocess(loaded.image, self.preprocess), self.vl.image_feature_size
        return ImageItem(content_hash=loaded.content_hash, offset=0, num_tokens=count, pixel_values=pixels,
                         image_size=size)

    def _features(self, url: str, field: str, media_dir: Optional[str]) -> ImageItem:
        if not url.lower().endswith(FEATURE_SUFFIXES) or "://" in url[:32] or url.startswith("data:"):
            raise InputError(f"{field}: this model takes image features (image_input_type=image_features): "
                             "give a .safetensors or .pt file inside the allowed media directory", param=field)
        data = read_local(url, field=field, max_bytes=self.reading.max_bytes, allowed_dir=media_dir)
        features = load_features(data, url, field)
        expected = tuple(self.vl.image_input_shape)
        if tuple(features.shape) != expected:
            raise InputError(f"{field}: features have shape {list(features.shape)}; this model takes "
                             f"{list(expected)} (tokens, hidden) per image", param=field)
        digest = hashlib.sha256(b"features:" + str(list(features.shape)).encode())
        digest.update(features.numpy().tobytes())
        return ImageItem(content_hash=digest.hexdigest(), offset=0, num_tokens=expected[0], features=features)


def load_features(data: bytes, name: str, field: str) -> torch.Tensor:
    """One float tensor from .safetensors bytes (a single tensor, any key) or .pt bytes (weights only)."""
    try:
        if name.lower().endswith(".safetensors"):
            from safetensors.torch import load as load_safetensors

            tensors = load_safetensors(data)
            if len(tensors) != 1:
                raise InputError(f"{field}: {name} holds {len(tensors)} tensors; save exactly one", param=field)
            tensor = next(iter(tensors.values()))
        else:
            import io

            tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - corrupt files raise many types
        raise InputError(f"{field}: cannot read features from {name} ({str(e).splitlines()[0] if str(e) else e})",
                         param=field) from None
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
        raise InputError(f"{field}: {name} must hold one floating-point tensor", param=field)
    return tensor.float().contiguous()
