"""The tiny TL flood model (`model=prithvi_tiny_tl_flood`) with seeded random weights, for tests that need
its time and location encodings to show in the mask (tests/geo/test_tl_cli.py, test_served_tl.py)."""
from pathlib import Path


def tiny_tl_checkpoint(directory: Path) -> Path:
    """Writes `directory/tiny_tl.safetensors` and returns its path."""
    import torch

    from appliance.config.compose import compose
    from appliance.engine.models.prithvi import build_prithvi_segmentation, save_safetensors

    cfg = compose(["pipeline=prithvi_flood", "model=prithvi_tiny_tl_flood"])
    torch.manual_seed(0)
    model = build_prithvi_segmentation(cfg.model.prithvi, in_chans=len(cfg.model.geo.bands))
    with torch.no_grad():  # learned scales well away from their 0.1 start, so the encodings show
        model.encoder.temporal_embed_enc.scale.fill_(1.0)
        model.encoder.location_embed_enc.scale.fill_(1.0)
    path = directory / "tiny_tl.safetensors"
    save_safetensors(model, path)
    return path
