"""Shared builders for the vision tests: photo-like images and transformers' reference processors."""
import io

import numpy as np
from PIL import Image

OPENAI_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]

# llava-hf's settings (CLIP ViT-L/14-336), as their preprocessor_config.json files write them.
CLIP_336 = {
    "image_processor_type": "CLIPImageProcessor",
    "do_resize": True, "size": {"shortest_edge": 336}, "resample": 3,
    "do_center_crop": True, "crop_size": {"height": 336, "width": 336},
    "do_rescale": True, "rescale_factor": 0.00392156862745098,
    "do_normalize": True, "image_mean": OPENAI_CLIP_MEAN, "image_std": OPENAI_CLIP_STD,
    "do_convert_rgb": True,
}
LLAVA_15_PAD = {**CLIP_336, "image_processor_type": "LlavaImageProcessor", "do_pad": True}
LLAVA_NEXT = {**CLIP_336, "image_processor_type": "LlavaNextImageProcessor", "do_pad": True,
              "image_grid_pinpoints": PINPOINTS}

# (width, height): tiny, odd, portrait, landscape, square, extreme strips, camera sizes
SIZES = [(1, 1), (7, 5), (3, 300), (300, 500), (500, 300), (512, 512), (337, 335), (1023, 767),
         (1024, 768), (768, 1024), (363, 1113), (1113, 363), (2000, 40), (999, 333)]


def photo_like(width, height, seed=0):
    """Smooth colour gradients plus sensor-like noise: what the preprocessing sees in practice."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([128 + 100 * np.sin(xx / 37 + yy / 53), 128 + 90 * np.cos(yy / 29),
                     xx * 255 / max(width - 1, 1)], axis=-1)
    return Image.fromarray((base + rng.normal(0, 20, base.shape)).clip(0, 255).astype(np.uint8))


def noise(width, height, seed=0):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def encode(image, fmt="PNG", **kwargs):
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def reference_processor(config):
    """transformers' processor for `config`, built in-process. Only the PIL backends run without
    torchvision (CLIPImageProcessor etc. fall back to them with a warning), so those are used directly."""
    from transformers import CLIPImageProcessorPil, LlavaImageProcessorPil, LlavaNextImageProcessorPil

    cls = {"CLIPImageProcessor": CLIPImageProcessorPil, "LlavaImageProcessor": LlavaImageProcessorPil,
           "LlavaNextImageProcessor": LlavaNextImageProcessorPil}[config["image_processor_type"]]
    return cls(**{k: v for k, v in config.items() if k != "image_processor_type"})
