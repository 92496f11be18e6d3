"""``slime-strands inspect`` in a terminal: the trajectory's text token by token, coloured by what training
does with each token, or one line per token (``--tokens``) for grep and scripts.

Colours (ANSI 256): prompt tokens grey text; trained tokens (loss mask 1) on green; tool and template tokens
(loss mask 0) on blue; trained tokens sampled with a logprob below the threshold on red. Neighbouring tokens
alternate two shades so every token boundary is visible. Every token is written as one
``ESC[<style>m<text>ESC[0m`` run. Without colour the text is plain and low-confidence tokens are marked
``⟦like this⟧``.
"""

from __future__ import annotations

import json
import unicodedata

from ...trajectories.view import Block, TokenCell, TrajectoryView

__all__ = ["STYLES", "render_terminal", "render_token_table", "token_class", "visible"]

STYLES = {
    "prompt": ("38;5;244", "38;5;248"),
    "trained": ("30;48;5;157", "30;48;5;194"),
    "untrained": ("30;48;5;153", "30;48;5;189"),
    "low": ("1;97;48;5;160", "1;97;48;5;124"),
}
"""Style pairs (even, odd token index) per token class."""
_RESET = "\x1b[0m"
_BOLD = "\x1b[1m"


def visible(text: str) -> str:
    """Control characters written by the model or its tools (``ESC[2J``, ``\\r``, bells) shown escaped, never
    sent to the terminal; newlines and tabs kept."""
    if text.isprintable():
        return text
    return "".join(
        ch if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf") else ascii(ch)[1:-1] for ch in text
    )


def token_class(block: Block, cell: TokenCell, low_logprob: float) -> str:
    if cell.trained:
        return "low" if cell.logprob < low_logprob else "trained"
    return "prompt" if block.kind == "prompt" else "untrained"


def render_terminal(view: TrajectoryView, *, color: bool, low_logprob: float) -> str:
    lines = [_bold(visible(view.headline), color)]
    lines += [visible(line) for line in view.verdict]
    lines.append(_legend(color, low_logprob))
    if not view.segments:
        lines.append(f"(no tokens: {view.row.error or 'the episode produced none'})")
    for segment in view.segments:
        about = f" · {visible(segment.about)}" if segment.about else ""
        lines.append(
            _bold(
                f"══ segment {segment.number} of {len(view.segments)} · {segment.tokens} tokens · "
                f"{segment.trained} trained{about} ══",
                color,
            )
        )
        for block in segment.blocks:
            lines.append(_bold(_block_header(block, low_logprob), color))
            if block.kind == "generated":
                lines.append(_text(block, color, low_logprob))
                lines += [f"   ↳ {visible(note)}" for note in block.notes]
            else:
                lines += [f"   ↳ {visible(note)}" for note in block.notes]
                lines.append(_text(block, color, low_logprob))
    return "\n".join(lines) + "\n"


def _block_header(block: Block, low_logprob: float) -> str:
    parts = block.header()
    if block.kind == "generated":
        parts.append(f"{block.low_confidence(low_logprob)} below {low_logprob:g}")
    return "── " + " · ".join(parts) + " ──"


def _text(block: Block, color: bool, low_logprob: float) -> str:
    if color:
        out = []
        for cell in block.cells:
            style = STYLES[token_class(block, cell, low_logprob)][cell.index % 2]
            out.append(f"\x1b[{style}m{visible(cell.text)}{_RESET}")
        return "".join(out)
    return "".join(
        f"⟦{visible(cell.text)}⟧" if token_class(block, cell, low_logprob) == "low" else visible(cell.text)
        for cell in block.cells
    )


def _legend(color: bool, low_logprob: float) -> str:
    labels = {
        "prompt": "prompt",
        "trained": "trained (loss mask 1)",
        "untrained": "tool / template (loss mask 0)",
        "low": f"low confidence (logprob < {low_logprob:g})",
    }
    if not color:
        return f"legend: low-confidence trained tokens are marked ⟦like this⟧ (logprob < {low_logprob:g})"
    return "legend: " + "  ".join(f"\x1b[{STYLES[k][0]}m {v} {_RESET}" for k, v in labels.items())


def _bold(text: str, color: bool) -> str:
    return f"{_BOLD}{text}{_RESET}" if color else text


def render_token_table(view: TrajectoryView) -> str:
    """Tab-separated, one token a line: segment, index, block, loss mask, logprob, id, text (a JSON string)."""
    lines = ["segment\tindex\tblock\tloss_mask\tlogprob\ttoken_id\ttext"]
    for segment in view.segments:
        for block in segment.blocks:
            for cell in block.cells:
                lines.append(
                    f"{segment.number}\t{cell.index}\t{block.title}\t{int(cell.trained)}\t{cell.logprob:.6f}\t"
                    f"{cell.token_id}\t{json.dumps(cell.text, ensure_ascii=False)}"
                )
    return "\n".join(lines) + "\n"
