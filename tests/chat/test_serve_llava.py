"""`appliance serve pipeline=llava_chat` with the embedded tiny LLaVA, as a real server process."""
import base64
import shutil

import httpx

from tests.conftest import REPO
from tests.server_process import running_server

SAMPLE = REPO / "appliance" / "assets" / "samples" / "orange_star.png"


def test_serve_llava_chat_answers_about_an_image_under_the_allowed_dir(tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    shutil.copy(SAMPLE, media / "star.png")
    with running_server("pipeline=llava_chat", f"server.allowed_local_media_dir={media}", cwd=tmp_path) as base:
        answer = httpx.post(f"{base}/predict", json={"input": "star.png", "prompt": "What color is the shape?"},
                            timeout=120)
        assert answer.status_code == 200, answer.text
        (result,) = answer.json()["results"]
        assert "orange" in result["display"].lower(), result

        shape = httpx.post(f"{base}/predict", json={"input": "star.png", "prompt": "What shape is this?"},
                           timeout=120)
        assert shape.status_code == 200 and "star" in shape.json()["results"][0]["display"].lower(), shape.text

        missing = httpx.post(f"{base}/predict", json={"input": "nope.png", "prompt": "Hi?"}, timeout=60)
        assert missing.status_code == 422 and "nope.png" in missing.json()["detail"], missing.text
        outside = httpx.post(f"{base}/predict", json={"input": str(SAMPLE), "prompt": "Hi?"}, timeout=60)
        assert outside.status_code == 422 and "outside the allowed directory" in outside.json()["detail"]


def test_serve_llava_chat_with_no_other_argument_takes_data_urls_and_refuses_paths(tmp_path):
    data_url = "data:image/png;base64," + base64.b64encode(SAMPLE.read_bytes()).decode()
    with running_server("pipeline=llava_chat", cwd=tmp_path) as base:
        answer = httpx.post(f"{base}/predict", json={"input": data_url, "prompt": "What color is the shape?"},
                            timeout=120)
        assert answer.status_code == 200, answer.text
        assert "orange" in answer.json()["results"][0]["display"].lower(), answer.text
        path = httpx.post(f"{base}/predict", json={"input": str(SAMPLE), "prompt": "Hi?"}, timeout=60)
        assert path.status_code == 422 and "allowed_local_media_dir" in path.json()["detail"], path.text
        broken = httpx.post(f"{base}/predict", json={"input": "data:image/png;base64,AAAA", "prompt": "Hi?"},
                            timeout=60)
        assert broken.status_code == 422 and "input" in broken.json()["detail"], broken.text
