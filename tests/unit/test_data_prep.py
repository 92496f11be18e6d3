"""data_prep.prepare: slime-format output, validation by reason, dedup, shuffle/limit, atomic writes.

Offline: local files in the real dapo-math-17k / aime-2024 schema, and a fake `datasets` module for
hub ids.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from data_prep import prepare as dp

DAPO_PROMPT = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: \\boxed{{$Answer}} where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    # Nothing here may reach the network, even by mistake.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def dapo_row(problem: str, label, **extra) -> dict:
    return {
        "prompt": [{"role": "user", "content": DAPO_PROMPT.format(problem=problem)}],
        "label": label,
        **extra,
    }


GOOD_ROWS = [
    dapo_row("What is 6 * 7?", "42"),
    dapo_row("What is 1 - 35?", "-34", metadata={"source": "dapo", "id": 7}),
    {"prompt": "Plain string prompt: 2 + 2?", "label": 4},  # str prompt, int label
    dapo_row("Float label", 12.0),
    {
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "3 + 4?"}],
        "label": " 7 ",
    },
]

# One bad row of every kind, with the reason it must be counted under.
BAD_ROWS = [
    (["not", "an", "object"], "not_an_object"),
    ({"label": "1"}, "missing_prompt"),
    ({"prompt": "   ", "label": "1"}, "empty_prompt"),
    ({"prompt": [], "label": "1"}, "empty_prompt"),
    ({"prompt": 17, "label": "1"}, "bad_prompt_type"),
    ({"prompt": ["just a string"], "label": "1"}, "bad_message"),
    ({"prompt": [{"role": "user", "content": None}], "label": "1"}, "bad_message"),
    ({"prompt": [{"role": "user"}], "label": "1"}, "bad_message"),
    ({"prompt": [{"role": "wizard", "content": "hi"}], "label": "1"}, "bad_role"),
    ({"prompt": [{"content": "no role"}], "label": "1"}, "bad_role"),
    ({"prompt": [{"role": "system", "content": "only system"}], "label": "1"}, "no_user_message"),
    ({"prompt": [{"role": "user", "content": "q1"}]}, "missing_label"),
    ({"prompt": [{"role": "user", "content": "q2"}], "label": ""}, "missing_label"),
    ({"prompt": [{"role": "user", "content": "q3"}], "label": None}, "missing_label"),
    ({"prompt": [{"role": "user", "content": "q4"}], "label": "3.5"}, "non_integer_label"),
    ({"prompt": [{"role": "user", "content": "q5"}], "label": "\\frac{1}{2}"}, "non_integer_label"),
    ({"prompt": [{"role": "user", "content": "q6"}], "label": 2.5}, "non_integer_label"),
    ({"prompt": [{"role": "user", "content": "q7"}], "label": True}, "bad_label_type"),
    ({"prompt": [{"role": "user", "content": "q8"}], "label": [1]}, "bad_label_type"),
    ({"prompt": [{"role": "user", "content": "q9"}], "label": "1", "metadata": "x"}, "bad_metadata"),
]


def write_jsonl(path: Path, rows: list, extra_lines: tuple[str, ...] = ()) -> Path:
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --------------------------------------------------------------------------------------------------
# validate_row
# --------------------------------------------------------------------------------------------------


def test_valid_rows_are_normalized():
    out = [dp.validate_row(r) for r in GOOD_ROWS]
    assert out[0] == {"prompt": GOOD_ROWS[0]["prompt"], "label": "42"}
    assert out[1]["label"] == "-34" and out[1]["metadata"] == {"source": "dapo", "id": 7}
    assert out[2] == {"prompt": [{"role": "user", "content": "Plain string prompt: 2 + 2?"}], "label": "4"}
    assert out[3]["label"] == "12"
    assert out[4]["label"] == "7" and [m["role"] for m in out[4]["prompt"]] == ["system", "user"]


@pytest.mark.parametrize(("row", "reason"), BAD_ROWS, ids=[f"{r}-{i}" for i, (_, r) in enumerate(BAD_ROWS)])
def test_invalid_rows_raise_with_reason(row, reason):
    with pytest.raises(dp.RowError) as info:
        dp.validate_row(row)
    assert info.value.reason == reason


def test_extra_message_keys_are_dropped_and_custom_keys_work():
    row = {"question": [{"role": "user", "content": "hi", "name": "bob"}], "answer": "5", "meta": {"a": 1}}
    out = dp.validate_row(row, input_key="question", label_key="answer", metadata_key="meta")
    assert out == {"prompt": [{"role": "user", "content": "hi"}], "label": "5", "metadata": {"a": 1}}


def test_any_labels_mode_accepts_non_integers():
    out = dp.validate_row({"prompt": "q", "label": "\\frac{1}{2}"}, integer_labels=False)
    assert out["label"] == "\\frac{1}{2}"


# --------------------------------------------------------------------------------------------------
# the CLI on local files
# --------------------------------------------------------------------------------------------------


def test_end_to_end_jsonl_with_every_kind_of_bad_row(tmp_path, capsys):
    duplicate = dapo_row("What is  6 *   7?", "42")  # same prompt as GOOD_ROWS[0] up to whitespace
    rows = GOOD_ROWS[:2] + [r for r, _ in BAD_ROWS] + [duplicate] + GOOD_ROWS[2:]
    src = write_jsonl(tmp_path / "src.jsonl", rows, extra_lines=("{not json",))
    out = tmp_path / "nested" / "out.jsonl"

    assert dp.main(["--dataset", "dapo-math-17k", "--source", str(src), "--out", str(out)]) == 0

    written = read_jsonl(out)
    assert written == [dp.validate_row(r) for r in GOOD_ROWS]
    assert all(set(r) <= {"prompt", "label", "metadata"} for r in written)
    err = capsys.readouterr().err
    assert f"read {len(rows) + 1} rows, wrote {len(GOOD_ROWS)}" in err
    expected: dict[str, int] = {"duplicate": 1, "bad_json": 1}
    for _, reason in BAD_ROWS:
        expected[reason] = expected.get(reason, 0) + 1
    assert f"dropped {sum(expected.values())} rows:" in err
    for reason, count in expected.items():
        assert f"  {reason}: {count}  (first: row " in err, reason
    assert list(tmp_path.joinpath("nested").iterdir()) == [out]  # no temp file left behind


def test_json_list_and_json_lines_with_json_suffix(tmp_path):
    as_list = tmp_path / "list.json"
    as_list.write_text(json.dumps(GOOD_ROWS))
    as_lines = write_jsonl(tmp_path / "lines.json", GOOD_ROWS)
    for src in (as_list, as_lines):
        out = tmp_path / f"{src.stem}.jsonl"
        assert dp.main(["--dataset", "aime-2024", "--source", str(src), "--out", str(out), "--quiet"]) == 0
        assert len(read_jsonl(out)) == len(GOOD_ROWS)


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [dapo_row("p1", "1"), dapo_row("p2", "2", metadata={"k": "v"}), dapo_row("p3", "x")]
    for r in rows:
        r.setdefault("metadata", None)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "src.parquet")
    out = tmp_path / "out.jsonl"
    assert (
        dp.main(["--dataset", "dapo-math-17k", "--source", str(tmp_path / "src.parquet"), "--out", str(out)])
        == 0
    )
    written = read_jsonl(out)
    assert [r["label"] for r in written] == ["1", "2"]
    assert written[1]["metadata"] == {"k": "v"} and "metadata" not in written[0]


def test_shuffle_seed_and_limit(tmp_path):
    rows = [dapo_row(f"problem {i}", str(i)) for i in range(50)]
    src = write_jsonl(tmp_path / "src.jsonl", rows)

    def labels(*extra: str) -> list[str]:
        out = tmp_path / "out.jsonl"
        assert (
            dp.main(["--dataset", "aime-2024", "--source", str(src), "--out", str(out), "--quiet", *extra])
            == 0
        )
        return [r["label"] for r in read_jsonl(out)]

    assert labels() == [str(i) for i in range(50)]
    assert labels("--limit", "5") == ["0", "1", "2", "3", "4"]
    shuffled = labels("--shuffle", "--seed", "3")
    assert shuffled != labels() and sorted(shuffled, key=int) == labels()
    assert labels("--shuffle", "--seed", "3") == shuffled  # deterministic
    assert labels("--shuffle", "--seed", "4") != shuffled
    assert labels("--shuffle", "--seed", "3", "--limit", "7") == shuffled[:7]  # limit after shuffle


def test_no_dedup_keeps_duplicates(tmp_path):
    src = write_jsonl(tmp_path / "src.jsonl", [GOOD_ROWS[0], GOOD_ROWS[0]])
    out = tmp_path / "out.jsonl"
    assert dp.main(["--dataset", "aime-2024", "--source", str(src), "--out", str(out), "--no-dedup"]) == 0
    assert len(read_jsonl(out)) == 2


def test_nothing_valid_exits_1_and_keeps_the_old_output(tmp_path, capsys):
    src = write_jsonl(tmp_path / "src.jsonl", [r for r, _ in BAD_ROWS])
    out = tmp_path / "out.jsonl"
    out.write_text("previous content\n")
    assert dp.main(["--dataset", "aime-2024", "--source", str(src), "--out", str(out)]) == 1
    assert out.read_text() == "previous content\n"
    assert "no valid rows" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dataset", "aime-2024", "--source", "/no/such/file.jsonl"], "no such file"),
        (["--dataset", "aime-2024", "--source", "data.csv"], "no such file"),
        (["--dataset", "unknown-set"], "unknown dataset"),
        (["--dataset", "aime-2024", "--limit", "0"], "--limit"),
    ],
)
def test_usage_errors_exit_2(tmp_path, capsys, argv, message):
    assert dp.main([*argv, "--out", str(tmp_path / "o.jsonl")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def test_unsupported_local_suffix(tmp_path, capsys):
    src = tmp_path / "data.csv"
    src.write_text("prompt,label\n")
    assert dp.main(["--dataset", "x", "--source", str(src), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "unsupported file type" in capsys.readouterr().err


def test_write_is_atomic(tmp_path, monkeypatch):
    out = tmp_path / "out.jsonl"
    out.write_text("old\n")
    calls = {"n": 0}
    real_dumps = json.dumps

    def failing_dumps(obj, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("disk on fire")
        return real_dumps(obj, **kwargs)

    monkeypatch.setattr(dp.json, "dumps", failing_dumps)
    with pytest.raises(RuntimeError):
        dp.prepare([dapo_row(f"p{i}", str(i)) for i in range(5)], out, quiet=True)
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


# --------------------------------------------------------------------------------------------------
# hub sources (fake `datasets`), laziness, module entry point
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def fake_datasets(monkeypatch):
    calls = []

    def load_dataset(name, split=None):
        calls.append((name, split))
        if name == "broken/set":
            raise ConnectionError("no network")
        return [dapo_row("hub problem", "9"), dapo_row("hub problem 2", "10")]

    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", module)
    return calls


@pytest.mark.parametrize(
    ("dataset", "source"), [("dapo-math-17k", "zhuzilin/dapo-math-17k"), ("aime-2024", "zhuzilin/aime-2024")]
)
def test_known_datasets_load_from_the_hub(tmp_path, fake_datasets, dataset, source):
    out = tmp_path / "out.jsonl"
    assert dp.main(["--dataset", dataset, "--out", str(out)]) == 0
    assert fake_datasets == [(source, "train")]
    assert [r["label"] for r in read_jsonl(out)] == ["9", "10"]


def test_other_hub_id_and_split(tmp_path, fake_datasets, capsys):
    out = tmp_path / "out.jsonl"
    assert dp.main(["--dataset", "mine", "--source", "me/my-set", "--split", "test", "--out", str(out)]) == 0
    assert fake_datasets == [("me/my-set", "test")]
    assert dp.main(["--dataset", "mine", "--source", "broken/set", "--out", str(out)]) == 2
    assert "could not load 'broken/set'" in capsys.readouterr().err


def test_datasets_is_imported_lazily():
    code = "import sys, data_prep.prepare; print('datasets' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_module_entry_point(tmp_path):
    src = write_jsonl(tmp_path / "src.jsonl", GOOD_ROWS)
    out = tmp_path / "out.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "data_prep.prepare",
        "--dataset",
        "aime-2024",
        "--source",
        str(src),
        "--out",
        str(out),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""  # progress and summary go to stderr
    assert "wrote 5" in result.stderr
    assert len(read_jsonl(out)) == 5


def _prepare_process(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m data_prep.prepare argv...`` as a user runs it (hub access off: nothing here may reach it)."""
    return subprocess.run(
        [sys.executable, "-m", "data_prep.prepare", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **env},
        timeout=120,  # a safety net for a hung process, not a speed requirement
    )


def test_without_hub_access_the_error_says_to_pass_a_local_file(tmp_path):
    pytest.importorskip("datasets", reason="the hub path needs datasets: pip install -e '.[data]'")
    result = _prepare_process("--dataset", "aime-2024", "--out", str(tmp_path / "aime.jsonl"))
    assert result.returncode == 2
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert line.startswith(
        "error: could not load 'zhuzilin/aime-2024' (split 'train') from the Hugging Face hub: "
    )
    assert line.endswith(
        " -- hint: check the dataset id and your access to the hub (HF_TOKEN, HF_HUB_OFFLINE), or pass a copy of "
        "it as a local file: --source ./aime-2024.parquet (.jsonl, .json or .parquet, e.g. saved with datasets' "
        "to_parquet where the hub is reachable)"
    )
    assert not (tmp_path / "aime.jsonl").exists()


def test_rows_without_the_prompt_key_point_at_input_key(tmp_path):
    src = write_jsonl(
        tmp_path / "src.jsonl", [{"question": "1 + 1?", "answer": "2"}, {"question": "2 + 2?", "answer": "4"}]
    )
    out = tmp_path / "out.jsonl"
    result = _prepare_process("--dataset", "mine", "--source", str(src), "--out", str(out))
    assert result.returncode == 1
    assert "missing_prompt: 2" in result.stderr
    assert (
        "hint: the source's rows have no 'prompt' key (their keys: 'question', 'answer'): pass --input-key KEY "
        "naming it" in result.stderr
    )
    assert "pass --label-key KEY naming it" in result.stderr
    fixed = _prepare_process(
        "--dataset",
        "mine",
        "--source",
        str(src),
        "--out",
        str(out),
        "--input-key",
        "question",
        "--label-key",
        "answer",
    )
    assert fixed.returncode == 0, fixed.stderr
    assert "hint:" not in fixed.stderr
    assert [row["label"] for row in read_jsonl(out)] == ["2", "4"]


def test_a_missing_datasets_package_names_the_install_and_the_local_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    from data_prep.install_hints import install_command

    assert dp.main(["--dataset", "aime-2024", "--out", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert (
        f"error: loading 'zhuzilin/aime-2024' from the hub needs `datasets` -- hint: {install_command('data')}"
        in err
    )
    assert "--source ./aime-2024.parquet" in err


def _png(color: tuple[int, int, int]) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (40, 30), color).save(out, format="PNG")
    return out.getvalue()


def test_geometry3k_rows_carry_their_figures_as_slime_reads_them(tmp_path, capsys):
    """hiyouga/geometry3k's shape (problem, answer, images as ``datasets`` Image structs, which slime's loader
    would silently drop): each figure becomes a data URI, each prompt one ``<image>`` per figure; the same text
    with another figure is another problem; placeholders that do not match the figures drop the row."""
    pa = pytest.importorskip("pyarrow")
    import base64

    import pyarrow.parquet as pq

    red, blue = _png((200, 0, 0)), _png((0, 0, 200))
    rows = [
        {"problem": "<image>Find x.", "answer": "2\\sqrt{3}", "images": [{"bytes": red, "path": "a.png"}]},
        {"problem": "<image>Find x.", "answer": "5", "images": [{"bytes": blue, "path": None}]},
        {"problem": "Find y.", "answer": "7", "images": [{"bytes": red, "path": None}]},
        {"problem": "<image><image>Find z.", "answer": "1", "images": [{"bytes": red, "path": None}]},
        {"problem": "<image>Find w.", "answer": "1", "images": [{"bytes": b"nope", "path": None}]},
    ]
    source = tmp_path / "geo3k.parquet"
    pq.write_table(pa.Table.from_pylist(rows), source)
    out = tmp_path / "geo3k.jsonl"
    assert dp.main(["--dataset", "geometry3k", "--source", str(source), "--out", str(out)]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"][0]["content"] for r in written] == [
        "<image>Find x.",
        "<image>Find x.",
        "<image>Find y.",
    ]
    assert [r["label"] for r in written] == ["2\\sqrt{3}", "5", "7"]
    assert [base64.b64decode(r["images"][0].partition(",")[2]) for r in written] == [red, blue, red]
    assert all(r["images"][0].startswith("data:image/png;base64,") for r in written)
    err = capsys.readouterr().err
    assert "image_count" in err and "bad_image" in err
