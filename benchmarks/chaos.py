"""A chaos run: the same experiment trained once undisturbed and once with a Ray Train worker killed (SIGKILL) every
few epochs, a bounded number of times; both final mAP50-95 side by side, with each kill, the epoch the group
resumed from and the seconds the restarts cost. Prints a table and writes JSON.

    python benchmarks/chaos.py [EPOCHS [EVERY [KILLS]]]      # default 20 4 3: the smoke experiment on 2 CPU workers
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "YOLO_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def train(out: Path, name: str, epochs: int, every: int, kills: int) -> dict:
    """One run of experiments/smoke.yaml; with kills > 0, a worker dies after every `every`-th epoch's line."""
    args = [
        *(sys.executable, "-m", "yolo_ray", "train", str(REPO / "experiments" / "smoke.yaml")),
        *(f"train.epochs={epochs}", f"run.storage_path={out}", f"run.name={name}", f"data.dir={out / 'data'}"),
        *("tracking.enabled=false", f"run.max_failures={kills + 2}"),
    ]
    history, killed, started = out / name / "history.jsonl", [], time.time()
    with open(out / f"{name}.log", "w") as log:
        driver = subprocess.Popen(args, env=ENV, stdout=log, stderr=subprocess.STDOUT)
        rng = random.Random(0)
        while driver.poll() is None:
            time.sleep(0.5)
            done = len(history.read_text().splitlines()) if history.exists() else 0
            if len(killed) < kills and done >= every * (len(killed) + 1):
                tree = psutil.Process(driver.pid).children(recursive=True)
                workers = [p for p in tree if "RayTrainWorker" in p.name()]
                if workers:
                    victim = rng.choice(workers)
                    os.kill(victim.pid, signal.SIGKILL)
                    killed.append({"after_epoch": done, "time": time.time()})
    rows = [json.loads(line) for line in history.read_text().splitlines()]
    summary = json.loads((out / name / "summary.json").read_text())
    restarts = [r for r in rows if r["epoch"] == r["resumed_from_epoch"] + 1]
    return {
        "name": name,
        "returncode": driver.returncode,
        "mAP50-95": summary["final"].get("mAP50-95"),
        "epochs_in_history": [r["epoch"] for r in rows],
        "kills": killed,
        "resumed_from": [r["resumed_from_epoch"] for r in restarts],
        "wall_s": round(time.time() - started, 1),
    }


def main() -> None:
    epochs, every, kills = (int(a) for a in (sys.argv[1:] + ["20", "4", "3"][len(sys.argv) - 1 :])[:3])
    out = REPO / "benchmarks" / "runs-chaos"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    calm = train(out, "undisturbed", epochs, every, 0)
    chaos = train(out, "chaos", epochs, every, kills)
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(), "runs": [calm, chaos]}
    path = REPO / "benchmarks" / "results" / f"{time.strftime('%Y-%m-%d')}-cpu-chaos-smoke-e{epochs}.json"
    path.write_text(json.dumps(report, indent=2))
    for r in (calm, chaos):
        once = r["epochs_in_history"] == list(range(1, epochs + 1))
        print(
            f"{r['name']:12s} rc {r['returncode']} mAP50-95 {r['mAP50-95']:.4f} wall {r['wall_s']} s "
            f"kills {len(r['kills'])} resumed from {r['resumed_from']} every epoch once: {once}"
        )
    print(f"written: {path}")


if __name__ == "__main__":
    main()
