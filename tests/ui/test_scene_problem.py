"""How the map page says a server's refusal of a scene (appliance/serving/ui/static/scene_problem.js), run by
Node (skipped where it is missing): the field the API names (`param`) becomes the file the person chose."""
import json
import shutil
import subprocess

import pytest

from appliance.serving.ui.routes import STATIC

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")
PNG = "is a PNG file, not a GeoTIFF; convert it (gdal_translate -of GTiff)"

# (case, the error {status, message, param}, the chosen files' names, what the page says)
CASES = [
    ("one_file", {"status": 400, "message": f"body: {PNG}", "param": "body"}, ["star.png"], f"star.png: {PNG}"),
    ("second_date", {"status": 400, "message": f"files[1]: {PNG}", "param": "files[1]"}, ["a.tif", "b.png", "c.tif"],
     f"b.png: {PNG}"),
    ("a_url", {"status": 400, "message": "url: unreachable", "param": "url"}, [], "url: unreachable"),
    ("no_param", {"status": 413, "message": "body: the request is 9 MiB", "param": None}, ["big.tif"],
     "body: the request is 9 MiB"),
    ("body_of_several", {"status": 400, "message": "body: not a form", "param": "body"}, ["a.tif", "b.tif"],
     "body: not a form"),
    ("server_failure", {"status": 500, "message": "the server failed", "param": None}, ["a.tif"],
     "500: the server failed"),
]


@pytest.mark.parametrize("error, names, said", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_refusal_names_the_chosen_file(tmp_path, error, names, said):
    module = tmp_path / "scene_problem.mjs"  # .mjs: Node reads it as an ES module
    module.write_text((STATIC / "scene_problem.js").read_text())
    script = (f"import {{ sceneProblem }} from {json.dumps(module.as_uri())};\n"
              f"console.log(JSON.stringify(sceneProblem({json.dumps(error)}, {json.dumps(names)})));")
    done = subprocess.run([NODE, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == said
