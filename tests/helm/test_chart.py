"""Lint and render every profile in helm/appliance/ci/, validate each object against Kubernetes 1.33's
schemas (strict: unknown fields fail), and check what each mode renders."""
import importlib.resources
import json
import re
import subprocess

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.helm.conftest import (CHART, KUBERNETES, PROFILES, by_kind, container, helm_test_pod, manifests,
                                 pod_spec, profile_values, render_files)

KINDS = {  # each with the Pod `helm test` runs
    "default": {"Deployment", "Service", "Pod"},
    "llava-chat": {"Deployment", "Service", "ServiceMonitor", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                   "ConfigMap", "Pod"},
    "prithvi-flood-batch": {"Job", "Pod"},
    "prithvi-crops-batch": {"Job", "Pod"},
    "prithvi-flood-object-storage": {"Job", "Pod"},
    "prithvi-flood-region": {"Job", "Job/assemble", "Pod"},
    "extra-config": {"Deployment", "Service", "ConfigMap", "Pod"},
    "ingress": {"Deployment", "Service", "Ingress", "Pod"},
}


def test_the_profiles_are_the_ones_described():
    assert set(PROFILES) == set(KINDS)


@pytest.mark.parametrize("profile", PROFILES)
def test_lint_strict(profile):
    report = helm_python.lint(CHART, profile_values(profile), strict=True, kube_version=f"v{KUBERNETES}.0")
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize("profile", PROFILES)
def test_every_object_is_valid_kubernetes(chart, profile):
    docs = manifests(chart, profile_values(profile))
    assert set(by_kind(docs)) == KINDS[profile]
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            check_service_monitor(doc)
        else:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def check_service_monitor(doc):
    """A custom resource, not in Kubernetes' schemas: the fields the chart uses, as prometheus-operator's
    CRD (monitoring.coreos.com/v1) defines them, nothing else; metadata and selector are Kubernetes'."""
    folder = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    defs = json.loads((folder / f"v{KUBERNETES}.0-local-strict" / "_definitions.json").read_text())["$defs"]
    duration = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
    endpoint = {"type": "object", "additionalProperties": False, "properties": {
        "port": {"type": "string"}, "path": {"type": "string", "pattern": "^/"},
        "interval": {"type": "string", "pattern": duration}, "scrapeTimeout": {"type": "string", "pattern": duration},
        "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]}, "honorLabels": {"type": "boolean"}}}
    schema = {
        "$defs": defs, "type": "object", "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
            "metadata": {"$ref": "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
            "spec": {"type": "object", "additionalProperties": False, "required": ["selector", "endpoints"],
                     "properties": {
                         "selector": {"$ref": "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector"},
                         "jobLabel": {"type": "string"},
                         "endpoints": {"type": "array", "minItems": 1, "items": endpoint}}}}}
    jsonschema.Draft202012Validator(schema).validate(doc)


def test_serve_mode(chart):
    values = profile_values("llava-chat")
    docs = manifests(chart, values)
    kinds = by_kind(docs)
    pod, main = pod_spec(docs), container(docs)
    pod_labels = kinds["Deployment"]["spec"]["template"]["metadata"]["labels"]
    def selects(selector):
        return selector.items() <= pod_labels.items()

    # The Service reaches the pods on the named port; the ServiceMonitor scrapes that Service's port.
    service = kinds["Service"]["spec"]
    assert selects(service["selector"]) and selects(kinds["Deployment"]["spec"]["selector"]["matchLabels"])
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["ports"]] == [("http", 8000, "http")]
    assert main["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    monitor = kinds["ServiceMonitor"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= kinds["Service"]["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"

    # Probes: startup waits for /ready (weights loaded) for server.startupTimeoutSeconds; then liveness.
    assert main["startupProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    startup = main["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    assert main["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}

    # Drain: the pod outlives the pre-stop pause plus the server's drain time.
    assert "server.drain_timeout_s=30" in main["args"]
    assert pod["terminationGracePeriodSeconds"] > 30 + main["lifecycle"]["preStop"]["sleep"]["seconds"]

    # The API key comes from the Secret; two GPUs, the CUDA engine, TP 2; three replicas left to the HPA.
    env = {e["name"]: e for e in main["env"]}
    assert env["APPLIANCE_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "appliance-api-key", "key": "api-key"}
    assert main["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert main["args"][:6] == ["serve", "pipeline=llava_chat", "server.host=0.0.0.0", "server.port=8000",
                                "server.drain_timeout_s=30", "engine=cuda"]
    assert main["args"][6:] == values["overrides"], "the overrides come last, verbatim"
    assert main["image"] == "appliance:0.1.0-cuda"
    assert "replicas" not in kinds["Deployment"]["spec"], "the HPA owns the replica count"
    hpa = kinds["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == kinds["Deployment"]["metadata"]["name"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (3, 8)
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "appliance_num_requests_waiting"
    assert selects(kinds["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"])

    # The Grafana dashboard, for the sidecar.
    dashboard = kinds["ConfigMap"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard_file = json.loads((CHART / "dashboards/appliance.json").read_text())
    assert json.loads(dashboard["data"]["appliance.json"]) == dashboard_file


def test_vllm_metric_names_reach_the_server_the_autoscaler_and_the_dashboard(chart):
    values = {**profile_values("llava-chat"), "metrics": {"names": "vllm", "grafanaDashboard": {"enabled": True}}}
    kinds = by_kind(manifests(chart, values))
    assert "server.metrics_names=vllm" in container(list(kinds.values()))["args"]
    hpa = kinds["HorizontalPodAutoscaler"]["spec"]
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "vllm:num_requests_waiting"
    dashboard = kinds["ConfigMap"]["data"]["appliance.json"]
    assert "vllm:time_to_first_token_seconds_bucket" in dashboard and "vllm:kv_cache_usage_perc" in dashboard
    assert "appliance_tiles_total" in dashboard  # a series vLLM does not have keeps its name
    assert "appliance_time_to_first_token" not in dashboard and "appliance_num_requests" not in dashboard
    json.loads(dashboard)


@pytest.mark.parametrize("profile", PROFILES)
def test_locked_down_and_writable_where_the_appliance_writes(chart, profile):
    docs = manifests(chart, profile_values(profile))
    pod, main = pod_spec(docs), container(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    security = main["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"] == {"medium": "Memory"}
    for variable in ("TMPDIR", "HF_HOME", "TRITON_CACHE_DIR", "HOME"):  # spool, metrics, caches
        writable = [path for path, m in mounts.items() if env[variable].startswith(path) and not m.get("readOnly")]
        assert writable and "emptyDir" in volumes[mounts[writable[0]]["name"]], variable
    assert "XDG_CACHE_HOME" not in env, "the image's (read-only) cache holds the CPU kernels it built"


@pytest.mark.parametrize("profile", PROFILES)
def test_helm_test_checks_in_the_workloads_pod(chart, profile):
    """`helm test` runs `appliance check` as the workload's container would run: its image, env, mounts,
    volumes, security and scheduling; a GPU-free pod (`check` loads no weights). Its arguments are
    compared in test_command_line, where they are checked."""
    docs = manifests(chart, profile_values(profile))
    pod, main = pod_spec(docs), container(docs)
    hook = helm_test_pod(docs)
    assert hook["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation"
    assert hook["metadata"]["labels"]["app.kubernetes.io/component"] == "check", "no Service selects it"
    (checker,) = hook["spec"]["containers"]
    for key in ("image", "imagePullPolicy", "env", "volumeMounts", "securityContext"):
        assert checker.get(key) == main.get(key), key
    assert checker["command"] == ["appliance"], "no shell: the arguments as rendered"
    for key in ("volumes", "securityContext", "nodeSelector", "tolerations", "affinity", "imagePullSecrets",
                "automountServiceAccountToken"):
        assert hook["spec"].get(key) == pod.get(key), key
    assert hook["spec"]["restartPolicy"] == "Never"
    assert checker["args"][0] == "check"
    assert set(checker["resources"]["limits"]) == {"memory"}, "no GPU taken from the server's pods"


def test_the_ingress_routes_the_whole_server_under_its_prefix_through_nginx_rewrite(chart):
    values = profile_values("ingress")
    kinds = by_kind(manifests(chart, values))
    ingress = kinds["Ingress"]
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off", "SSE"
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == values["ingress"]["tls"]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "chat.example.com"
    service = kinds["Service"]
    assert [port["name"] for port in service["spec"]["ports"]] == ["http"]
    (path,) = rule["http"]["paths"]
    assert path["backend"] == {"service": {"name": service["metadata"]["name"], "port": {"name": "http"}}}
    assert (path["path"], path["pathType"]) == ("/chat(/|$)(.*)", "ImplementationSpecific")
    # As ingress-nginx applies them: the regex picks what follows the prefix, the rewrite asks the server
    # for that path, and the bare prefix reaches `/`, which the server redirects by X-Forwarded-Prefix.
    assert annotations["nginx.ingress.kubernetes.io/use-regex"] == "true"
    assert annotations["nginx.ingress.kubernetes.io/x-forwarded-prefix"] == "/chat"
    target = annotations["nginx.ingress.kubernetes.io/rewrite-target"]
    for asked, served in [("/chat", "/"), ("/chat/", "/"), ("/chat/index.html", "/index.html"),
                          ("/chat/ui/chat.js", "/ui/chat.js"), ("/chat/v1/chat/completions", "/v1/chat/completions"),
                          ("/chat/docs", "/docs"), ("/chat/openapi.json", "/openapi.json")]:
        match = re.match(path["path"], asked)
        assert match and match.expand(target.replace("$", "\\")) == served, asked
    assert not re.match(path["path"], "/chatter") and not re.match(path["path"], "/v1/models")
    notes = render_files(chart, values)["appliance/templates/NOTES.txt"]
    assert "https://chat.example.com/chat/ " in notes


def test_the_ingress_is_off_by_default_and_routes_every_path_of_any_host_when_only_enabled(chart):
    assert "Ingress" not in by_kind(manifests(chart, {}))
    ingress = by_kind(manifests(chart, {"ingress": {"enabled": True}}))["Ingress"]
    kubernetes_validate.validate(ingress, KUBERNETES, strict=True)
    assert "ingressClassName" not in ingress["spec"] and "tls" not in ingress["spec"], "the cluster's default class"
    assert "annotations" not in ingress["metadata"], "no rewrite at /"
    assert ingress["spec"]["rules"] == [{"http": {"paths": [
        {"path": "/", "pathType": "Prefix",
         "backend": {"service": {"name": "demo-appliance", "port": {"name": "http"}}}}]}}]


def test_the_ingress_routes_every_path_of_each_host(chart):
    values = {"ingress": {"enabled": True, "className": "nginx", "hosts": ["a.example.com", "b.example.com"]}}
    ingress = by_kind(manifests(chart, values))["Ingress"]
    assert [rule["host"] for rule in ingress["spec"]["rules"]] == ["a.example.com", "b.example.com"]
    assert {(p["path"], p["pathType"]) for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]} == {
        ("/", "Prefix")}


def test_a_prefix_with_dots_is_matched_literally(chart):
    values = {"ingress": {"enabled": True, "className": "nginx", "path": "/apps/v1.2"}}
    ingress = by_kind(manifests(chart, values))["Ingress"]
    (path,) = ingress["spec"]["rules"][0]["http"]["paths"]
    assert re.match(path["path"], "/apps/v1.2/docs") and not re.match(path["path"], "/apps/v1x2/docs")


def test_batch_mode(chart):
    values = profile_values("prithvi-flood-batch")
    docs = manifests(chart, values)
    job = by_kind(docs)["Job"]["spec"]
    assert job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"] == 2, "three scenes shared by two indexes"
    pod, main = pod_spec(docs), container(docs)
    assert pod["restartPolicy"] == "Never"
    assert main["command"] == ["/bin/sh", "-c"]
    env = {e["name"]: e for e in main["env"]}
    index_field = env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert index_field == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    data = next(v for v in pod["volumes"] if v["name"] == "data")
    assert data["persistentVolumeClaim"] == {"claimName": "scenes"}
    assert {"name": "data", "mountPath": "/data"} in main["volumeMounts"]
    assert "APPLIANCE_API_KEY" not in env and "ports" not in main


def test_a_search_runs_as_an_indexed_job_of_shares_then_an_assemble_job(chart):
    values = profile_values("prithvi-flood-region")
    docs = manifests(chart, values)
    kinds = by_kind(docs)
    job = kinds["Job"]["spec"]
    assert job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"] == values["batch"]["parallelism"] == 3, "one share an index"
    main = container(docs)
    assert main["command"] == ["appliance"] and main["args"][:2] == ["run", "pipeline=prithvi_flood"]
    assert "search.shares=3" in main["args"]
    assert 'search.url="https://cmr.earthdata.nasa.gov/stac/LPCLOUD"' in main["args"]
    assert "search.bbox=[-91.2,29.9,-90.9,30.2]" in main["args"]
    env = {e["name"]: e for e in main["env"]}
    assert "fieldRef" in env["JOB_COMPLETION_INDEX"]["valueFrom"], "the pod's index picks its share"

    assemble = kinds["Job/assemble"]
    assert assemble["metadata"]["name"] == "demo-appliance-assemble"
    spec = assemble["spec"]
    assert "completionMode" not in spec and spec["activeDeadlineSeconds"] == 86400
    pod = spec["template"]["spec"]
    (assembler,) = pod["containers"]
    assert assembler["command"] == ["/bin/sh", "-c"] and assembler["args"][1:3] == ["appliance", "assemble"]
    assert [a for a in assembler["args"][3:] if a.startswith("search.")] == \
        [a for a in main["args"] if a.startswith("search.")], "the shares' search"
    for key in ("image", "env", "volumeMounts", "securityContext"):
        assert assembler[key] == main[key], key
    assert pod["volumes"] == pod_spec(docs)["volumes"] and pod["securityContext"] == pod_spec(docs)["securityContext"]
    with_gpu = manifests(chart, {**values, "gpu": {"count": 1}})
    assert "nvidia.com/gpu" in container(with_gpu)["resources"]["limits"]
    (assembler,) = by_kind(with_gpu)["Job/assemble"]["spec"]["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in assembler["resources"]["limits"], "assemble loads no model"
    assert not any(a.startswith("engine") for a in assembler["args"])


def test_the_assemble_job_waits_while_scenes_are_missing_and_stops_on_any_other_error(chart, tmp_path):
    """The assemble container's loop, run by /bin/sh with `appliance` and `sleep` recorders: exit 2 (scenes
    not complete) waits and asks again; 0 ends it; any other code fails the pod at once."""
    (assembler,) = by_kind(manifests(chart, profile_values("prithvi-flood-region")))["Job/assemble"]["spec"][
        "template"]["spec"]["containers"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "appliance").write_text(
        '#!/bin/sh\necho "$*" >> "$LOG"\ncode=$(head -n 1 "$CODES"); sed -i 1d "$CODES"; exit "$code"\n')
    (bin_dir / "sleep").write_text('#!/bin/sh\necho "sleep $*" >> "$LOG"\n')
    for shim in bin_dir.iterdir():
        shim.chmod(0o755)
    for codes, expected_code, runs in [([2, 2, 0], 0, 3), ([2, 1], 1, 2), ([0], 0, 1)]:
        log, answers = tmp_path / "log", tmp_path / "codes"
        log.write_text("")
        answers.write_text("".join(f"{c}\n" for c in codes))
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LOG": str(log), "CODES": str(answers)}
        done = subprocess.run([*assembler["command"], *assembler["args"]], env=env, capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == expected_code, done.stderr
        lines = log.read_text().splitlines()
        assert [line for line in lines if line.startswith("assemble ")] == [" ".join(assembler["args"][2:])] * runs
        assert lines.count("sleep 60") == codes[:runs].count(2)


def test_the_server_gets_object_storage_credentials_only_with_its_buckets(chart):
    values = {"pipeline": "prithvi_flood",
              "server": {"s3": {"allowedBuckets": ["hls", "flood.masks-2024"], "credentialsSecret": "s3-creds"}}}
    docs = manifests(chart, values)
    main = container(docs)
    kubernetes_validate.validate(by_kind(docs)["Deployment"], KUBERNETES, strict=True)
    assert main["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]  # the Job's way: AWS_*, GDAL_* from the Secret
    assert main["args"] == ["serve", "pipeline=prithvi_flood", "server.host=0.0.0.0", "server.port=8000",
                            "server.drain_timeout_s=30", "server.allowed_s3_buckets=['hls','flood.masks-2024']"]
    check = helm_test_pod(docs)["spec"]["containers"][0]
    assert "server.allowed_s3_buckets=['hls','flood.masks-2024']" in check["args"], "helm test checks the same"

    # buckets without a Secret: the pod's own identity (IRSA) or anonymous reads; no buckets: no s3 at all
    only_buckets = container(manifests(chart, {"server": {"s3": {"allowedBuckets": ["hls"]}}}))
    assert "envFrom" not in only_buckets and "server.allowed_s3_buckets=['hls']" in only_buckets["args"]
    default = container(manifests(chart, {}))
    assert "envFrom" not in default and not any("allowed_s3_buckets" in a for a in default["args"])
    # the batch Job keeps its own Secret (batch.credentialsSecret); server.s3 is the Deployment's
    batch = container(manifests(chart, profile_values("prithvi-flood-object-storage")))
    assert batch["envFrom"] == [{"secretRef": {"name": "object-storage-credentials"}}]


def test_the_server_allows_the_listed_origins_only(chart):
    origins = ["https://app.example.com", "http://localhost:5173"]
    docs = manifests(chart, {"server": {"corsOrigins": origins}})
    expected = "server.cors_origins=['https://app.example.com','http://localhost:5173']"
    assert expected in container(docs)["args"]
    assert expected in helm_test_pod(docs)["spec"]["containers"][0]["args"], "helm test checks the same"
    assert not any("cors_origins" in arg for arg in container(manifests(chart, {}))["args"])


def test_model_weights_mount_read_only(chart):
    main = container(manifests(chart, {"model": {"existingClaim": "weights", "subPath": "llava"}}))
    pod = pod_spec(manifests(chart, {"model": {"existingClaim": "weights", "subPath": "llava"}}))
    assert {"name": "model", "mountPath": "/models", "readOnly": True, "subPath": "llava"} in main["volumeMounts"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}} in pod["volumes"]
    pod = pod_spec(manifests(chart, {"model": {"hostPath": "/srv/models", "mountPath": "/weights"}}))
    assert {"name": "model", "hostPath": {"path": "/srv/models", "type": "Directory"}} in pod["volumes"]
    assert all(v["name"] != "model" for v in pod_spec(manifests(chart, {}))["volumes"]), "none: embedded models"


def test_extra_config_is_mounted_read_only_and_on_the_search_path(chart):
    values = profile_values("extra-config")
    docs = manifests(chart, values)
    pod, main = pod_spec(docs), container(docs)
    config_map = by_kind(docs)["ConfigMap"]
    volume = next(v for v in pod["volumes"] if v["name"] == "extra-config")["configMap"]
    assert volume["name"] == config_map["metadata"]["name"]
    files = {item["path"]: config_map["data"][item["key"]] for item in volume["items"]}
    assert files == values["extraConfig"], "every file, at its path, with its text"
    mount = next(m for m in main["volumeMounts"] if m["name"] == "extra-config")
    assert mount["readOnly"] is True
    assert {"name": "APPLIANCE_EXTRA_CONF_DIR", "value": mount["mountPath"]} in main["env"]
    annotations = by_kind(docs)["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert re.fullmatch(r"[0-9a-f]{64}", annotations["checksum/extra-config"]), "pods roll when the files change"


@pytest.mark.parametrize("pipeline, choose, kind", [
    ("llava_chat", "engine=cuda", "generate"),
    ("llava_encode", "engine.device=cuda", "pool"),
    ("prithvi_flood", "engine.device=cuda", "pool"),
])
def test_gpus_select_the_cuda_engine_of_the_pipelines_kind(chart, pipeline, choose, kind):
    """The chart's table of pooling pipelines agrees with conf/pipeline/ (composed in test_command_line)."""
    main = container(manifests(chart, {"pipeline": pipeline, "gpu": {"count": 1}}))
    assert main["args"][5] == choose and main["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert container(manifests(chart, {"pipeline": pipeline}))["args"][5:] == [], "no GPU: the pipeline's engine"


def test_an_engine_group_in_the_overrides_keeps_the_users_choice(chart):
    main = container(manifests(chart, {"pipeline": "llava_chat", "gpu": {"count": 1}, "overrides": ["engine=pool"]}))
    assert main["args"][5:] == ["engine.device=cuda", "engine=pool"]


def test_an_extra_config_pipeline_gets_its_engine_kind_from_its_defaults(chart):
    values = {**profile_values("extra-config"), "gpu": {"count": 1}}
    assert container(manifests(chart, values))["args"][5] == "engine.device=cuda"
    values["extraConfig"] = {"pipeline/chat2.yaml": "# @package _global_\ndefaults:\n  - override /engine: gen2\n",
                             "engine/gen2.yaml": "kind: generate\nmax_num_seqs: 8\n"}
    assert container(manifests(chart, {**values, "pipeline": "chat2"}))["args"][5] == "engine=cuda"


@pytest.mark.parametrize("values, message", [
    ({"gpu": {"count": 1}, "overrides": ["engine.tensor_parallel_size=2"]},
     "engine.tensor_parallel_size=2 needs gpu.count >= 2 (got 1)"),
    ({"model": {"existingClaim": "w", "hostPath": "/w"}}, "model: give existingClaim or hostPath, not both"),
    ({"mode": "batch", "batch": {"volume": "v", "output": "o"}}, "batch.inputs: mode=batch needs"),
    ({"mode": "batch", "batch": {"inputs": ["a.tif"], "search": {"url": "https://stac.example.com"}, "volume": "v",
                                 "output": "o"}}, "batch.search: give batch.inputs (a list of scenes) or"),
    ({"mode": "batch", "batch": {"search": {"datetime": "2024-06-01"}, "volume": "v", "output": "o"}},
     "batch.search.url: a search needs the STAC API's URL"),
    ({"mode": "batch", "batch": {"inputs": ["a.tif"], "output": "o"}}, "batch.volume: mode=batch needs"),
    ({"mode": "batch", "batch": {"inputs": ["a.tif"], "volume": "v", "output": "out.tif"}},
     "batch.output: out.tif looks like a file"),
    ({"mode": "batch", "batch": {"inputs": ["a.tif"], "volume": "v", "output": "o"}, "autoscaling": {"enabled": True}},
     "autoscaling.enabled: only for mode=serve"),
    ({"mode": "batch", "batch": {"inputs": ["a.tif"], "volume": "v", "output": "o"}, "ingress": {"enabled": True}},
     "ingress.enabled: only for mode=serve (a batch Job has no Service to route to)"),
    ({"ingress": {"enabled": True, "path": "/appliance"}},
     "ingress.path=/appliance: a path prefix needs className: nginx"),
    ({"autoscaling": {"enabled": True, "metric": "cpu"}}, "autoscaling.metric=cpu: set resources.requests.cpu"),
    ({"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}, "minReplicas 5 is above maxReplicas 2"),
    ({"overrides": ["server.metrics_names=vllm"]}, "overrides: server.metrics_names=vllm; set metrics.names instead"),
    ({"overrides": ["server.allowed_s3_buckets=[hls]"]},
     "overrides: server.allowed_s3_buckets=[hls]; set server.s3.allowedBuckets instead"),
    ({"overrides": ["server.cors_origins=[https://a.example]"]},
     "overrides: server.cors_origins=[https://a.example]; set server.corsOrigins instead"),
    ({"server": {"s3": {"credentialsSecret": "s3-creds"}}},
     "server.s3.credentialsSecret: set server.s3.allowedBuckets too"),
])
def test_values_that_cannot_work_together_fail_the_render(chart, values, message):
    with pytest.raises(helm_python.HelmError, match=re.escape(message)):
        render_files(chart, values)


@pytest.mark.parametrize("profile", PROFILES)
def test_notes_say_how_to_reach_it(chart, profile):
    notes = render_files(chart, profile_values(profile))["appliance/templates/NOTES.txt"]
    if profile_values(profile).get("mode") == "batch":
        assert "kubectl -n apps get job demo-appliance" in notes
    else:
        assert "port-forward service/demo-appliance 8000:8000 &" in notes and "curl" in notes
    assert "helm test demo -n apps --logs" in notes


def test_chart_version_follows_the_package():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (version,) = re.findall(r'^version = "([^"]+)"', (CHART.parents[1] / "pyproject.toml").read_text(), re.M)
    assert chart["appVersion"] == version, "the default image tag is the package version"
