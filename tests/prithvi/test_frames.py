"""A multi-date Prithvi segmentation model (num_frames T > 1) folds time into channels before the decoder,
as terratorch's ReshapeTokensToImage(effective_time_dim=T) does: tokens [B, 1 + T*h*w, D] become maps
[B, T*D, h, w] with channels ordered (t, d), so the pyramid and UperNet see T x embed_dim channels."""
import torch

from appliance.config.compose import compose
from appliance.engine.models.prithvi import build_prithvi_segmentation
from appliance.engine.models.prithvi.decoder import TokensToImage


def test_tokens_to_image_orders_channels_time_then_embedding():
    b, t, h, w, d = 1, 3, 2, 2, 4
    tokens = torch.arange(t * h * w * d, dtype=torch.float32).reshape(b, t * h * w, d)
    with_cls = torch.cat([torch.full((b, 1, d), -1.0), tokens], dim=1)
    image = TokensToImage()([with_cls], (t, h, w))[0]
    assert image.shape == (b, t * d, h, w)
    for frame in range(t):  # channels frame*d .. frame*d + d - 1 are frame `frame`'s embedding
        expected = tokens[0, frame * h * w:(frame + 1) * h * w].reshape(h, w, d).permute(2, 0, 1)
        assert torch.equal(image[0, frame * d:(frame + 1) * d], expected)


def test_a_three_date_model_sees_every_date():
    cfg = compose(["pipeline=prithvi_crops"]).model
    torch.manual_seed(0)
    model = build_prithvi_segmentation(cfg.prithvi, in_chans=len(cfg.geo.bands)).eval()
    assert model.encoder.out_channels == 3 * cfg.prithvi.embed_dim
    assert model.neck[2].fpn3[0].__class__.__name__ == "Identity"
    assert model.decoder.psp_modules[0][1].conv.in_channels == 3 * cfg.prithvi.embed_dim // 1
    x = torch.randn(2, 6, 3, 64, 64)
    with torch.no_grad():
        logits = model(x)
        swapped = model(x[:, :, [2, 1, 0]])
    assert logits.shape == (2, 13, 64, 64)
    assert not torch.allclose(logits, swapped)  # the order of the dates matters
