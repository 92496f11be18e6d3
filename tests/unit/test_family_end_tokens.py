"""The model's end-of-sequence tokens, read as SGLang reads them: the tokenizer's eos, the checkpoint's
config.json / generation_config.json ``eos_token_id`` and <|eom_id|> where the vocabulary has it."""

from __future__ import annotations

import copy
import json
import logging

from family_kit import family_tokenizer

from slime_strands.template.probe import end_of_sequence_ids
from slime_strands.template.render import ChatRenderer


def end_of_sequence_tokens(tok):
    return tuple(tok.convert_ids_to_tokens(list(end_of_sequence_ids(tok))))


def _qwen3_in(folder, **files):
    tok = copy.deepcopy(family_tokenizer("qwen3_coder"))
    for name, content in files.items():
        (folder / f"{name}.json").write_text(content if isinstance(content, str) else json.dumps(content))
    tok.name_or_path = str(folder)
    return tok


def test_eos_ids_of_config_and_generation_config_in_the_tokenizer_folder(tmp_path):
    tok = _qwen3_in(
        tmp_path,
        config={"eos_token_id": 151643, "bos_token_id": 151644},
        generation_config={"eos_token_id": [151645, 151657, 10**9, -1, "x", True, 9707, 100024]},
    )
    # 10**9, -1: not in the vocabulary; "x", True: not ids; 9707: "Hello"; 100024: half a UTF-8 character
    assert end_of_sequence_tokens(tok)[:4] == ("<|im_end|>", "<|endoftext|>", "<tool_call>", "Hello")
    assert len(end_of_sequence_tokens(tok)) == 5
    renderer = ChatRenderer(tok)
    assert renderer.facts.end_tokens == ("<|endoftext|>", "<tool_call>", "Hello"), (
        "stop tokens are not repeated; a token whose text does not encode back to it is left out"
    )
    assert renderer.turn_end_ids == (151645, 151643, 151657, 9707)


def test_no_config_files_leaves_the_tokenizer_eos(tmp_path):
    assert end_of_sequence_tokens(_qwen3_in(tmp_path)) == ("<|im_end|>",)
    hub_id = copy.deepcopy(family_tokenizer("qwen3_coder"))
    hub_id.name_or_path = "slime-strands-tests/not-in-the-hub-cache"  # looked up in the local cache only
    assert end_of_sequence_tokens(hub_id) == ("<|im_end|>",)


def test_unreadable_config_is_a_warning_not_a_failure(tmp_path, caplog):
    tok = _qwen3_in(tmp_path, generation_config="{not json", config=["a list"])
    with caplog.at_level(logging.WARNING, logger="slime_strands.template.facts"):
        assert end_of_sequence_tokens(tok) == ("<|im_end|>",)
    assert caplog.text.count("cannot read eos_token_id") == 2


def test_eom_is_an_end_token_of_every_tokenizer_that_has_it():
    assert "<|eom_id|>" in end_of_sequence_tokens(family_tokenizer("llama3"))
    assert "<|eom_id|>" not in end_of_sequence_tokens(family_tokenizer("hermes"))
