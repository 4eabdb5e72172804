"""The `engine` stage in pool mode: batches items across records, keeps order, equals per-item forward."""
import pytest
import torch

from appliance.config.compose import compose
from appliance.engine.models.prithvi import build_prithvi_segmentation, load_prithvi, save_safetensors
from appliance.pipeline import build_pipeline

TINY = ["model.prithvi.embed_dim=32", "model.prithvi.depth=2", "model.prithvi.num_heads=2",
        "model.prithvi.selected_indices=[0,1,1,1]", "model.prithvi.decoder_channels=16",
        "model.prithvi.coords_encoding=[]", "model.prithvi.coords_scale_learn=false"]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    cfg = compose(["pipeline=prithvi_flood", *TINY])
    torch.manual_seed(0)
    model = build_prithvi_segmentation(cfg.model.prithvi, in_chans=len(cfg.model.geo.bands))
    path = tmp_path_factory.mktemp("prithvi") / "tiny.safetensors"
    save_safetensors(model, path)
    return path


def test_pool_stage_batches_across_records_in_order(tiny_checkpoint):
    cfg = compose(["pipeline=prithvi_flood", *TINY, f"model.checkpoint={tiny_checkpoint}", "engine.max_batch_size=3"])
    cfg.pipeline.inputs = ["tensor", "key"]
    cfg.pipeline.stages = [{"stage": "engine"}]
    pipeline = build_pipeline(cfg)
    torch.manual_seed(1)
    records = [{"tensor": torch.randn(6, 32, 32), "key": i} for i in range(7)]
    out = list(pipeline.run(iter(records)))
    engine = pipeline.stages[0].engine
    assert [r["key"] for r in out] == list(range(7))
    assert all("tensor" not in r for r in out), "the input tensor is released once used"
    assert engine.num_forwards == 3  # ceil(7 / 3): items from different records share a forward
    reference = load_prithvi(cfg.model)
    with torch.inference_mode():
        for record, result in zip(records, out):
            expected = reference(record["tensor"][None])[0]
            assert result["logits"].shape == (2, 32, 32)
            torch.testing.assert_close(result["logits"], expected, atol=1e-4, rtol=1e-4)
    assert not engine.has_unfinished()
    pipeline.close()
