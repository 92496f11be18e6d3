"""Math rewards: answer extraction, integer and math-verify grading, shaping, eval accuracy, robustness."""

from __future__ import annotations

import asyncio
import os
import re
import types
from pathlib import Path

import pytest
from helpers import verify_workers
from slime_helpers import slime_args

from slime_strands._verify_worker import verify_in_worker
from slime_strands.agent.record import EpisodeRecord, Termination
from slime_strands.reward import EVAL_GRADES, accuracy, extract_answer, final_answer_text, grade, math_reward
from slime_strands.settings import REWARD_KINDS, SettingsError
from slime_strands.testing.slime_types import Sample

END = "<|im_end|>"


def metadata(**fields):
    """sample.metadata as generate() writes it: the episode record under "strands"."""
    return {"strands": EpisodeRecord(Termination.END_TURN, **fields).to_metadata()}


def sample(response: str, label: object = "34", *, evaluation: bool = False, tool_iters: int = 0, **fields):
    return Sample(
        response=response,
        label=label,
        metadata=metadata(evaluation=evaluation, tool_iters=tool_iters, **fields),
    )


def args(**reward):
    return slime_args(strands={"reward": reward} if reward else None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so\nAnswer: 34", "34"),
        ("Answer: \\boxed{34}", "34"),
        ("**Answer:** $\\boxed{-7}$", "-7"),
        ("Final answer: 12\nthen more text \\boxed{13}", "12"),  # an Answer: line wins over a box
        ("we get \\boxed{3} and finally \\boxed{4}.", "4"),  # the last box
        ("\\boxed{\\boxed{5}}", "5"),  # nested
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # braces inside the box
        ("\\boxed{2} and an unclosed \\boxed{3", "2"),  # malformed last box: the last balanced one
        ("\\fbox{8}", "8"),
        ("\\boxed 9", "9"),
        ("Answer:\n\\boxed{6}", "6"),  # empty Answer: line: fall back to the box
        ("no answer here", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("answer", "label", "ok"),
    [
        ("34", "34", True),
        ("034", "34", True),
        ("34.0", "34", True),
        ("-5", "-5", True),
        ("5", "-5", False),
        ("1,000", "1000", True),
        ("1{,}000", "1000", True),
        ("$1000$", "1000", True),
        ("\\text{ 42 }", "42", True),
        ("x = 17", "17", True),
        ("90^\\circ", "90", True),
        ("35", "34", False),
        ("3.5", "34", None),  # not an integer: math-verify decides
        ("34", 34, True),  # integer labels given as numbers
        ("34", "34.0", True),
    ],
)
def test_integer_grading(answer, label, ok):
    assert grade(f"Answer: {answer}{END}", label) is ok


def test_only_the_final_turn_after_reasoning_counts():
    history = (
        "<tool_call>\n{}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nAnswer: 34\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert grade(history + f"<think>maybe \\boxed{{34}}</think>\n\nIt is \\boxed{{35}}{END}", "34") is False
    assert grade(history + f"<think>hmm</think>\n\nAnswer: 34{END}", "34") is True
    assert grade(history + "<think>Answer: 34 ... (cut off)", "34") is False  # reasoning never finished
    # A tool response at the end (limit hit mid-episode) is not an answer either.
    assert grade("<tool_response>\nAnswer: 34\n</tool_response>", "34") is False


def test_final_turn_located_from_rollout_metadata_for_any_template():
    final = "[/INST] Answer: 34</s>"
    response = "tool said Answer: 99 " + final
    meta = metadata(final_turn_chars=len(final))
    assert final_answer_text(response, meta).strip() == "Answer: 34", "Mistral's markup is not answer text"
    assert grade(response.replace("34", "12"), "12", metadata=meta) is True
    wrong = "tool said Answer: 34 [/INST] Answer: 99</s>"
    assert grade(wrong, "34", metadata=metadata(final_turn_chars=len(" [/INST] Answer: 99</s>"))) is False


async def test_training_reward_and_tool_shaping():
    assert await math_reward(args(), sample(f"Answer: 34{END}")) == 1.0
    # The seeds' recipe: min(-0.6, -1 + (tool_iters - 2) * 0.05).
    assert await math_reward(args(), sample(f"Answer: 3{END}", tool_iters=0)) == pytest.approx(-1.1)
    assert await math_reward(args(), sample(f"Answer: 3{END}", tool_iters=6)) == pytest.approx(-0.8)
    assert await math_reward(args(), sample(f"Answer: 3{END}", tool_iters=40)) == pytest.approx(-0.6)
    assert await math_reward(args(tool_shaping=False), sample("Answer: 3", tool_iters=40)) == -1.0
    custom = args(correct=2.0, incorrect=0.0, shaping_cap=0.5, shaping_per_iter=0.1, shaping_baseline_iters=0)
    assert await math_reward(custom, sample("Answer: 34")) == 2.0
    assert await math_reward(custom, sample("Answer: 1", tool_iters=3)) == pytest.approx(0.3)


async def test_eval_is_plain_accuracy():
    for iters in (0, 10):
        assert await math_reward(args(), sample("Answer: 34", evaluation=True, tool_iters=iters)) == 1.0
        assert await math_reward(args(), sample("Answer: 3", evaluation=True, tool_iters=iters)) == 0.0
    assert await accuracy(args(), sample("Answer: 34")) == 1.0
    assert await accuracy(args(), sample("Answer: 33", tool_iters=9)) == 0.0


async def test_samples_from_other_generators_are_not_shaped():
    plain = Sample(response="Answer: 3", label="34")
    plain.tool_iters = 0
    assert await math_reward(args(), plain) == -1.0


@pytest.mark.parametrize(
    "bad",
    [
        Sample(response="Answer: 34", label=None),
        Sample(response=None, label="34"),  # type: ignore[arg-type]
        Sample(response="Answer: 34", label="34", metadata={"strands": "junk"}),
        types.SimpleNamespace(),
    ],
)
async def test_never_raises_never_none(bad):
    for fn in (math_reward, accuracy):
        value = await fn(args(), bad)
        assert isinstance(value, float)


@pytest.mark.parametrize("fn", [math_reward, accuracy])
async def test_invalid_settings_stop_the_run_instead_of_scoring_with_defaults(fn):
    with pytest.raises(SettingsError, match=r"unknown setting\(s\) reward\.bogus"):
        await fn(args(bogus=1), sample("Answer: 3"))
    with pytest.raises(SettingsError, match="math_verify_timeout_s must be > 0"):
        await fn(args(math_verify_timeout_s=0), [sample("Answer: 3")])


async def test_non_integer_labels_use_math_verify():
    pytest.importorskip("math_verify")
    assert await accuracy(args(), sample("\\boxed{\\frac{1}{2}}", label="0.5")) == 1.0
    assert await accuracy(args(), sample("\\boxed{\\dfrac12}", label="\\frac{1}{2}")) == 1.0
    assert await accuracy(args(), sample("\\boxed{2\\sqrt{3}}", label="\\sqrt{12}")) == 1.0
    assert await accuracy(args(), sample("\\boxed{(1, 2)}", label="(1,2)")) == 1.0
    assert await accuracy(args(), sample("\\boxed{\\frac{1}{3}}", label="0.5")) == 0.0
    assert await accuracy(args(), sample("no answer", label="0.5")) == 0.0
    # Integer label, non-integer-looking answer: math-verify settles it.
    assert await accuracy(args(), sample("\\boxed{\\frac{68}{2}}", label="34")) == 1.0


def _computing_verify_workers() -> list[int]:
    """pids of this process's math-verify workers that are computing (state R) right now."""
    busy = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = stat.with_name("cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] == "R" and b"slime_strands._verify_worker" in cmdline:
            busy.append(int(stat.parent.name))
    return busy


async def test_pathological_expression_times_out_without_blocking_the_loop():
    pytest.importorskip("math_verify")
    await accuracy(args(), sample("\\boxed{1}", label="0.5"))  # a warm worker, idle
    hard = sample("\\boxed{9^{9^{9^{9}}}}", label="\\pi")
    task = asyncio.create_task(math_reward(args(math_verify_timeout_s=3), hard))
    # This loop keeps turning while a worker is stuck on the question: a grader that blocked it would
    # return (the worker killed) before this could ever see the worker computing.
    while not _computing_verify_workers():
        await asyncio.sleep(0.01)
    assert not task.done()
    assert await task == pytest.approx(-1.1)  # overran its limit: graded wrong
    # The stuck worker was replaced: grading still works afterwards.
    assert await accuracy(args(), sample("\\boxed{0.5}", label="\\frac12")) == 1.0


async def test_concurrent_grading():
    pytest.importorskip("math_verify")
    samples = [sample(f"\\boxed{{{i}/2}}", label=f"{i / 2}") for i in range(1, 13)]
    assert await asyncio.gather(*(accuracy(args(), s) for s in samples)) == [1.0] * 12


@pytest.mark.timeout(10)  # a hang guard: quadratic scanning of these took minutes on the event loop
def test_many_unclosed_boxes():
    assert grade("\\boxed{5} then " + "\\boxed{" * 30000, "5") is True
    assert grade("\\boxed{" * 30000, "5") is False


# A response (what slime decodes after the prompt) per family: a call turn, a tool result that prints a wrong
# "Answer: 99", then the final turn. The formats are those of tests/families/templates.
FAMILY_RESPONSES = {
    "qwen3": (
        '<tool_call>\n{"name": "run", "arguments": {}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n'
        "Answer: 99\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        "<think>\nmaybe 99</think>\n\nAnswer: \\boxed{34}<|im_end|>",
    ),
    "glm45": (
        "\n<think>run it</think>\n<tool_call>run\n<arg_key>c</arg_key>\n<arg_value>x</arg_value>\n</tool_call>"
        "<|observation|>\n<tool_response>\nAnswer: 99\n</tool_response><|assistant|>",
        "\n<think>so 34</think>\nAnswer: 34<|user|>",
    ),
    "glm47": (
        "run it</think><tool_call>run<arg_key>c</arg_key><arg_value>x</arg_value></tool_call><|observation|>"
        "<tool_response>Answer: 99</tool_response><|assistant|><think>",
        "Answer: 99 is wrong, so</think>Answer: 34<|user|>",
    ),
    "kimi_k2": (
        "<think></think><|tool_calls_section_begin|><|tool_call_begin|>functions.run:0<|tool_call_argument_begin|>{}"
        "<|tool_call_end|><|tool_calls_section_end|><|im_end|><|im_system|>tool<|im_middle|>## Return of "
        "functions.run:0\nAnswer: 99<|im_end|><|im_assistant|>assistant<|im_middle|>",
        "<think>Answer: 99?</think>Answer: 34<|im_end|>",
    ),
    "deepseekv31": (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>run<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        "<｜end▁of▁sentence｜><｜tool▁output▁begin｜>Answer: 99<｜tool▁output▁end｜>",
        "Answer: 34<｜end▁of▁sentence｜>",
    ),
    "llama3": (
        '{"name": "run", "parameters": {}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"Answer: 99"'
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        "Answer: 34<|eot_id|>",
    ),
}


@pytest.mark.parametrize("family", sorted(FAMILY_RESPONSES))
@pytest.mark.parametrize("located", [True, False], ids=["final_turn_chars", "template_markers"])
def test_final_turn_grading_for_every_family(family, located):
    history, final = FAMILY_RESPONSES[family]
    meta = {"strands": {"final_turn_chars": len(final)}} if located else None
    assert grade(history + final, "34", metadata=meta) is True
    assert grade(history + final, "99", metadata=meta) is False, "the tool output's answer never counts"
    assert "Answer: 99" not in final_answer_text(history + final, meta)


def test_reasoning_opened_by_the_generation_prompt_is_not_an_answer():
    # GLM-4.7 / Qwen3-thinking: the prompt opened <think>; a turn cut before </think> has no answer.
    history, _ = FAMILY_RESPONSES["glm47"]
    cut = "Answer: 34 is my guess"
    assert final_answer_text(history + cut, {"strands": {"final_turn_chars": len(cut)}}) == ""
    done = "thinking</think>Answer: 34<|user|>"
    assert grade(history + done, "34", metadata={"strands": {"final_turn_chars": len(done)}}) is True


CALL_OPENERS = {
    "qwen3": "<tool_call>",
    "glm45": "<tool_call>",
    "glm47": "<tool_call>",
    "kimi_k2": "<|tool_calls_section_begin|>",
    "deepseekv31": "<｜tool▁calls▁begin｜>",
    "llama3": '{"name"',
}


@pytest.mark.parametrize("family", sorted(FAMILY_RESPONSES))
def test_without_metadata_only_the_last_assistant_turn_is_graded(family):
    """No rollout metadata: the final turn starts at the LAST assistant-turn marker. An earlier turn that wrote
    "Answer: 34" and then called a tool is history; a final turn without an answer grades False."""
    history, final = FAMILY_RESPONSES[family]
    opener = CALL_OPENERS[family]
    answered_then_called = history.replace(opener, "Answer: 34\n" + opener, 1)
    assert answered_then_called != history
    unanswered = final.replace("Answer: \\boxed{34}", "Answer: 34").replace("Answer: 34", "I cannot tell.")
    assert unanswered != final
    end = re.search(r"<[|｜][^<>]*[|｜]>$", final)
    assert end is not None
    bare = "I cannot tell." + end.group()  # a final turn without reasoning (nothing to split the text at)
    assert grade(history + answered_then_called + final, "34") is True
    for last in (unanswered, bare):
        assert grade(history + answered_then_called + last, "34") is False
        assert "Answer: 34" not in final_answer_text(history + answered_then_called + last)


def test_eval_grades_every_reward_kind_the_settings_accept():
    assert sorted(EVAL_GRADES) == sorted(REWARD_KINDS)


def test_a_loops_math_verify_workers_stop_when_the_loop_ends():
    """However the loop ends (here ``asyncio.run``'s), the workers it started do not outlive it."""
    before = verify_workers()

    async def grade_and_list() -> tuple[bool, set[int]]:
        ok = await verify_in_worker("\\frac{1}{2}", "0.5", timeout_s=60)
        return ok, verify_workers() - before

    ok, started = asyncio.run(grade_and_list())
    assert ok and started, "graded by a worker of this loop"
    assert not verify_workers() & started
