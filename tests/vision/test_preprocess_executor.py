"""The preprocessing pool: same results as inline, the event loop stays free, user errors come back."""
import asyncio
import time

import pytest
import torch

from appliance.config.schema import ServerConfig
from appliance.errors import ConfigError, InputError
from appliance.fetch import FetchPolicy
from appliance.vision.clip_preprocess import ClipPreprocessConfig, clip_preprocess
from appliance.vision.image_load import load_image
from appliance.vision.preprocess_executor import PreprocessExecutor

from .helpers import CLIP_336, photo_like

CFG = ClipPreprocessConfig.from_dict(CLIP_336)


def test_thread_pool_from_asyncio_keeps_the_loop_free():
    images = [photo_like(640, 480, seed=i) for i in range(4)]

    async def main(pool):
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        tick_task = asyncio.create_task(ticker())
        results = await asyncio.gather(*(pool.run(clip_preprocess, im, CFG) for im in images))
        tick_task.cancel()
        return results, ticks

    with PreprocessExecutor(workers=2) as pool:
        results, ticks = asyncio.run(main(pool))
    assert ticks > 1  # the loop kept running while the workers resized
    for image, result in zip(images, results):
        assert torch.equal(result, clip_preprocess(image, CFG))


def test_user_errors_come_back_unchanged():
    with PreprocessExecutor(workers=1) as pool:
        with pytest.raises(InputError, match="not an image"):
            limits = ServerConfig().limits
            pool.submit(load_image, b"junk", max_bytes=limits.max_media_bytes,
                        max_image_pixels=limits.max_image_pixels,
                        fetch_policy=FetchPolicy.from_server_config(ServerConfig())).result()


@pytest.mark.slow
def test_process_pool_gives_the_same_result():
    image = photo_like(320, 240)
    with PreprocessExecutor(workers=1, kind="process") as pool:
        start = time.monotonic()
        result = pool.submit(clip_preprocess, image, CFG).result(timeout=120)
    assert torch.equal(result, clip_preprocess(image, CFG)), time.monotonic() - start


def test_bad_pool_settings():
    with pytest.raises(ConfigError, match="allowed: thread, process"):
        PreprocessExecutor(kind="fiber")
    with pytest.raises(ConfigError, match="workers"):
        PreprocessExecutor(workers=-1)
