"""Tiling options: the schemas live in `appliance/config/schema.py`; `effective_stride` turns
`stride`/`overlap` into one number and says what is wrong otherwise."""
from appliance.config.schema import Blending, Padding, StitchConfig, StitchOutput, TilingConfig
from appliance.errors import ConfigError

__all__ = ["Blending", "Padding", "StitchConfig", "StitchOutput", "TilingConfig", "effective_stride"]


def effective_stride(tiling: TilingConfig, where: str = "tile") -> int:
    """The stride in pixels; ConfigError (naming `where`) when the options are inconsistent."""
    size = tiling.tile_size
    if size < 1:
        raise ConfigError(f"{where}.tile_size: must be >= 1 (got {size})")
    if tiling.stride is not None and tiling.overlap is not None and tiling.stride != size - tiling.overlap:
        raise ConfigError(
            f"{where}: stride={tiling.stride} and overlap={tiling.overlap} disagree for tile_size={size} "
            f"(stride = tile_size - overlap); give only one of them"
        )
    if tiling.stride is not None:
        stride = tiling.stride
        if not 1 <= stride <= size:
            raise ConfigError(f"{where}.stride: must be in 1..tile_size={size} so tiles leave no gap (got {stride})")
        return stride
    overlap = size // 8 if tiling.overlap is None else tiling.overlap
    if not 0 <= overlap < size:
        raise ConfigError(f"{where}.overlap: must be in 0..tile_size-1={size - 1} (got {overlap})")
    return size - overlap
