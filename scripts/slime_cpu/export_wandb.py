"""Writes what slime logged to its OFFLINE wandb runs as JSON lines, readable without wandb.

    python scripts/slime_cpu/export_wandb.py WANDB_DIR OUT.jsonl

Each history row of every ``offline-run-*/run-*.wandb`` under ``WANDB_DIR`` becomes one line:
``{"run": "<run folder>", "values": {key: value, ...}}``, in the order wandb wrote them. Run with the driver venv's
wandb (its reader of the run file, ``wandb.sdk.internal.datastore``, is internal and changes between versions). The
CPU smoke's tests read the plugin's metric keys from it; ``wandb sync`` still uploads the runs themselves.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2
from wandb.sdk.internal import datastore


def history_rows(run_file: Path) -> list[dict[str, Any]]:
    store = datastore.DataStore()
    store.open_for_scan(str(run_file))
    rows = []
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") != "history":
            continue
        values = {
            (item.key or "/".join(item.nested_key)): json.loads(item.value_json)
            for item in record.history.item
        }
        rows.append(values)
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: export_wandb.py WANDB_DIR OUT.jsonl", file=sys.stderr)
        return 2
    wandb_dir, out = Path(argv[0]), Path(argv[1])
    runs = sorted(wandb_dir.rglob("offline-run-*/run-*.wandb"))
    if not runs:
        print(f"export_wandb: no offline wandb run under {wandb_dir}", file=sys.stderr)
        return 1
    with out.open("w") as sink:
        for run_file in runs:
            for values in history_rows(run_file):
                sink.write(json.dumps({"run": run_file.parent.name, "values": values}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
