"""A test-only stand-in for the `engine` stage: same contract, deterministic fake logits.

Consumes `tensor` (normalised [C, H, W]) and produces `logits` ([2, H, W] float32), keeping every
other field and the record order, batching like the pool engine. Modes:
  water:  land 0, water k * (0.15 - (NIR + SWIR1)) in reflectance: recovers synthetic water bodies;
  smooth: a smooth pointwise function of the bands (any tiling gives the same per-pixel answer);
plus `tile_bias` x (the tile's mean input) added to every pixel of a tile, a stand-in for a model
whose answer depends on the tile's context, which is what makes seams.
"""
from dataclasses import dataclass

import numpy as np
import torch

from appliance.pipeline import Stage, register_stage


@register_stage
class FakeWaterLogits(Stage):
    name = "fake_water_logits"
    consumes = ("tensor",)
    produces = ("logits",)

    @dataclass
    class Options:
        mode: str = "water"
        tile_bias: float = 0.0
        as_numpy: bool = False  # return numpy instead of torch (both are accepted by `stitch`)
        fail_after: int = -1  # raise after this many tiles (tests that a failed run leaves no file)

    def __init__(self, options, cfg):
        super().__init__(options, cfg)
        geo = cfg.model.geo
        self.means = np.asarray(list(geo.means), dtype=np.float32)[:, None, None]
        self.stds = np.asarray(list(geo.stds), dtype=np.float32)[:, None, None]
        self.batch = int(cfg.engine.max_batch_size)
        self.seen = 0

    def logits(self, tensor: torch.Tensor) -> np.ndarray:
        x = tensor.numpy()  # numpy: cheaper than torch's thread pool on a shared 2-core box
        reflectance = x * self.stds + self.means
        out = np.zeros((2, *x.shape[1:]), dtype=np.float32)
        if self.options.mode == "water":
            out[1] = 40.0 * (0.15 - (reflectance[3] + reflectance[4]))
        else:
            out[1] = np.sin(3.0 * reflectance[0]) + reflectance[3] ** 2
        out[1] += self.options.tile_bias * x.mean()
        return out

    def process(self, records):
        batch = []
        for record in records:
            batch.append(record)
            if len(batch) == self.batch:
                yield from self._run(batch)
                batch = []
        yield from self._run(batch)

    def _run(self, batch):
        for record in batch:
            if self.seen == self.options.fail_after:
                raise RuntimeError("fake engine failed on purpose")
            self.seen += 1
            logits = self.logits(record["tensor"])
            yield {**record, "logits": logits if self.options.as_numpy else torch.from_numpy(logits)}
