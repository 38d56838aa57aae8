"""deploy/: the Kubernetes manifests deserialise into the official client's API models, their
wiring is consistent (selectors, ports, probes, HPA target), and every server argument they
pass — in the Dockerfile and in the Deployment — is accepted by the server's own parser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kubernetes.client import ApiClient

from coinfer.cloud.config import ENV_PREFIX, CloudConfig
from coinfer.cloud.server import build_parser
from coinfer.serving import settings

ROOT = Path(__file__).resolve().parents[2]
KINDS = {
    ("apps/v1", "Deployment"): "V1Deployment",
    ("v1", "Service"): "V1Service",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "V2HorizontalPodAutoscaler",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
}


def load(path: Path) -> dict:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    out = {}
    for d in docs:
        model = KINDS[(d["apiVersion"], d["kind"])]
        # the client's deserialiser type-checks every field and enforces required ones
        obj = ApiClient()._ApiClient__deserialize(d, model)
        assert obj.metadata.name
        out[d["kind"]] = obj
    return out


def server_config(argv: list[str]):
    """(CloudConfig, parsed args) as ``python -m coinfer.cloud.server`` reads ``argv`` (no environment; the
    files it names are not read: they exist only in the pod)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    return settings.load(CloudConfig, ENV_PREFIX, "cloud", None, {}, ap.coinfer_settings, args), args


@pytest.fixture(scope="module")
def k8s():
    return load(ROOT / "deploy/k8s/cloud.yaml")


def dockerfile_args() -> list[str]:
    lines = (ROOT / "deploy/cloud/Dockerfile").read_text().splitlines()
    entry = json.loads(next(x for x in lines if x.startswith("ENTRYPOINT")).split(" ", 1)[1])
    cmd = json.loads(next(x for x in lines if x.startswith("CMD")).split(" ", 1)[1])
    assert entry[:3] == ["python", "-m", "coinfer.cloud.server"]
    return entry[3:] + cmd


def test_deployment_requests_a_gpu_and_probes_grpc_health(k8s):
    dep = k8s["Deployment"]
    c = dep.spec.template.spec.containers[0]
    assert c.resources.limits["nvidia.com/gpu"] == "1"
    grpc_port = next(p.container_port for p in c.ports if p.name == "grpc")
    for probe in (c.startup_probe, c.readiness_probe, c.liveness_probe):
        assert probe.grpc is not None and probe.grpc.port == grpc_port
    assert c.readiness_probe.grpc.service == "coinfer.v1.CoinferCloud"
    assert dep.spec.selector.match_labels.items() <= dep.spec.template.metadata.labels.items()
    cfg, args = server_config(dockerfile_args() + c.args)  # the Deployment's args override CMD
    assert dep.spec.template.spec.termination_grace_period_seconds > cfg.grace_s
    mounts = {m.mount_path for m in c.volume_mounts}
    for path in (cfg.engine.model, args.auth_tokens, cfg.tls_cert, cfg.tls_key, cfg.state_path):
        assert path and any(str(path).startswith(m) for m in mounts), path
    assert cfg.port == grpc_port and cfg.metrics_port == next(p.container_port for p in c.ports if p.name == "metrics")


def test_service_and_hpa_point_at_the_deployment(k8s):
    dep, svc, hpa = k8s["Deployment"], k8s["Service"], k8s["HorizontalPodAutoscaler"]
    assert svc.spec.selector.items() <= dep.spec.template.metadata.labels.items()
    assert {p.target_port for p in svc.spec.ports} == {p.name for p in dep.spec.template.spec.containers[0].ports}
    assert (hpa.spec.scale_target_ref.kind, hpa.spec.scale_target_ref.name) == ("Deployment", dep.metadata.name)
    (metric,) = hpa.spec.metrics
    assert metric.pods.metric.name == "coinfer_load"  # exported by cloud/metrics.py
    from coinfer.cloud.metrics import CloudMetrics

    assert CloudMetrics().registry.get_sample_value("coinfer_load") is not None


def test_dockerfile_copies_what_the_cloud_imports():
    text = (ROOT / "deploy/cloud/Dockerfile").read_text()
    copied = " ".join(x.split(None, 1)[1] for x in text.splitlines() if x.startswith("COPY "))
    for src in ("protos", "coinfer", "cloud", "pyproject.toml", "setup.py"):
        assert src in copied and (ROOT / src).exists(), src
    assert '".[cloud-gpu]"' in text
    assert server_config(dockerfile_args())[0].engine.model == "/models/target"


def test_a_broken_manifest_is_caught(tmp_path):
    bad = (ROOT / "deploy/k8s/cloud.yaml").read_text().replace("containerPort: 50051", "containerPort: grpc-port")
    (tmp_path / "bad.yaml").write_text(bad)
    with pytest.raises(Exception):  # noqa: B017 - the client's own validation error type varies
        load(tmp_path / "bad.yaml")


def test_scale_out_headless_service_rolling_update_and_disruption_budget(k8s):
    """Every pod reachable by the edges' round_robin (headless), never fewer serving replicas during a
    rolling update, a budget for voluntary disruptions, and SIGTERM's drain given its grace."""
    dep, svc, pdb, hpa = k8s["Deployment"], k8s["Service"], k8s["PodDisruptionBudget"], k8s["HorizontalPodAutoscaler"]
    assert svc.spec.cluster_ip == "None" and not svc.spec.publish_not_ready_addresses
    ru = dep.spec.strategy.rolling_update
    assert dep.spec.strategy.type == "RollingUpdate" and ru.max_unavailable == 0 and ru.max_surge == 1
    assert pdb.spec.selector.match_labels.items() <= dep.spec.template.metadata.labels.items()
    assert pdb.spec.max_unavailable == 1 and dep.spec.replicas >= 2 and hpa.spec.min_replicas >= 2
    c = dep.spec.template.spec.containers[0]
    cfg, _ = server_config(dockerfile_args() + c.args)
    pre_stop = c.lifecycle.pre_stop.sleep.seconds
    assert dep.spec.template.spec.termination_grace_period_seconds > pre_stop + cfg.grace_s
