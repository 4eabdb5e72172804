"""The image side of the vision-language models: load, preprocess (CLIP, LLaVA-NeXT anyres), pool."""
from appliance.vision.anyres import (AnyresConfig, AnyresOutput, anyres_preprocess, grid_shape,
                                     llava_next_feature_count, select_pinpoint)
from appliance.vision.clip_preprocess import (ClipPreprocessConfig, clip_preprocess, clip_preprocess_batch,
                                              load_preprocess_config)
from appliance.vision.image_load import LoadedImage, content_hash, decode_image, load_image
from appliance.vision.preprocess_executor import PreprocessExecutor

__all__ = [
    "AnyresConfig", "AnyresOutput", "anyres_preprocess", "grid_shape", "llava_next_feature_count",
    "select_pinpoint", "ClipPreprocessConfig", "clip_preprocess", "clip_preprocess_batch",
    "load_preprocess_config", "LoadedImage", "content_hash", "decode_image", "load_image", "PreprocessExecutor",
]
