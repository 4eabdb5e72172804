"""Pool mode: items batched across requests, outputs equal to running each item alone."""
import pytest
import torch
from torch import nn

from appliance.config.schema import EngineConfig
from appliance.errors import ConfigError
from appliance.engine.pool_engine import PoolEngine, PoolRequest, plan_batch


class TinyConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.GroupNorm(2, 4)  # per-item, so batching must not change results

    def forward(self, x):
        return self.norm(self.conv(x)).relu()


class Recorder(TinyConvNet):
    def __init__(self):
        super().__init__()
        self.batch_sizes = []

    def forward(self, x):
        self.batch_sizes.append(x.shape[0])
        return super().forward(x)


def reqs(*sizes):
    return [PoolRequest(str(i), [torch.zeros(s) for s in shapes]) for i, shapes in enumerate(sizes)]


@pytest.mark.parametrize("requests,max_bs,expected", [
    ([[(2,)] * 3, [(2,)] * 2], 4, [("0", 0), ("0", 1), ("0", 2), ("1", 0)]),  # spans requests
    ([[(2,)] * 3], 2, [("0", 0), ("0", 1)]),
    ([[(2,)], [(3,)], [(2,)]], 8, [("0", 0)]),  # a new shape waits for the next step (FCFS)
    ([], 4, []),
])
def test_plan_batch(requests, max_bs, expected):
    batch = plan_batch(reqs(*requests), max_bs)
    assert [(r.request_id, i) for r, i in batch] == expected


def test_batches_across_requests_and_matches_per_item():
    model = Recorder()
    engine = PoolEngine(model, EngineConfig(kind="pool", max_batch_size=4))
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(n, 3, 8, 8, generator=g) for n in (3, 1, 5, 2)]
    outputs = engine.encode(inputs)
    assert model.batch_sizes == [4, 4, 3]  # 11 items packed across request boundaries
    ref_model = TinyConvNet()
    for x, y in zip(inputs, outputs):
        assert y.shape == (x.shape[0], 4, 8, 8)
        for j in range(x.shape[0]):
            torch.testing.assert_close(y[j], ref_model(x[j:j + 1])[0], rtol=1e-5, atol=1e-5)
    assert not engine.has_unfinished()


def test_mixed_shapes_and_abort():
    engine = PoolEngine(Recorder(), EngineConfig(kind="pool", max_batch_size=8))
    a = engine.add_request([torch.randn(3, 8, 8)] * 2)
    b = engine.add_request([torch.randn(3, 16, 16)])
    c = engine.add_request([torch.randn(3, 8, 8)])
    engine.abort(c)
    finished = {}
    while engine.has_unfinished():
        finished.update({o.request_id: o.output for o in engine.step()})
    assert set(finished) == {a, b}
    assert finished[b].shape == (1, 4, 16, 16)


def test_bad_config_is_clear():
    with pytest.raises(ConfigError, match=r"^engine\.max_batch_size: 0; allowed: 1 or more \(pool mode: items"):
        PoolEngine(TinyConvNet(), EngineConfig(kind="pool", max_batch_size=0))


class RegisteredPoolModel(TinyConvNet):
    @classmethod
    def from_config(cls, model_cfg, engine_cfg):
        return cls()


def test_from_config_uses_registry(monkeypatch):
    from omegaconf import OmegaConf

    from appliance.engine import models
    monkeypatch.setitem(models.MODEL_REGISTRY, "TinyConv", (__name__, "RegisteredPoolModel"))
    app = OmegaConf.create({"model": {"architecture": "TinyConv"},
                            "engine": {"kind": "pool", "max_batch_size": 3}})
    engine = PoolEngine.from_config(app)
    assert isinstance(engine.model, RegisteredPoolModel) and engine.cfg.max_batch_size == 3
    out = engine.encode([torch.randn(4, 3, 8, 8)])[0]
    assert out.shape == (4, 4, 8, 8) and engine.num_forwards == 2
    with pytest.raises(ValueError, match="unknown model architecture"):
        PoolEngine.from_config(OmegaConf.create({"model": {"architecture": "Nope"}, "engine": {"kind": "pool"}}))


def test_batches_keep_to_one_kind_of_coordinates_and_pass_them_per_item():
    """Items of requests with the same kind of GeoCoords share a forward, each with its own values;
    a request without coordinates, or with another kind, waits for the next step (FCFS)."""
    from appliance.engine.geo_coords import GeoCoords

    class Recorder(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(1))
            self.calls = []

        def forward(self, x, **coords):
            self.calls.append({k: v.clone() for k, v in coords.items()})
            return x * self.w

    def dated(year, lat=None):
        return GeoCoords(torch.tensor([[year, 1.0]]), None if lat is None else torch.tensor([lat, 0.0]))

    model = Recorder()
    engine = PoolEngine(model, EngineConfig(kind="pool", max_batch_size=8))
    for coords in (dated(2020, 10.0), dated(2021, 20.0), None, dated(2022), dated(2023, 30.0)):
        engine.add_request([torch.zeros(2, 4, 4)], coords=coords)
    while engine.has_unfinished():
        engine.step()
    assert [sorted(call) for call in model.calls] == [["location_coords", "temporal_coords"], [],
                                                      ["temporal_coords"], ["location_coords", "temporal_coords"]]
    assert model.calls[0]["temporal_coords"].tolist() == [[[2020.0, 1.0]], [[2021.0, 1.0]]]  # [B, T, 2]
    assert model.calls[0]["location_coords"].tolist() == [[10.0, 0.0], [20.0, 0.0]]  # [B, 2]
