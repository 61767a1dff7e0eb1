"""deploy/ offline: built-in kinds against the Kubernetes schema, the InferencePool against
its CRD's fields, and every port, path, probe and metric name against lengthwise itself
(etc/lengthwise.toml defaults, the pods' TOML, the app's routes and a real /metrics scrape)."""

from __future__ import annotations

import copy
import math
import re
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import kubernetes_validate
import pytest
import pytest_asyncio
import yaml

from bench import promtext
from daemon import config as config_mod
from daemon.config import Config, EngineConfig, ModelConfig
from daemon.http.app import build_app
from daemon.service import Service

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.37.0"  # newest schema kubernetes-validate ships
Doc = dict[str, Any]

# The InferencePool fields lengthwise uses, as inference.networking.k8s.io/v1's CRD bounds them.
_PORT = {"type": "object", "required": ["number"], "additionalProperties": False,
         "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}}}
INFERENCE_POOL_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "inference.networking.k8s.io/v1"},
        "kind": {"const": "InferencePool"},
        "spec": {"type": "object", "required": ["selector", "targetPorts"],
                 "additionalProperties": False, "properties": {
            "selector": {"type": "object", "required": ["matchLabels"],
                         "additionalProperties": False, "properties": {
                "matchLabels": {"type": "object", "minProperties": 1, "maxProperties": 64,
                                "additionalProperties": {"type": "string", "maxLength": 63}}}},
            "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8, "items": _PORT},
            "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
            "endpointPickerRef": {"type": "object", "required": ["name"],
                                  "additionalProperties": False, "properties": {
                "group": {"type": "string"}, "kind": {"type": "string"},
                "name": {"type": "string", "minLength": 1, "maxLength": 253},
                "port": _PORT, "failureMode": {"enum": ["FailOpen", "FailClose"]}}}}}}}


def _docs() -> list[Doc]:
    return [doc for path in sorted(DEPLOY.glob("*.yaml")) if path.name != "kustomization.yaml"
            for doc in yaml.safe_load_all(path.read_text())]


def _one(kind: str, name: str) -> Doc:
    return next(d for d in _docs() if d["kind"] == kind and d["metadata"]["name"] == name)


def _container(deployment: Doc) -> Doc:
    containers: list[Doc] = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def pod_labels(deployment: Doc) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def _pod_config() -> Config:
    text = _one("ConfigMap", "lengthwise-config")["data"]["lengthwise.toml"]
    return config_mod.decode(text, "deploy/lengthwise.yaml")


def _epp_config() -> Doc:
    data = _one("ConfigMap", "lengthwise-epp-config")["data"]
    loaded: Doc = yaml.safe_load(data["lengthwise-epp.yaml"])
    return loaded


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    files = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_builtin_kinds_pass_the_kubernetes_schema() -> None:
    checked = 0
    for doc in _docs():
        if doc["kind"] == "InferencePool":
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises on any error
        checked += 1
    assert checked >= 8
    broken = copy.deepcopy(_one("Deployment", "lengthwise"))
    _container(broken)["readinessProbe"]["httpGet"]["pth"] = "/health"  # the validator bites
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_inference_pool_selects_the_lengthwise_pods() -> None:
    pool = _one("InferencePool", "lengthwise")
    jsonschema.validate(pool, INFERENCE_POOL_SCHEMA)
    pods = _one("Deployment", "lengthwise")["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= pods.items()
    assert pool["spec"]["targetPorts"] == [{"number": _pod_config().server.port}]
    epp_service = _one("Service", "lengthwise-epp")
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["port"]["number"] == epp_service["spec"]["ports"][0]["port"]
    args = _container(_one("Deployment", "lengthwise-epp"))["args"]
    assert args[args.index("--pool-name") + 1] == pool["metadata"]["name"]
    assert str(ref["port"]["number"]) == args[args.index("--grpc-port") + 1]


def test_pods_run_the_mounted_config_on_their_gpus() -> None:
    deployment = _one("Deployment", "lengthwise")
    container, pod = _container(deployment), deployment["spec"]["template"]["spec"]
    config = _pod_config()
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    config_arg = Path(container["command"][container["command"].index("--config") + 1])
    assert config_arg == Path(mounts["config"]) / "lengthwise.toml"
    assert "subPath" not in str(container["volumeMounts"])  # an edited ConfigMap must arrive
    assert Path(config.model.path).is_relative_to(mounts["models"])
    assert config.server.host == "0.0.0.0"
    assert container["ports"] == [{"name": "http", "containerPort": config.server.port}]
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert config.engine.devices == [f"cuda:{i}" for i in range(gpus)]
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    service = _one("Service", "lengthwise")
    assert service["spec"]["selector"].items() <= pod_labels(deployment).items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_termination_and_start_up_outlast_the_daemon_limits() -> None:
    deployment = _one("Deployment", "lengthwise")
    container, config = _container(deployment), _pod_config()
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    engines_stop_s = 10  # engine processes exit in ~5 s on CPU (tests/integration logs)
    assert grace >= (pre_stop + config.limits.drain_timeout_s
                     + config.server.graceful_timeout_s + engines_stop_s)
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= math.ceil(
        config.engine.startup_timeout_s)
    # Liveness must not cut short lengthwise's own restart of a dead engine: stall
    # detection, every backoff, and two minutes to reload it.
    live, engine = container["livenessProbe"], config.engine
    backoffs = sum(engine.restart_backoff_s * 2 ** i for i in range(engine.restart_attempts))
    assert live["periodSeconds"] * live["failureThreshold"] >= (
        engine.stall_timeout_s + backoffs + 120)
    epp_grace = _one("Deployment", "lengthwise-epp")["spec"]["template"]["spec"]
    assert epp_grace["terminationGracePeriodSeconds"] >= grace


def test_shipped_defaults_are_what_the_manifests_override() -> None:
    """The pod config differs from etc/lengthwise.toml only where a pod must."""
    shipped = tomllib.loads((ROOT / "etc" / "lengthwise.toml").read_text())
    assert shipped["server"]["port"] == _pod_config().server.port  # same port everywhere
    assert shipped["server"]["host"] == "127.0.0.1"  # a pod must listen on its IP instead


@pytest_asyncio.fixture
async def app_client(smollm2_model: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Service]]:
    config = Config(model=ModelConfig(path=str(smollm2_model), served_name="deploy-test"),
                    engine=EngineConfig(kind="sim", devices=["cpu", "cpu"], max_num_seqs=4))
    service = await Service.create(config)
    transport = httpx.ASGITransport(app=build_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield http, service
    await service.shutdown()


@pytest.mark.asyncio
async def test_probes_hit_the_health_route(app_client: tuple[httpx.AsyncClient, Service]
                                           ) -> None:
    http, service = app_client
    container = _container(_one("Deployment", "lengthwise"))
    probes = [container[p]["httpGet"] for p in ("startupProbe", "readinessProbe",
                                                  "livenessProbe")]
    assert {p["port"] for p in probes} == {"http"}
    assert {p["path"] for p in probes} == {"/health"}
    assert (await http.get("/health")).status_code == 503  # starting: not ready, not live
    await service.start()
    assert (await http.get("/health")).status_code == 200
    annotations = _one("Deployment", "lengthwise")["spec"]["template"]["metadata"]["annotations"]
    assert (await http.get(annotations["prometheus.io/path"])).status_code == 200


def _refs(epp: Doc) -> list[str]:
    refs = [p["pluginRef"] for prof in epp["schedulingProfiles"] for p in prof["plugins"]]
    for source in epp["dataLayer"]["sources"]:
        refs += [source["pluginRef"], *(e["pluginRef"] for e in source["extractors"])]
    return refs


_SPEC = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?$')


def _matches(spec: str, families: dict[str, list[Any]]) -> bool:
    """Whether an EPP metric spec (name{label="value",...}) selects a scraped series."""
    found = _SPEC.match(spec.strip())
    assert found, spec
    wanted = dict(re.findall(r'(\w+)\s*=\s*"?([^",]*)"?', found["labels"] or ""))
    samples = families.get(found["name"], [])
    return any(wanted.items() <= s.labels.items() for s in samples)


@pytest.mark.asyncio
async def test_epp_reads_metrics_lengthwise_exports(
        app_client: tuple[httpx.AsyncClient, Service]) -> None:
    http, service = app_client
    await service.start()
    families = promtext.families((await http.get("/metrics")).text)
    epp = _epp_config()
    assert (epp["apiVersion"], epp["kind"]) == ("llm-d.ai/v1alpha1", "EndpointPickerConfig")
    plugins = {p.get("name", p["type"]): p for p in epp["plugins"]}
    assert set(_refs(epp)) <= set(plugins)
    extractor = plugins["core-metrics-extractor"]["parameters"]
    engine = next(e for e in extractor["engineConfigs"] if e["name"] == extractor["defaultEngine"])
    labels = pod_labels(_one("Deployment", "lengthwise"))
    assert labels[extractor["engineLabelKey"]] == engine["name"]
    specs = [engine[k] for k in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec",
                                 "cacheInfoSpec")]
    specs += [c["metricSpec"] for c in engine["customMetrics"]]
    assert [s for s in specs if not _matches(s, families)] == []
    info = families["vllm:cache_config_info"][0].labels
    assert {engine["cacheBlockSizeLabelName"], engine["cacheNumBlocksLabelName"]} <= set(info)
    attributes = {c["attributeKey"] for c in engine["customMetrics"]}
    assert plugins["predicted-work-scorer"]["parameters"]["attributeKey"] in attributes
    source = plugins["metrics-data-source"]["parameters"]
    assert (await http.get(source["path"])).status_code == 200
    mount = _container(_one("Deployment", "lengthwise-epp"))["volumeMounts"][0]["mountPath"]
    args = _container(_one("Deployment", "lengthwise-epp"))["args"]
    assert args[args.index("--config-file") + 1] == f"{mount}/lengthwise-epp.yaml"
