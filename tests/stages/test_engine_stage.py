"""The `engine` stage in pool mode: batches items across records, keeps order, equals per-item forward."""
import torch

from appliance.config.compose import compose
from appliance.engine.models.prithvi import load_prithvi
from appliance.stages.build import build_pipeline
from tests.conftest import TINY_PRITHVI

def test_pool_stage_batches_across_records_in_order(tiny_prithvi_checkpoint):
    cfg = compose(["pipeline=prithvi_flood", *TINY_PRITHVI, f"model.checkpoint={tiny_prithvi_checkpoint}", "engine.max_batch_size=3"])
    cfg.pipeline.inputs = ["tensor", "key"]
    cfg.pipeline.stages = {"engine": {}}
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


def test_batch_progress_shows_requests_done_and_tokens_per_second(monkeypatch):
    """On a terminal a batch of requests shows requests done of total and output tokens/s."""
    import io
    import sys

    from appliance.stages.engine import GenerateProgress

    terminal = io.StringIO()
    terminal.isatty = lambda: True
    monkeypatch.setattr(sys, "stderr", terminal)
    progress = GenerateProgress(3)
    progress.update(new_tokens=5, finished=0)
    progress.update(new_tokens=4, finished=2)
    progress.update(new_tokens=1, finished=1)
    assert progress.bar.n == 3 and progress.bar.total == 3 and progress.tokens == 10
    assert progress.bar.postfix.endswith(" tok/s") and float(progress.bar.postfix.split()[0]) > 0
    progress.close()
    assert "requests:" in terminal.getvalue()
    # One request, or no terminal: no bar.
    assert GenerateProgress(1).bar is None
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert GenerateProgress(5).bar is None
