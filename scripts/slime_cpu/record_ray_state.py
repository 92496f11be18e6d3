"""Records what the CPU smoke's private Ray cluster holds once slime's train.py has exited, before the smoke stops
it: Ray's own account of the run's actors and of the sandbox pool's executions, and the sandbox processes still
alive on this machine. tests/slime_train reads it (the Ray pool ran the model's code inside slime's cluster and
nothing of it outlived train.py).

    python scripts/slime_cpu/record_ray_state.py OUT.json     # RAY_ADDRESS: the private head (GCS address)

Ray's state API (``ray.util.state``, served by the head's dashboard) answers. The script first waits, bounded by
``--wait-s``, until no actor is alive any more and no pool worker's process is left (Ray kills a driver's actors,
and theirs, when it exits: that takes a moment, and it marks an actor DEAD before its process is gone) and no
sandbox process is left; whatever is still alive then is recorded as such. The file holds:

* ``actors``: every actor the cluster had (class, state, pid, job, resources, death cause), and whether its
  process still exists;
* ``runs``: every ``SandboxWorker.run`` task (one execution of model-written code on a pool worker): state,
  actor and worker pid;
* ``sandbox_processes``: live processes running a sandbox interpreter of this venv (its isolation launcher
  included): ``<this venv's python> -I -c ...``, what every sandbox backend starts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ray.util.state import list_actors, list_tasks

_WORKER = "SandboxWorker"
_RUN_TASK = f"{_WORKER}.run"
_LIMIT = 10_000  # the state API's own most; more raises (raise_on_missing_output) instead of truncating


def _alive(pid: int | None) -> bool:
    """Whether process ``pid`` runs (a zombie waiting for its parent does not)."""
    if pid is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _actors() -> list[dict[str, Any]]:
    rows = list_actors(limit=_LIMIT, detail=True, raise_on_missing_output=True)
    return [
        {
            "actor_id": a.actor_id,
            "class_name": a.class_name,
            "state": a.state,
            "pid": a.pid,
            "job_id": a.job_id,
            "node_id": a.node_id,
            "required_resources": a.required_resources,
            "death_cause": a.death_cause,
            "process_alive": _alive(a.pid),
        }
        for a in rows
    ]


def _runs() -> list[dict[str, Any]]:
    rows = list_tasks(
        filters=[("func_or_class_name", "=", _RUN_TASK)],
        limit=_LIMIT,
        raise_on_missing_output=True,
    )
    return [
        {"task_id": t.task_id, "state": t.state, "actor_id": t.actor_id, "worker_pid": t.worker_pid}
        for t in rows
    ]


def _sandbox_processes() -> list[dict[str, Any]]:
    """Live processes whose command line runs this venv's python with ``-I -c`` (a sandbox interpreter, or the
    bwrap / unshare launcher in front of one): the argv every sandbox backend builds."""
    bin_dir = os.path.dirname(os.path.abspath(sys.executable))
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in argv]
        for i, word in enumerate(words[:-2]):
            if os.path.dirname(word) == bin_dir and words[i + 1 : i + 3] == ["-I", "-c"]:
                found.append({"pid": int(entry.name), "argv_head": words[: i + 3]})
                break
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--wait-s", type=float, default=60.0, help="most seconds to wait for them to end")
    args = parser.parse_args()
    deadline = time.monotonic() + args.wait_s
    while True:
        actors, processes = _actors(), _sandbox_processes()
        # Ray marks an actor DEAD before its process has exited: wait for the pool workers' processes too.
        left = [
            a["class_name"]
            for a in actors
            if a["state"] == "ALIVE" or (a["class_name"] == _WORKER and a["process_alive"])
        ] + [str(p["pid"]) for p in processes]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    record = {"actors": actors, "runs": _runs(), "sandbox_processes": processes}
    args.out.write_text(json.dumps(record, indent=2, default=str))
    if left:
        print(f"record_ray_state: still alive after {args.wait_s:g} s: {', '.join(left)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
