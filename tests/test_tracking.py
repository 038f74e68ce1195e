"""MLflow is the system of record: one run per training, every epoch, the artifacts, and a registered ONNX model
that loads and predicts. Against a real `mlflow server` on loopback, stopped and restarted mid-run."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pytest
from conftest import (
    LEARN_EPOCHS,
    MODEL_NAME,
    RERUN_EPOCHS,
    MlflowServer,
    Rerun,
    SharedRay,
    free_port,
    read_jsonl,
    small_run,
    yolo_ray,
)
from mlflow import MlflowClient

from yolo_ray import config
from yolo_ray.tracking import mlflow_runs as tracking
from yolo_ray.tracking.export import ONNX_RTOL, letterbox_batch


def _run(client: MlflowClient, name: str):
    runs = [
        r for e in client.search_experiments() for r in client.search_runs([e.experiment_id]) if r.info.run_name == name
    ]
    assert len(runs) == 1, f"expected exactly one MLflow run named {name}, got {len(runs)}"
    return runs[0]


def _steps(client: MlflowClient, run_id: str, metric: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, metric))


def test_one_run_with_params_metrics_and_artifacts(ddp_run: Path, mlflow_server: MlflowServer) -> None:
    client = MlflowClient(mlflow_server.uri, registry_uri=mlflow_server.uri)
    run = _run(client, "learn")
    assert run.info.status == "FINISHED"
    p = run.data.params
    assert p["train.batch"] == "16" and p["train.epochs"] == str(LEARN_EPOCHS) and p["model"] == "yolo11n.yaml"
    assert p["scaling.world_size"] == "2" and p["train.per_worker_batch"] == "8" and p["scaling.nodes"] == "1"
    assert p["scaling.cpus_reserved_per_worker"] == "1.0"  # what Ray reserved (the config may say `auto`)
    assert run.data.tags["version.ultralytics"] and run.data.tags["version.ray"] and run.data.tags["version.torch"]
    for metric in (
        "metrics/mAP50",
        "metrics/mAP50-95",
        "metrics/precision",
        "metrics/recall",
        "train/box_loss",
        "val/box_loss",
        "lr/pg0",
        "time/epoch_s",
        "time/train_s",
        "time/val_s",
        "time/val_ms_per_image/postprocess",
        "speed/images_per_s",
        "optim/grad_norm_mean",
        "optim/grad_clipped_share",
    ):
        assert _steps(client, run.info.run_id, metric) == list(range(1, LEARN_EPOCHS + 1)), metric
    # grouped as Ultralytics' results.csv is; nothing that only restates the run (the step, a first attempt's
    # resumed_from_epoch -1, fitness = mAP50-95, the world size param, a CPU run's GPU memory 0)
    groups = {k.split("/")[0] for k in run.data.metrics}
    assert groups == {"metrics", "train", "val", "lr", "time", "speed", "optim", "final"}, run.data.metrics.keys()
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    artifacts |= {a.path for d in ("results", "weights") for a in client.list_artifacts(run.info.run_id, d)}
    for name in (
        "config.yaml",
        "results/results.csv",
        "results/results.png",
        "results/BoxPR_curve.png",
        "results/confusion_matrix.png",
        "results/val_batch0_pred.jpg",
        "weights/best.pt",
        "weights/last.pt",
    ):
        assert name in artifacts, name


def test_the_run_page_reads_well(ddp_run: Path, shapes: Path, mlflow_server: MlflowServer, tmp_path: Path) -> None:
    """What the MLflow UI shows a reader: the final evaluation as run metrics matching the registered version's
    (4-digit) tags, params with resolved values and without sweep or fault-injection keys, who ran it from what, a
    description, and the model as one ONNX file that loads alone when downloaded."""
    mlflow.set_tracking_uri(mlflow_server.uri)
    mlflow.set_registry_uri(mlflow_server.uri)
    client = MlflowClient(mlflow_server.uri, registry_uri=mlflow_server.uri)
    run = _run(client, "learn")
    version = _registered_by(ddp_run, client)
    for key in ("mAP50", "mAP50-95"):
        assert round(run.data.metrics[f"final/{key}"], 4) == float(version.tags[key])
        assert len(version.tags[key].split(".")[-1]) <= 4
    p = run.data.params
    assert not [k for k in p if k.startswith(("tune.", "run.fail_"))]
    assert p["scaling.num_workers"] == "2" and p["tracking.model_name"] == MODEL_NAME
    tags = run.data.tags
    assert tags["mlflow.user"] and "yolo-ray" in tags["mlflow.source.name"]
    # the dataset, as the run page's Datasets column shows it: one input per split, its digest, its counts
    inputs = {i.tags[0].value: i.dataset for i in run.inputs.dataset_inputs}
    assert set(inputs) == {"training", "validation"} and inputs["training"].name == "shapes0"
    train_images = len(list((shapes / "train" / "images").glob("*.jpg")))
    assert json.loads(inputs["training"].profile)["images"] == train_images and len(inputs["training"].digest) == 16
    labels = list((shapes / "val" / "labels").glob("*.txt"))
    boxes = sum(1 for f in labels for line in f.read_text().splitlines() if line.strip())
    assert json.loads(inputs["validation"].profile) == {
        "images": len(labels), "labelled_images": len(labels), "boxes": boxes, "unusable_images": 0, "classes": 3,
    }  # fmt: skip
    assert "yolo11n.yaml" in tags["mlflow.note.content"] and "Final (best.pt)" in tags["mlflow.note.content"]
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=version.source, dst_path=str(tmp_path)))
    files = [f for f in local.rglob("*") if f.is_file()]
    onnx_files = [f for f in files if f.suffix == ".onnx"]
    assert len(onnx_files) == 1 and not [f for f in files if f.stat().st_size > 1e6 and f.suffix != ".onnx"], files
    import onnxruntime as ort

    alone = tmp_path / "alone.onnx"  # the file by itself, as a user downloads it from the UI
    alone.write_bytes(onnx_files[0].read_bytes())
    assert ort.InferenceSession(str(alone), providers=["CPUExecutionProvider"]).get_inputs()


def test_onnx_export_matches_pytorch(ddp_run: Path) -> None:
    check = json.loads((ddp_run / "export" / "check.json").read_text())
    assert check["ok"] and check["images"] == 4
    assert check["max_abs_diff"] <= ONNX_RTOL * check["output_scale"]


def test_registered_model_loads_and_predicts(ddp_run: Path, shapes: Path, mlflow_server: MlflowServer) -> None:
    mlflow.set_tracking_uri(mlflow_server.uri)
    mlflow.set_registry_uri(mlflow_server.uri)
    client = MlflowClient(mlflow_server.uri, registry_uri=mlflow_server.uri)
    version = _registered_by(ddp_run, client)
    assert version.run_id == _run(client, "learn").info.run_id
    assert float(version.tags["mAP50"]) >= 0.5 and "synthetic" in version.tags["data"]
    model = mlflow.pyfunc.load_model(f"models:/{MODEL_NAME}/{version.version}")
    assert mlflow.onnx.load_model(f"models:/{MODEL_NAME}/{version.version}").graph.input
    hits = 0
    images = sorted((shapes / "val" / "images").glob("*.jpg"))[:10]
    for image in images:
        out = model.predict(letterbox_batch([image], 128))
        pred = next(iter(out.values()))[0] if isinstance(out, dict) else np.asarray(out)[0]  # (4 + nc, anchors)
        scores = pred[4:].max(0)
        best = int(scores.argmax())
        cx, cy, w, h = pred[:4, best] / 128
        cls = int(pred[4:, best].argmax())
        labels = [
            list(map(float, line.split()))
            for line in (shapes / "val" / "labels" / f"{image.stem}.txt").read_text().splitlines()
        ]
        ious = [_iou((cx, cy, w, h), tuple(lab[1:])) for lab in labels if int(lab[0]) == cls]
        hits += scores[best] > 0.5 and max(ious, default=0) > 0.5
    assert hits >= 8, f"the registered model found a correct box in only {hits}/10 val images"


def _registered_by(run_dir: Path, client: MlflowClient) -> Any:
    """The model version a run registered, as its summary.json names it: whichever run registered last holds the
    `candidate` alias, so reading the alias would make these tests depend on their order."""
    model = json.loads((run_dir / "summary.json").read_text())["mlflow"]["model"]
    assert model["name"] == MODEL_NAME and model["alias"] == "candidate"
    return client.get_model_version(MODEL_NAME, model["version"])


def _iou(a: tuple, b: tuple) -> float:
    ax1, ay1, ax2, ay2 = a[0] - a[2] / 2, a[1] - a[3] / 2, a[0] + a[2] / 2, a[1] + a[3] / 2
    bx1, by1, bx2, by2 = b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2
    inter = max(0, min(ax2, bx2) - max(ax1, bx1)) * max(0, min(ay2, by2) - max(ay1, by1))
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)


def test_rest_api_the_ui_uses_lists_the_run(ddp_run: Path, mlflow_server: MlflowServer) -> None:
    exp = MlflowClient(mlflow_server.uri, registry_uri=mlflow_server.uri).get_experiment_by_name("yolo_ray")
    body = json.dumps({"experiment_ids": [exp.experiment_id], "max_results": 50}).encode()
    req = urllib.request.Request(
        f"{mlflow_server.uri}/ajax-api/2.0/mlflow/runs/search", data=body, headers={"Content-Type": "application/json"}
    )
    runs = json.loads(urllib.request.urlopen(req, timeout=30).read())["runs"]
    learn = [r for r in runs if r["info"]["run_name"] == "learn"]
    assert len(learn) == 1
    metrics = {m["key"]: m for m in learn[0]["data"]["metrics"]}
    assert metrics["metrics/mAP50"]["step"] == LEARN_EPOCHS and metrics["metrics/mAP50"]["value"] >= 0.5
    assert {"metrics/mAP50-95", "metrics/precision", "train/box_loss", "val/box_loss"} <= metrics.keys()


def test_server_down_at_start_is_a_clear_error(tmp_path: Path) -> None:
    proc = yolo_ray(
        "train",
        f"tracking.uri=http://127.0.0.1:{free_port()}",
        f"run.storage_path={tmp_path}",
        "data.dir=" + str(tmp_path / "ds"),
        "data.synthetic.images=8",
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stdout
    assert "tracking.uri" in proc.stdout and "does not answer" in proc.stdout
    assert "Started a local Ray" not in proc.stdout  # refused before any worker or device was taken


EPOCHS = 7


def test_outage_and_worker_restart_lose_nothing(shapes_small: Path, tmp_path: Path, shared_ray: SharedRay) -> None:
    """The server dies after epoch 2 and comes back after epoch 4; a worker fails after epoch 3 and restarts."""
    server = MlflowServer(tmp_path / "mlflow")
    server.root.mkdir()
    server.start()
    args = small_run(
        shapes_small,
        tmp_path,
        "outage",
        f"train.epochs={EPOCHS}",
        "tracking.enabled=true",
        f"tracking.uri={server.uri}",
        "run.max_failures=1",
        "run.fail_at_epoch=3",
    )
    history = tmp_path / "outage" / "history.jsonl"
    log = open(tmp_path / "driver.log", "w")
    driver = subprocess.Popen(
        [sys.executable, "-m", "yolo_ray", "train", *args],
        cwd=tmp_path,
        env=shared_ray.env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_for(lambda: history.exists() and len(read_jsonl(history)) >= 2, driver)
        server.stop()
        _wait_for(lambda: len(read_jsonl(history)) >= 4, driver)
        assert driver.poll() is None, "training must go on while MLflow is down"
        server.start()
        assert driver.wait(600) == 0, (tmp_path / "driver.log").read_text()[-4000:]
    finally:
        if driver.poll() is None:
            driver.send_signal(signal.SIGKILL)
        server.stop()
    server.start()
    try:
        client = MlflowClient(server.uri, registry_uri=server.uri)
        run = _run(client, "outage")
        assert run.info.status == "FINISHED"
        for metric in ("metrics/mAP50", "train/box_loss", "time/train_s"):
            assert _steps(client, run.info.run_id, metric) == list(range(1, EPOCHS + 1)), metric
        resumed = sorted(client.get_metric_history(run.info.run_id, "resumed_from_epoch"), key=lambda m: m.step)
        assert [(m.step, m.value) for m in resumed] == [(e, 3) for e in range(4, EPOCHS + 1)]  # the resumed epochs
        assert "weights/best.pt" in {a.path for a in client.list_artifacts(run.info.run_id, "weights")}
        assert client.get_model_version_by_alias("yolo_ray-outage", "candidate").run_id == run.info.run_id
        assert "cannot reach" in (tmp_path / "driver.log").read_text()
        # Nothing left to send: a sync is a no-op, not a duplicate.
        proc = yolo_ray("sync", str(tmp_path / "outage"), cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert _steps(client, run.info.run_id, "metrics/mAP50") == list(range(1, EPOCHS + 1))
    finally:
        server.stop()


def _wait_for(cond, driver: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        assert driver.poll() is None, "the driver ended early"
        time.sleep(0.3)
    raise TimeoutError


@pytest.fixture(scope="module")
def weak_version(rerun_after_failure: Rerun, mlflow_server: MlflowServer) -> str:
    """A second, barely trained version of the same registered model, made by a run that failed and was re-run."""
    assert rerun_after_failure.resumed.returncode == 0, rerun_after_failure.resumed.stdout[-4000:]
    client = MlflowClient(mlflow_server.uri, registry_uri=mlflow_server.uri)
    run = _run(client, "rerun")  # the failed attempt and the re-run share one MLflow run
    assert run.info.status == "FINISHED"
    assert _steps(client, run.info.run_id, "metrics/mAP50") == list(range(1, RERUN_EPOCHS + 1))
    return json.loads((rerun_after_failure.run_dir / "summary.json").read_text())["mlflow"]["model"]["version"]


def test_promote_keeps_the_better_champion(
    ddp_run: Path, weak_version: str, mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    client = MlflowClient(mlflow_server.uri, registry_uri=mlflow_server.uri)
    learn_run = _run(client, "learn").info.run_id
    first = next(v.version for v in client.search_model_versions(f"name='{MODEL_NAME}'") if v.run_id == learn_run)
    assert first != weak_version
    # The newest registration took the `candidate` alias.
    newest = max(first, weak_version, key=int)
    assert client.get_model_version_by_alias(MODEL_NAME, "candidate").version == newest
    uri = ["--tracking-uri", mlflow_server.uri]
    assert yolo_ray("promote", MODEL_NAME, first, *uri, cwd=tmp_path).returncode == 0
    refused = yolo_ray("promote", MODEL_NAME, weak_version, *uri, cwd=tmp_path)
    assert refused.returncode == 1 and "worse than the champion" in refused.stdout
    assert client.get_model_version_by_alias(MODEL_NAME, "champion").version == first
    assert yolo_ray("promote", MODEL_NAME, weak_version, "--force", *uri, cwd=tmp_path).returncode == 0
    assert client.get_model_version_by_alias(MODEL_NAME, "champion").version == weak_version


def test_export_cli_from_registry_and_run(ddp_run: Path, mlflow_server: MlflowServer, tmp_path: Path) -> None:
    uri = ["--tracking-uri", mlflow_server.uri]
    proc = yolo_ray(
        "export",
        f"models:/{MODEL_NAME}@candidate",
        "formats=onnx,torchscript",
        f"out={tmp_path / 'a'}",
        *uri,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    paths = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert Path(paths["onnx"]).is_file() and Path(paths["torchscript"]).is_file()
    proc = yolo_ray("export", str(ddp_run), "formats=onnx", f"out={tmp_path / 'b'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_a_refused_registration_is_not_retried_and_adds_no_version(
    ddp_run: Path, mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    """An alias the registry refuses (MLflow reserves `v1`; `check` now refuses it before training, so it is set
    here as a config from before that check would have it) is the server saying no, not an outage: it was retried
    for tracking.outage_grace_s, registering a new version each time. Now the run stays pending for `yolo-ray sync`
    at once, and a sync with a valid alias gives the run's one version its alias without adding one."""
    copy = tmp_path / "learn"
    shutil.copytree(ddp_run, copy)
    state = json.loads((copy / "mlflow.json").read_text())
    state.pop("registered", None)  # as if the end of the run had stopped before the alias
    (copy / "mlflow.json").write_text(json.dumps(state))
    client = MlflowClient(mlflow_server.uri, registry_uri=mlflow_server.uri)
    before = sorted(v.version for v in client.search_model_versions(f"name = '{MODEL_NAME}'"))
    cfg = config.load(copy / "config.yaml")
    started = time.time()
    out = tracking.Tracker(config.apply(cfg, {"tracking.alias": "v1"}), copy, mlflow_server.uri).finish("finished")
    assert out.get("pending") and "v1" in out["error"] and time.time() - started < 30, out
    again = tracking.Tracker(cfg, copy, mlflow_server.uri).finish("finished")
    assert again["model"]["version"] == state["model_version"] and not again.get("pending"), again
    assert sorted(v.version for v in client.search_model_versions(f"name = '{MODEL_NAME}'")) == before


class StallingProxy:
    """A TCP proxy in front of a real MLflow server that holds the first `create run` request past the client's
    timeout before passing it on: the server creates the run, the client never hears of it (a server slow under
    load)."""

    def __init__(self, upstream_port: int):
        self.upstream_port, self.stalled = upstream_port, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.uri = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            server = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while chunk := src.recv(65536):
                if requests and b"/runs/create" in chunk and not self.stalled:
                    self.stalled += 1
                    time.sleep(4)  # the client gave up after 2 s
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            dst.close()


def test_a_run_created_unanswered_is_found_not_created_twice(
    mlflow_server: MlflowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tracking server too slow to answer `create run` (seen under CI's load: a 10 s read timeout ended a run with a
    traceback before it trained): the request is tried again, and the run the server did create is the one used."""
    from yolo_ray.driver.ray_cluster import Scaling

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setattr(tracking, "START_WAIT_S", 3.0)  # the stalled request reaches the server in the meantime
    proxy = StallingProxy(mlflow_server.port)
    run_dir = tmp_path / "slow"
    run_dir.mkdir()
    cfg = config.load(None, [f"run.storage_path={tmp_path}", "run.name=slow", "tracking.experiment=slow-server"])
    scaling = Scaling(num_workers=2, use_gpu=False, cpus_per_worker=1, gpus_per_worker=0, placement_strategy="PACK")
    run_id = tracking.Tracker(cfg, run_dir, proxy.uri).start(scaling, nodes=1)
    assert proxy.stalled == 1
    client = MlflowClient(mlflow_server.uri)
    exp = client.get_experiment_by_name("slow-server")
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.run_dir = '{run_dir}'")
    assert [r.info.run_id for r in runs] == [run_id]  # one run, the one the unanswered request made
    assert client.get_run(run_id).data.params["scaling.world_size"] == "2"
