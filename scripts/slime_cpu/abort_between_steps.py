"""The abort slime's weight update sends, between the CPU smoke's rollout steps, for a run whose train.py
(``--debug-rollout-only``) skips the update: slime's fully-async rollout keeps groups in flight across steps, and
slime's update aborts them (its engines' ``/pause_generation``, which aborts every request in flight, as
``/abort_request`` with ``abort_all`` does); a cut group goes back to slime's data buffer, and a later step continues
it.

    python abort_between_steps.py OUT_DIR SERVER_ADDRESS NUM_ROLLOUT

Once ``OUT_DIR/rollout_{id}.pt`` exists (slime's RolloutManager saved step ``id``: the step is over, the next
has not been handed its samples yet), it posts ``{"abort_all": true}`` to ``http://SERVER_ADDRESS/abort_request``
(the smoke's recording proxy, which logs it in requests.jsonl with the server's answer), for every step but the
last; each abort is one JSON line in ``OUT_DIR/aborts.jsonl`` (the step after which it was sent, the server's
HTTP status and the time). The smoke starts it beside train.py and stops it by its pid.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

_POLL_S = 0.2


def _abort_all(address: str) -> int:
    request = urllib.request.Request(
        f"http://{address}/abort_request",
        data=json.dumps({"abort_all": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
        return int(response.status)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: abort_between_steps.py OUT_DIR SERVER_ADDRESS NUM_ROLLOUT", file=sys.stderr)
        return 2
    out, address, num_rollout = Path(argv[0]), argv[1], int(argv[2])
    log = out / "aborts.jsonl"
    for rollout_id in range(num_rollout - 1):
        saved = out / f"rollout_{rollout_id}.pt"
        while not saved.exists():
            time.sleep(_POLL_S)
        status = _abort_all(address)
        with log.open("a") as f:
            f.write(json.dumps({"after_rollout": rollout_id, "status": status, "time": time.time()}) + "\n")
        print(f"abort_between_steps: aborted every request in flight after rollout {rollout_id}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
