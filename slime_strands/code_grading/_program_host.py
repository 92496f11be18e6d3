"""The UNTRUSTED side of a grading run: a fresh interpreter (``python -I -c``) that loads the model's program and
answers calls of its entry point. It knows nothing of the tests or of the verdict's secret: the trusted side
(``_harness.py``) runs the tests and calls the entry point through this process, value by value.

Frames on the two pipes named by ``argv``: 4 bytes of length (big-endian), then JSON. Values travel in the
tagged form of ``_harness.py`` (plain data only). Standard library only: this file is executed, not imported.
"""

import base64
import json
import math
import os
import sys
import traceback
import types

_REQUESTS, _REPLIES = int(sys.argv[1]), int(sys.argv[2])


def _read(count):
    data = b""
    while len(data) < count:
        chunk = os.read(_REQUESTS, count - len(data))
        if not chunk:
            os._exit(0)
        data += chunk
    return data


def _receive():
    return json.loads(_read(int.from_bytes(_read(4), "big")))


def _send(message):
    data = json.dumps(message).encode()
    frame = len(data).to_bytes(4, "big") + data
    while frame:
        frame = frame[os.write(_REPLIES, frame) :]


def _encode(value, depth=0):
    if depth > 100:
        raise ValueError("nested too deeply")
    kind = type(value)
    if value is None:
        return ["n"]
    if kind is bool:
        return ["b", value]
    if kind is int:
        return ["i", str(value)]
    if kind is float:
        return ["f", repr(value) if not math.isfinite(value) else value]
    if kind is str:
        return ["s", value]
    if kind in (bytes, bytearray):
        return ["y", base64.b64encode(value).decode()]
    if kind is complex:
        return ["c", [_encode(value.real), _encode(value.imag)]]
    tags = {list: "l", tuple: "t", set: "S", frozenset: "F"}
    if kind in tags:
        return [tags[kind], [_encode(item, depth + 1) for item in value]]
    if kind is dict:
        return ["d", [[_encode(k, depth + 1), _encode(v, depth + 1)] for k, v in value.items()]]
    raise TypeError(
        f"the entry point returned a {kind.__name__}: only plain data (None, bool, int, float, "
        "complex, str, bytes, list, tuple, set, frozenset, dict) can be graded"
    )


def _decode(item):
    tag = item[0]
    if tag == "n":
        return None
    if tag in ("b", "s"):
        return item[1]
    if tag == "i":
        return int(item[1])
    if tag == "f":
        return float(item[1])
    if tag == "y":
        return base64.b64decode(item[1])
    if tag == "c":
        return complex(_decode(item[1][0]), _decode(item[1][1]))
    if tag == "d":
        return {_decode(k): _decode(v) for k, v in item[1]}
    return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](_decode(x) for x in item[1])


def _trace(exc):
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]


def main():
    job = _receive()
    module = types.ModuleType(
        "solution"
    )  # not __main__: a main-guarded block does not run (as HumanEval's own)
    sys.modules["solution"] = module
    try:
        exec(compile(job["program"], "<program>", "exec"), module.__dict__)
    except BaseException as exc:
        _send(["load_error", type(exc).__name__, _trace(exc)])
        os._exit(0)
    entry = module.__dict__.get(job["entry_point"])
    if not callable(entry):
        _send(["no_entry", type(entry).__name__])
        os._exit(0)
    _send(["ready"])
    while True:
        args, kwargs = _receive()
        try:
            value = entry(*[_decode(a) for a in args], **{k: _decode(v) for k, v in kwargs.items()})
            reply = ["ok", _encode(value)]
        except BaseException as exc:
            reply = ["raise", type(exc).__name__, str(exc)[:500], _trace(exc)]
        _send(reply)


main()
