"""The `engine` stage in pool mode: batches items across records, keeps order, equals per-item forward."""
import re

import torch

from appliance.config.compose import compose
from appliance.engine.models.prithvi import load_prithvi
from appliance.stages.build import build_pipeline
from tests.conftest import TINY_PRITHVI

def test_pool_stage_batches_across_records_in_order(tiny_prithvi_checkpoint):
    cfg = compose(["pipeline=prithvi_flood", *TINY_PRITHVI, f"model.checkpoint={tiny_prithvi_checkpoint}",
                   "engine.max_batch_size=3"])
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


def test_batch_progress_counts_answers_and_tokens_per_second(monkeypatch):
    """A batch reports answers done of total with generated tokens/s; one answer, or `progress: false`, nothing."""
    import io
    import sys

    from appliance.stages.engine_stage import EngineStageOptions, answers_progress

    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    progress = answers_progress(3, "requests.jsonl", EngineStageOptions())
    progress.update(0, 5)
    progress.update(2, 4)
    progress.update(1, 1)
    assert progress.finished and progress.extra == 10
    assert re.fullmatch(r"requests\.jsonl: 3/3 answers \(100%\), \d+\.\d tokens/s, in \d+s\n", stderr.getvalue())
    for total, options in [(1, EngineStageOptions()), (5, EngineStageOptions(progress=False))]:
        quiet = answers_progress(total, "requests.jsonl", options)
        quiet.update(total, 7)
        quiet.close()
    assert stderr.getvalue().count("\n") == 1
