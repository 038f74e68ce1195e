"""Every parity run on this host, whichever `yolo-ray bench --parity` call started it: a line when it starts and one
when it ends, in one file all calls share. A run whose time overlapped a run of another call had the machine no more
to itself than one beside it in its own call, so its clocks do not count either (parity_report.mark_contended)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

LEDGER = Path(tempfile.gettempdir()) / "yolo_ray-bench-runs.jsonl"


class RunLedger:
    def __init__(self, path: Path = LEDGER, pid: int | None = None):
        self.path, self.pid = path, pid or os.getpid()

    def started(self, name: str, at: float) -> None:
        self._write({"pid": self.pid, "name": name, "started": at})

    def ended(self, name: str, at: float) -> None:
        self._write({"pid": self.pid, "name": name, "ended": at})

    def _write(self, entry: dict) -> None:
        # one short append per line: calls writing at once do not interleave within a line
        with open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def others(self, now: float) -> list[tuple[float, float]]:
        """(started, ended) of the runs of other calls; one still running counts until `now`, one whose process
        is gone without an end line (a killed call) does not count."""
        starts: dict[tuple[int, str], float] = {}
        ends: dict[tuple[int, str], float] = {}
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        for line in lines:
            try:
                e = json.loads(line)
                key = (int(e["pid"]), str(e["name"]))
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash
            if "started" in e:
                starts[key] = float(e["started"])
            elif "ended" in e:
                ends[key] = float(e["ended"])
        out = []
        for (pid, name), start in starts.items():
            if pid == self.pid:
                continue
            end = ends.get((pid, name), now if _alive(pid) else None)
            if end is not None:
                out.append((start, end))
        return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        pass
    return True
