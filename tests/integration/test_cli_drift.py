"""``slime-strands drift`` on trajectories a real eval wrote (real Qwen3 tokenizer and chat template): with and
without reasoning, with token ids that are not the tokenizer's canonical split, with tool-call JSON the template
re-serialises."""

from __future__ import annotations

import json

import pytest
from cli_helpers import CALL_ADD, check_row, eval_argv, read_rows, run_cli, write_config, write_data

from slime_strands.testing import SGLangTestServer, Turn

pytestmark = pytest.mark.timeout(120)

COMPACT_CALL = '<tool_call>\n{"name":"add","arguments":{"a":2,"b":3}}\n</tool_call>'


def _eval(tokenizer, tmp_path, capsys, scripts, **settings):
    """One prompt, one sample per script (keys 0:0, 0:1, ...); returns the trajectory file and its rows."""
    data = write_data(tmp_path / "data.jsonl", [{"prompt": "What is 2 + 3?", "label": "5"}])
    config = write_config(tmp_path / "plugin.yaml", **settings)
    out = tmp_path / "traj.jsonl"
    with SGLangTestServer(tokenizer, context_length=8192) as server:
        for sample, turns in enumerate(scripts):
            server.script(*turns, key=f"0:{sample}")
        argv = eval_argv(
            server.base_url, data, "--n", str(len(scripts)), "--config", str(config), "--out", str(out)
        )
        code, _, stderr = run_cli(capsys, *argv)
        assert code == 0, stderr
        rows = {row.key: row for row in read_rows(out)}
        for row in rows.values():
            check_row(row, server)
    return out, rows


def _drift(capsys, out):
    code, stdout, _ = run_cli(capsys, "drift", str(out), "--json")
    assert code == 0
    return {report["key"]: report for report in map(json.loads, stdout.splitlines())}


def test_drift_with_reasoning(tokenizer, tmp_path, capsys):
    out, rows = _eval(
        tokenizer,
        tmp_path,
        capsys,
        [
            # Qwen3 keeps reasoning after the last user message: nothing drifts.
            [
                "<think>\nLet me add.\n</think>\n\n" + CALL_ADD,
                "<think>\nDone.\n</think>\n\nAnswer: \\boxed{5}",
            ],
            # The template re-serialises the call's JSON: the model's compact JSON is lost, all of it trained.
            [
                "<think>\nLet me add.\n</think>\n\n" + COMPACT_CALL,
                "<think>\nDone.\n</think>\n\nAnswer: \\boxed{5}",
            ],
        ],
    )
    reports = _drift(capsys, out)
    kept = reports["0:0"]
    for name in ("retokenized", "rerendered"):
        assert (kept[name]["lost"], kept[name]["added"], kept[name]["first"]) == (0, 0, None), name
        assert kept[name]["tokens"] == len(rows["0:0"].segments[0].token_ids) and kept[name]["exact"]
    compact = reports["0:1"]
    assert compact["retokenized"]["lost"] == 0, "the compact JSON is canonical BPE: re-tokenizing keeps it"
    rerendered = compact["rerendered"]
    assert (
        rerendered["lost"] > 0
        and rerendered["lost_trained"] == rerendered["lost"]
        and rerendered["added"] > 0
    )
    assert rerendered["where"] == "turn 1"
    segment = rows["0:1"].segments[0]
    first_turn = next(s for s in segment.spans if s.kind == "generated")
    assert first_turn.start < rerendered["first"][1] < first_turn.end
    assert rerendered["sampled"][0] != rerendered["rebuilt"][0]
    assert rerendered["trained_share"] == pytest.approx(rerendered["lost_trained"] / sum(segment.loss_mask))


def test_drift_without_reasoning(tokenizer, tmp_path, capsys):
    """With thinking off, Qwen3's generation prompt writes an empty think block; re-rendering drops it from every
    turn but the last: those are template tokens (not trained) of the prompt."""
    out, rows = _eval(tokenizer, tmp_path, capsys, [[CALL_ADD, "Answer: \\boxed{5}"]], enable_thinking=False)
    empty_think = tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
    assert len(empty_think) == 4
    segment = rows["0:0"].segments[0]
    prompt = segment.spans[0]
    assert segment.token_ids[prompt.end - 4 : prompt.end] == empty_think, (
        "the generation prompt opened thinking off"
    )
    report = _drift(capsys, out)["0:0"]
    assert report["retokenized"]["lost"] == 0
    rerendered = report["rerendered"]
    assert (rerendered["lost"], rerendered["lost_trained"], rerendered["added"]) == (4, 0, 0)
    assert rerendered["first"] == [1, prompt.end - 4] and rerendered["where"] == "prompt"
    assert rerendered["sampled"] == ["<think>", "\n\n", "</think>"]


def test_drift_of_non_canonical_token_ids(tokenizer, tmp_path, capsys):
    """The server sampled " hel" + "lo" where the tokenizer writes " hello": re-tokenizing the text loses both
    sampled tokens (trained) and adds one."""
    hello, hel, lo = (tokenizer.encode(t, add_special_tokens=False) for t in (" hello", " hel", "lo"))
    assert len(hello) == len(hel) == len(lo) == 1
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    answer = encode("Say") + hel + lo + encode(".\nAnswer: \\boxed{5}")
    out, rows = _eval(tokenizer, tmp_path, capsys, [[Turn(token_ids=answer)]])
    report = _drift(capsys, out)["0:0"]
    retokenized = report["retokenized"]
    assert (retokenized["lost"], retokenized["lost_trained"], retokenized["added"]) == (2, 2, 1)
    segment = rows["0:0"].segments[0]
    turn = segment.spans[1]
    assert retokenized["first"] == [1, turn.start + 1] and retokenized["where"] == "turn 1"
    assert retokenized["sampled"][:2] == [" hel", "lo"] and retokenized["rebuilt"][0] == " hello"
    assert report["rerendered"]["lost_trained"] >= 2, "the re-rendered text is re-tokenized too"


def test_drift_table_and_errors(tokenizer, tmp_path, capsys):
    out, _ = _eval(
        tokenizer, tmp_path, capsys, [["Answer: \\boxed{5}"], [COMPACT_CALL, "Answer: \\boxed{5}"]]
    )
    code, table, _ = run_cli(capsys, "drift", str(out))
    assert code == 0
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["key", "tokens", "trained"] and "re-rendered: lost" in lines[0]
    assert lines[2].startswith("0:") and lines[4].startswith("total")
    assert "re-rendered: first differs at segment 1 token" in table
    code, one, _ = run_cli(capsys, "drift", str(out), "--index", "-1", "--json")
    assert code == 0 and len(one.splitlines()) == 1
    code, _, err = run_cli(capsys, "drift", str(tmp_path / "nope.jsonl"))
    assert code == 2 and "no such trajectory file" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("scripts", "verdict"),
    [
        (
            [["<think>\nEasy.\n</think>\n\nAnswer: \\boxed{5}"]] * 2,
            "no drift: every rebuild reproduces its trajectory token for token (2 re-tokenized, 2 re-rendered)",
        ),
        (
            [["<think>\nEasy.\n</think>\n\nAnswer: \\boxed{5}"], [COMPACT_CALL, "Answer: \\boxed{5}"]],
            "drift: re-tokenizing changes 0 of 2, re-rendering changes 1 of 2 trajectories (details above)",
        ),
    ],
    ids=["none", "some"],
)
def test_drift_ends_with_its_verdict(tokenizer, tmp_path, capsys, scripts, verdict):
    """The table ends with one line saying whether anything drifted: "no drift" when every rebuild is the
    sampled trajectory token for token, else how many trajectories each rebuild changes."""
    out, _ = _eval(tokenizer, tmp_path, capsys, scripts)
    code, table, _ = run_cli(capsys, "drift", str(out))
    assert code == 0
    last = table.splitlines()[-1]
    assert last.startswith(verdict), table
