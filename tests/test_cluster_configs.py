"""cluster/: KubeRay manifests validate against the CRDs' OpenAPI schemas (as the API server checks them, unknown
fields rejected), the cluster-launcher YAML against Ray's own schema; a broken copy of each is caught."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import jsonschema
import pytest
import yaml
from conftest import REPO

CRDS = REPO.parent / "shared" / "kuberay-crds"
KUBERAY = REPO / "cluster" / "kuberay"


SUBSCHEMA_KEYS = ("properties", "patternProperties", "items", "additionalProperties")


def _k8s_schema(node: dict) -> dict:
    """OpenAPI v3 (with Kubernetes extensions) -> JSON Schema with the API server's strictness."""
    if not isinstance(node, dict):
        return node
    # sub-schemas below are converted once each, by the loops for their keys (not also here: that doubled the work
    # at every level of the CRDs' deep nesting)
    out = {k: _k8s_schema(v) if isinstance(v, dict) and k not in SUBSCHEMA_KEYS else v for k, v in node.items()}
    for key in ("properties", "patternProperties"):
        if key in node:
            out[key] = {k: _k8s_schema(v) for k, v in node[key].items()}
    if "items" in node:
        out["items"] = _k8s_schema(node["items"])
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _k8s_schema(node["additionalProperties"])
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("type") == "object" and "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)  # kubectl's default strict field validation
    return out


@functools.cache
def _validator(kind: str) -> jsonschema.Draft7Validator:
    # libyaml's loader when PyYAML has it: the CRDs are ~1 MB each
    crd = yaml.load(
        (CRDS / f"ray.io_{kind.lower()}s.yaml").read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    )
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = _k8s_schema(version["schema"]["openAPIV3Schema"])
    for field in ("apiVersion", "kind", "metadata"):  # standard object fields the API server handles itself
        schema["properties"].setdefault(field, {})
    return jsonschema.Draft7Validator(schema)


def _ray_docs() -> list[tuple[Path, dict]]:
    docs = []
    for path in sorted(KUBERAY.glob("*.yaml")):
        docs += [(path, d) for d in yaml.safe_load_all(path.read_text()) if d and d.get("apiVersion") == "ray.io/v1"]
    return docs


def _errors(doc: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in _validator(doc["kind"]).iter_errors(doc)]


def test_every_kuberay_manifest_validates() -> None:
    docs = _ray_docs()
    assert {d["kind"] for _, d in docs} >= {"RayCluster", "RayJob"}
    for path, doc in docs:
        assert _errors(doc) == [], path


def test_broken_kuberay_manifests_fail() -> None:
    for path, doc in _ray_docs():
        typo = copy.deepcopy(doc)
        typo["spec"]["shutdownAfterJobFinish" if doc["kind"] == "RayJob" else "workerGroupSpec"] = True
        assert _errors(typo), f"{path}: an unknown field must be rejected"
        wrong_type = copy.deepcopy(doc)
        if doc["kind"] == "RayCluster":
            wrong_type["spec"]["workerGroupSpecs"][0]["maxReplicas"] = "eight"
        else:
            wrong_type["spec"]["backoffLimit"] = "zero"
        assert _errors(wrong_type), f"{path}: a wrong type must be rejected"


def test_raycluster_shape() -> None:
    cluster = next(d for _, d in _ray_docs() if d["kind"] == "RayCluster")
    spec = cluster["spec"]
    assert spec["authOptions"]["mode"] == "token"
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert spec["headGroupSpec"].get("serviceType", "ClusterIP") == "ClusterIP"
    gpu = spec["workerGroupSpecs"][0]
    pod = gpu["template"]["spec"]
    limits = pod["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] >= 1 and gpu["minReplicas"] <= gpu["maxReplicas"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert {"/dev/shm", "/mnt/shared"} <= mounts and "persistentVolumeClaim" in volumes["shared"]
    # the spot group: a reclaimed pod first tells Ray it is being preempted, within its grace period
    spot = next(g for g in spec["workerGroupSpecs"] if g["groupName"] == "gpu-spot")["template"]["spec"]
    hook = " ".join(spot["containers"][0]["lifecycle"]["preStop"]["exec"]["command"])
    deadline = int(hook.split("--deadline-remaining-seconds")[1].split()[0])
    assert "DRAIN_NODE_REASON_PREEMPTION" in hook and deadline < spot["terminationGracePeriodSeconds"]


def _launcher_check(config: dict) -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(copy.deepcopy(config)))


def test_cluster_launcher_yaml_validates() -> None:
    config = yaml.safe_load((REPO / "cluster" / "aws.yaml").read_text())
    _launcher_check(config)
    # spot notices reach Ray as preemption drains on every worker node
    assert any("spot-drain.sh" in c for c in config["worker_start_ray_commands"])
    assert (REPO / "cluster" / "spot-drain.sh").exists() and "spot-drain.sh" in str(config["file_mounts"])
    assert any(
        "spot" in str(t["node_config"].get("InstanceMarketOptions", "")).lower()
        for t in config["available_node_types"].values()
    )
    broken = copy.deepcopy(config)
    broken["available_node_types"]["gpu_spot"]["max_workers"] = "many"
    with pytest.raises(Exception, match="max_workers"):
        _launcher_check(broken)
    unknown = copy.deepcopy(config)
    unknown["worker_nodes_typo"] = {}
    with pytest.raises(Exception, match="worker_nodes_typo"):
        _launcher_check(unknown)
