"""deploy/: coinfer's cloud in front of a vLLM fleet. The manifest (deploy/k8s/cloud-remote.yaml) deserialises into
the official Kubernetes client's models and its server arguments parse with the server's own parser; it is wired to
the fleet's production-stack values (deploy/vllm-fleet/values.yaml: the router's Service and port, the API key's
Secret, the model's volume, the flags coinfer needs of the engines); the CPU image's extra runs the remote engine
with neither vLLM nor torch installed; an edge in the cluster points at the cloud's Service. (The values file
against the chart's own schema: deploy/README.md; the chart is not on PyPI.)"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from coinfer.cloud.remote_engine import SESSION_HEADER
from coinfer.edge.config import EdgeConfig
from tests.deploy.test_manifests import load, server_config

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "vllm"
"""The fleet's Helm release name (deploy/vllm-fleet/values.yaml's header): its router Service is
``<release>-router-service``."""


@pytest.fixture(scope="module")
def k8s():
    return load(ROOT / "deploy/k8s/cloud-remote.yaml")


@pytest.fixture(scope="module")
def fleet():
    return yaml.safe_load((ROOT / "deploy/vllm-fleet/values.yaml").read_text())


def _cloud(k8s):
    c = k8s["Deployment"].spec.template.spec.containers[0]
    return c, *server_config(_dockerfile_entry() + c.args)


def _dockerfile_entry() -> list[str]:
    lines = (ROOT / "deploy/cloud/Dockerfile.remote").read_text().splitlines()
    entry = json.loads(next(x for x in lines if x.startswith("ENTRYPOINT")).split(" ", 1)[1])
    assert entry[:3] == ["python", "-m", "coinfer.cloud.server"]
    return entry[3:]


def test_the_cloud_runs_on_cpus_in_front_of_the_fleets_router(k8s, fleet):
    c, cfg, args = _cloud(k8s)
    assert cfg.engine.remote and "nvidia.com/gpu" not in (c.resources.limits or {}) | (c.resources.requests or {})
    url = urlsplit(cfg.engine.url)
    router = fleet["routerSpec"]
    assert router["enableRouter"] and url.hostname == f"{RELEASE}-router-service" and url.port == router["servicePort"]
    (model,) = fleet["servingEngineSpec"]["modelSpec"]
    # the fleet's load is read against its batch slots: every engine's
    assert cfg.engine.max_num_seqs == model["replicaCount"] * model["vllmConfig"]["maxNumSeqs"]
    assert c.readiness_probe.grpc.service == "coinfer.v1.CoinferCloud" and c.readiness_probe.grpc.port == cfg.port
    assert k8s["Deployment"].spec.template.spec.termination_grace_period_seconds > cfg.grace_s + 5


def test_the_key_and_the_model_are_the_fleets_own(k8s, fleet):
    c, cfg, _ = _cloud(k8s)
    pod = k8s["Deployment"].spec.template.spec
    mounts = {m.mount_path: m.name for m in c.volume_mounts}
    volumes = {v.name: v for v in pod.volumes}
    key_dir, key_file = str(Path(cfg.engine.key_file).parent), Path(cfg.engine.key_file).name
    secret = volumes[mounts[key_dir]].secret
    want = fleet["servingEngineSpec"]["vllmApiKey"]
    assert secret.secret_name == want["secretName"] and [(i.key, i.path) for i in secret.items] == [
        (want["secretKey"], key_file)
    ]
    (model,) = fleet["servingEngineSpec"]["modelSpec"]
    claim = volumes[mounts[cfg.engine.model]].persistent_volume_claim.claim_name
    (fleet_volume,) = model["extraVolumes"]
    assert claim == fleet_volume["persistentVolumeClaim"]["claimName"] and model["modelURL"] == cfg.engine.model
    assert not cfg.engine.api_key  # never in a manifest: the Secret's file


def test_the_fleet_gives_what_the_remote_engine_needs(fleet):
    (model,) = fleet["servingEngineSpec"]["modelSpec"]
    vllm = model["vllmConfig"]
    assert "--enable-prompt-tokens-details" in vllm["extraArgs"]  # the cost's prefix-cache hits
    assert vllm["enablePrefixCaching"]
    # a session's requests to one engine: its prompt in that engine's cache (prefix-aware routing hashes text)
    assert fleet["routerSpec"]["routingLogic"] == "session" and fleet["routerSpec"]["sessionKey"] == SESSION_HEADER


def test_the_service_and_hpa_point_at_the_deployment_and_edges_at_the_service(k8s):
    dep, svc, hpa, pdb = k8s["Deployment"], k8s["Service"], k8s["HorizontalPodAutoscaler"], k8s["PodDisruptionBudget"]
    labels = dep.spec.template.metadata.labels
    assert svc.spec.selector.items() <= labels.items() and pdb.spec.selector.match_labels.items() <= labels.items()
    assert svc.spec.cluster_ip == "None" and (hpa.spec.scale_target_ref.name, hpa.spec.min_replicas) == (
        dep.metadata.name,
        2,
    )
    (metric,) = hpa.spec.metrics
    assert metric.resource.name == "cpu"  # the session layer's own load; the fleet scales on its own
    edge = EdgeConfig.load(ROOT / "deploy/edge/edge-cluster.toml", env={})
    host, port = edge.cloud.rsplit(":", 1)
    grpc_port = next(p.port for p in svc.spec.ports if p.name == "grpc")
    assert host.split(".")[0] == svc.metadata.name and host.endswith(".svc.cluster.local") and int(port) == grpc_port


def test_the_cpu_image_runs_the_remote_engine_with_neither_vllm_nor_torch():
    text = (ROOT / "deploy/cloud/Dockerfile.remote").read_text()
    assert '".[cloud-remote]"' in text and "FROM python:3.11" in text
    cmd = json.loads(next(x for x in text.splitlines() if x.startswith("CMD")).split(" ", 1)[1])
    cfg, _ = server_config(_dockerfile_entry() + cmd)
    assert cfg.engine.remote and cfg.engine.model == "/models/target"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not any(d.startswith(("vllm", "torch")) for d in extras["cloud-remote"])
    # the server, the remote engine, the target's tokenizer and template, with vLLM and torch not installable
    out = subprocess.run(
        [sys.executable, "-c", NO_VLLM.format(model=ROOT / "demo/weights/target")],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard: ~3 s (the imports, the tokenizer)
    )
    assert out.returncode == 0 and out.stdout.splitlines()[-1] == "[]", out.stderr[-3000:]


NO_VLLM = """
import importlib.abc, importlib.util, sys
GONE = {{"vllm", "torch", "torchvision", "torchaudio"}}
class Gone(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in GONE:
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Gone())
find = importlib.util.find_spec  # what transformers asks to learn that torch is not installed
importlib.util.find_spec = lambda name, package=None: None if name.split(".")[0] in GONE else find(name, package)
import coinfer.cloud.server
from coinfer.chat import ChatMessage
from coinfer.cloud.config import EngineConfig
from coinfer.cloud.remote_engine import RemoteEngine
engine = RemoteEngine(EngineConfig(model="{model}", url="http://vllm:8000"))
engine.load_tokenizer(engine.cfg)
assert engine.render([ChatMessage("user", "hi")]).endswith("assistant\\n") and engine.end_id is not None
print(sorted(m for m in sys.modules if m.split(".")[0] in GONE))
"""
