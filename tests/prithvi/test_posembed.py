"""The fixed sin-cos tables and the reference's resize rule."""
import math

import numpy as np
import pytest
import torch

from appliance.engine.models.prithvi.posembed import resize_pos_table, sincos_1d, sincos_3d_table


def test_1d_encoding_formula():
    table = sincos_1d(8, np.array([0.0, 3.0]))
    assert table.shape == (2, 8)
    assert np.allclose(table[0], [0, 0, 0, 0, 1, 1, 1, 1])
    omega = [1.0, 10000 ** -0.25, 10000 ** -0.5, 10000 ** -0.75]
    assert np.allclose(table[1], [math.sin(3 * w) for w in omega] + [math.cos(3 * w) for w in omega])


def test_3d_table_layout():
    dim, grid = 32, (2, 3, 4)
    table = sincos_3d_table(dim, grid)
    assert table.shape == (1, 1 + 24, dim)
    assert torch.equal(table[0, 0], torch.zeros(dim))  # CLS row
    # Token (t=1, h=2, w=3) is row 1 + 1*12 + 2*4 + 3; channels: 12 for w, 12 for h, 8 for t.
    row = table[0, 1 + 12 + 8 + 3]
    assert torch.allclose(row[:12], torch.from_numpy(sincos_1d(12, np.array([3]))[0]).float())
    assert torch.allclose(row[12:24], torch.from_numpy(sincos_1d(12, np.array([2]))[0]).float())
    assert torch.allclose(row[24:], torch.from_numpy(sincos_1d(8, np.array([1]))[0]).float())


def test_embed_dim_must_be_a_multiple_of_16():
    with pytest.raises(ValueError, match="multiple of 16"):
        sincos_3d_table(40, (1, 2, 2))


def test_resize_is_identity_on_the_base_grid():
    table = sincos_3d_table(64, (1, 14, 14))
    assert resize_pos_table(table, (1, 14, 14), (1, 14, 14)) is table


@pytest.mark.parametrize("grid", [(1, 4, 6), (1, 32, 32), (1, 16, 16)])
def test_resized_table_differs_from_one_computed_at_the_new_size(grid):
    table = sincos_3d_table(192, (1, 14, 14))
    resized = resize_pos_table(table, (1, 14, 14), grid)
    assert resized.shape == (1, 1 + grid[1] * grid[2], 192)
    assert torch.equal(resized[:, 0], table[:, 0])
    # align_corners=True keeps the corner tokens exactly.
    assert torch.allclose(resized[0, 1], table[0, 1]) and torch.allclose(resized[0, -1], table[0, -1])
    assert (resized - sincos_3d_table(192, grid)).abs().max() > 0.5


def test_other_frame_counts_rebuild_then_resize():
    base = sincos_3d_table(64, (1, 14, 14))
    resized = resize_pos_table(base, (1, 14, 14), (3, 14, 14))
    assert torch.allclose(resized, sincos_3d_table(64, (3, 14, 14)))
