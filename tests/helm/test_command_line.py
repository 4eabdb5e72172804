"""The container's command line, exactly as rendered, composes: `appliance check` runs with it (the
ConfigMap's files written where the pod would see them, under a temporary root). `check` is static, so
CUDA and TP=2 command lines check here too. A bad override fails here, not in the cluster."""
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from appliance.config.compose import compose
from tests.conftest import REPO, assert_user_error, run_cli
from tests.helm.conftest import PROFILES, by_kind, container, helm_test_pod, manifests, pod_spec, profile_values

SAMPLES = REPO / "appliance" / "assets" / "samples"
SHIM = """#!/bin/sh
exec "{python}" -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@"
"""


def lay_out_config_files(docs, root: Path) -> dict:
    """Write the ConfigMap's files where the pod mounts them, below `root`; return the container's
    APPLIANCE_* environment with its paths moved below `root` too."""
    pod, main = pod_spec(docs), container(docs)
    config_maps = {doc["metadata"]["name"]: doc["data"] for doc in docs if doc["kind"] == "ConfigMap"}
    mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
    for volume in pod["volumes"]:
        if "configMap" in volume:
            data = config_maps[volume["configMap"]["name"]]
            for item in volume["configMap"]["items"]:
                target = root / mounts[volume["name"]].lstrip("/") / item["path"]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(data[item["key"]])
    return {e["name"]: str(root / e["value"].lstrip("/")) for e in main["env"]
            if e["name"].startswith("APPLIANCE_") and e.get("value", "").startswith("/")}


def command_lines(docs, tmp_path: Path):
    """The appliance argument lists the workload runs: the Deployment's args, or for the Job what its
    shell script `exec`s for each completion index (run through /bin/sh with `appliance` a recorder)."""
    kinds = by_kind(docs)
    main = container(docs)
    if "Deployment" in kinds or "Job/assemble" in kinds:  # a search's indexes run one command line
        assert main["command"] == ["appliance"]
        return [main["args"]]
    shim = tmp_path / "bin" / "appliance"
    shim.parent.mkdir()
    shim.write_text(SHIM.format(python=sys.executable))
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    (script,) = main["args"]
    lines = []
    for index in range(kinds["Job"]["spec"]["completions"]):
        env = {"PATH": f"{shim.parent}{os.pathsep}{os.environ['PATH']}", "JOB_COMPLETION_INDEX": str(index)}
        done = subprocess.run([*main["command"], script], env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        lines.append(json.loads(done.stdout))
    return lines


def check(args, env):
    verb, *overrides = args
    assert verb in ("serve", "run", "check")
    return run_cli("check", *overrides, env=env, timeout=120)


def inputs_below(args, root: Path) -> list:
    """`args` with the volume's /data inputs and output moved below `root`, each input there a copy of a
    sample scene the model takes (`check` reads a run's local scenes as the run does; URLs it leaves to the
    run)."""
    pipeline = next(arg.split("=", 1)[1] for arg in args if arg.startswith("pipeline="))
    moved = []
    for arg in args:
        if arg.startswith("input="):
            for scene in json.loads(arg.split("=", 1)[1]):
                for position, path in enumerate(scene):
                    if path.startswith("/data/"):
                        target = root / path.lstrip("/")
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(sample_scene(pipeline, len(scene), position), target)
        if arg.startswith(("input=", "output=")):
            arg = arg.replace('"/data/', f'"{root}/data/')
        moved.append(arg)
    return moved


def sample_scene(pipeline: str, files: int, position: int) -> Path:
    """A shipped sample standing in for file `position` of a scene of `files` files."""
    if pipeline == "prithvi_crops":
        return SAMPLES / (f"crops_sample_date{position + 1}.tif" if files > 1 else "crops_sample_stacked.tif")
    return SAMPLES / f"{pipeline.removeprefix('prithvi_')}_sample.tif"


def input_arg(scenes) -> str:
    """`input=` as the chart renders batch.inputs: every scene a list (a lone file a list of one), every file
    double-quoted, volume paths below /data."""
    def quoted(path):
        return f'"{path}"' if "://" in path else f'"/data/{path}"'

    lists = [scene if isinstance(scene, list) else [scene] for scene in scenes]
    return "input=[%s]" % ",".join("[" + ",".join(map(quoted, files)) + "]" for files in lists)


def helm_test_args(docs) -> list:
    """What the `helm test` pod runs; asserted to be the workload's command line with the verb `check`
    (for a Job: `run`'s over every input, the indexes' shares joined in the order of batch.inputs)."""
    (checker,) = helm_test_pod(docs)["spec"]["containers"]
    assert checker["command"] == ["appliance"]
    return checker["args"]


SEARCHES = [p for p in PROFILES if profile_values(p).get("batch", {}).get("search")]


@pytest.mark.parametrize("profile", [p for p in PROFILES if p not in SEARCHES])
def test_the_rendered_command_line_checks(chart, profile, tmp_path):
    """The workload's command lines and the `helm test` pod's, each run through `appliance check`."""
    docs = manifests(chart, profile_values(profile))
    env = lay_out_config_files(docs, tmp_path / "root")
    lines = command_lines(docs, tmp_path)
    hook = helm_test_args(docs)
    if "Deployment" in by_kind(docs):
        (serve,) = lines
        assert hook == ["check", *serve[1:]], "helm test checks what the server runs"
    else:
        inputs = profile_values(profile)["batch"]["inputs"]
        assert [a for a in hook if a.startswith("input=")] == [input_arg(inputs)]
        def without_input(command):
            return [a for a in command[1:] if not a.startswith("input=")]
        for run in lines:
            assert without_input(hook) == without_input(run)
    distinct = {tuple(["check", *args[1:]]) for args in [*lines, hook]}
    for args in distinct:
        result = check(inputs_below(list(args), tmp_path / "root"), env)
        assert result.returncode == 0, (args, result.stderr)
        assert result.stdout.startswith("ok: pipeline "), result.stdout


def test_the_batch_indexes_share_the_inputs(chart, tmp_path):
    values = profile_values("prithvi-flood-batch")
    lines = command_lines(manifests(chart, values), tmp_path)
    shares = [[a for a in args if a.startswith("input=")] for args in lines]
    inputs = values["batch"]["inputs"]
    assert shares == [[input_arg([inputs[0], inputs[2]])], [input_arg([inputs[1]])]]
    for args in lines:
        assert args[:2] == ["run", "pipeline=prithvi_flood"]
        assert args[-2:] == values["overrides"], "the overrides come last, verbatim"
        assert 'output="/data/masks/2024-07"' in args


def test_url_inputs_are_read_in_place_with_credentials_from_a_secret(chart, tmp_path):
    values = profile_values("prithvi-flood-object-storage")
    docs = manifests(chart, values)
    lines = command_lines(docs, tmp_path)
    urls = values["batch"]["inputs"]
    assert [[a for a in args if a.startswith("input=")] for args in lines] == [[f'input=[["{urls[0]}"]]'],
                                                                             [f'input=[["{urls[1]}"]]']]
    cfg = compose(lines[0][1:])
    assert OmegaConf.to_container(cfg.input) == [[urls[0]]] and list(cfg.aoi) == [-91.2, 29.9, -90.9, 30.2]
    assert container(docs)["envFrom"] == [{"secretRef": {"name": "object-storage-credentials"}}]


def test_paths_with_spaces_and_commas_survive_the_shell_and_hydra(chart, tmp_path):
    values = {"mode": "batch", "batch": {"inputs": ["a b.tif", "c,d.tif"], "output": "out dir", "volume": "v"}}
    (args,) = command_lines(manifests(chart, values), tmp_path)
    cfg = compose(args[1:])
    assert OmegaConf.to_container(cfg.input) == [["/data/a b.tif"], ["/data/c,d.tif"]]
    assert cfg.output == "/data/out dir"


def test_the_chart_knows_which_shipped_pipelines_pool(chart):
    """test_chart's GPU cases name every conf/pipeline/ file; their composed engine kinds are these."""
    for pipeline, kind in [("llava_chat", "generate"), ("llava_encode", "pool"), ("prithvi_flood", "pool"),
                           ("prithvi_burn_scars", "pool"), ("prithvi_crops", "pool")]:
        args = container(manifests(chart, {"pipeline": pipeline, "gpu": {"count": 1}}))["args"]
        cfg = compose(args[1:])
        assert (cfg.engine.kind.value, cfg.engine.device) == (kind, "cuda")
    shipped = {p.stem for p in (Path(__file__).parents[2] / "conf" / "pipeline").glob("*.yaml")}
    assert shipped == {"llava_chat", "llava_encode", "prithvi_flood", "prithvi_burn_scars", "prithvi_crops"}, \
        "add the new pipeline to these cases"


def test_a_bad_override_fails_the_check(chart, tmp_path):
    values = {**profile_values("default"), "overrides": ["engine.block_sizee=16"]}
    (args,) = command_lines(manifests(chart, values), tmp_path)
    assert_user_error(check(args, {}), "engine.block_sizee", "unknown key")


def test_helm_test_fails_on_a_bad_override_and_on_missing_weights(chart):
    """What `helm test` shows when the pod's arguments cannot work: the override, the path, the input named."""
    values = {**profile_values("prithvi-flood-batch"), "overrides": ["pipeline.stages.tile.overlapp=64"]}
    docs = manifests(chart, values)
    assert_user_error(check(helm_test_args(docs), {}), "pipeline.stages.tile.overlapp")
    docs = manifests(chart, {"pipeline": "llava_chat", "model": {"existingClaim": "weights"},
                             "overrides": ["model=llava_1_5_7b", "model.path=/models/llava-1.5-7b-hf"]})
    assert_user_error(check(helm_test_args(docs), {}), "model.path: /models/llava-1.5-7b-hf is not a directory")
    docs = manifests(chart, profile_values("prithvi-flood-batch"))  # its scenes are not on this volume
    assert_user_error(check(helm_test_args(docs), {}), "/data/sentinel2/2024-07-01_T32ULC.tif: no such file")


def test_an_unknown_pipeline_fails_the_check(chart, tmp_path):
    (args,) = command_lines(manifests(chart, {"pipeline": "flood"}), tmp_path)
    assert_user_error(check(args, {}), "pipeline=flood: no such pipeline")


def test_the_crops_job_runs_dates_and_stacked_files_as_scenes(chart, tmp_path):
    """prithvi_crops's Job, its command lines run for real (the volume's /data below tmp_path): a scene given
    as its three dates and one given as the stacked file of the same dates make one map each, the same."""
    import numpy as np
    import rasterio

    samples = Path(__file__).parents[2] / "appliance" / "assets" / "samples"
    files = [samples / f"crops_sample_date{i}.tif" for i in (1, 2, 3)] + [samples / "crops_sample_stacked.tif"]
    data = tmp_path / "root" / "data"
    (data / "crops").mkdir(parents=True)
    for path in files:
        (data / "crops" / path.name).write_bytes(path.read_bytes())
    dates, stacked = [f"crops/{p.name}" for p in files[:3]], f"crops/{files[3].name}"
    values = {"mode": "batch", "pipeline": "prithvi_crops", "overrides": ["pipeline.stages.stitch.progress=false"],
              "batch": {"inputs": [dates, stacked], "output": "maps", "volume": "v", "parallelism": 2}}
    lines = command_lines(manifests(chart, values), tmp_path)
    assert [[a for a in args if a.startswith("input=")] for args in lines] == [[input_arg([dates])],
                                                                             [input_arg([stacked])]]
    for args in lines:
        result = run_cli(*[a.replace('"/data/', f'"{data}/') for a in args], timeout=300, env={"OMP_NUM_THREADS": "1"})
        assert result.returncode == 0, result.stderr
        assert result.stdout.count("wrote ") == 1, result.stdout  # one scene each
    with rasterio.open(data / "maps" / "crops_sample_date1.mask.tif") as a, \
            rasterio.open(data / "maps" / "crops_sample_stacked.mask.tif") as b:
        listed, from_stack = a.read(1), b.read(1)
    assert np.array_equal(listed, from_stack) and len(set(np.unique(listed)) - {255}) >= 5


@pytest.mark.parametrize("profile", SEARCHES)
def test_a_searchs_command_lines_compose_to_its_values(chart, profile):
    """A search's lines are composed, every key and rule checked, not run through `check`: that would search
    the profile's API (test_region_shares runs the same lines against a local one)."""
    values = profile_values(profile)
    docs = manifests(chart, values)
    (run,) = command_lines(docs, None)
    assemble = by_kind(docs)["Job/assemble"]["spec"]["template"]["spec"]["containers"][0]["args"][2:]
    hook = helm_test_args(docs)
    shares = f"search.shares={values['batch']['parallelism']}"
    assert run[0] == "run" and assemble[0] == "assemble" and hook[0] == "check"
    assert shares in run and shares in assemble and shares not in hook, "check lists the whole search"
    assert [a for a in run[1:] if a != shares] == hook[1:], "helm test checks what the indexes run"
    assert "overwrite=true" not in run, "a retried index resumes: it skips its complete scenes"
    for args in (run, assemble, hook):
        cfg = compose(args[1:])
        search = OmegaConf.to_container(cfg.search)
        assert {key: search[key] for key in values["batch"]["search"]} == values["batch"]["search"]
        assert search["shares"] == (values["batch"]["parallelism"] if shares in args else 1)
        assert search["share"] is None, "each pod's share is its $JOB_COMPLETION_INDEX"
        assert cfg.output == f"/data/{values['batch']['output']}"
        assert cfg.pipeline.stages.region.mosaic_rule == "max_class", "the overrides reach every Job"
