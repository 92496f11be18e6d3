"""``slime-strands inspect --html out.html``: one self-contained page (inline CSS and script, nothing fetched:
its Content-Security-Policy forbids any network access) showing a trajectory token by token.

Every token is a ``<span class="t ...">`` with its position, id and logprob in ``data-`` attributes: ``p``
prompt, ``g`` generated, ``o`` tool / template tokens, ``m1`` trained (loss mask 1). Hovering a token shows
its position, id, logprob and probability; trained tokens below the low-confidence threshold (editable on the
page) turn red; ``#t-<segment>-<index>`` in the address jumps to a token and shows its details. All text from
the trajectory is HTML-escaped: model and tool output cannot inject markup or script.
"""

from __future__ import annotations

import html

from ...trajectories.view import Block, SegmentView, TokenCell, TrajectoryView

__all__ = ["render_html"]

_KIND_CLASS = {"prompt": "p", "generated": "g", "observation": "o"}

_STYLE = """
:root { font-family: system-ui, sans-serif; color: #1b1f24; }
body { margin: 0; }
header { position: sticky; top: 0; background: #f6f8fa; border-bottom: 1px solid #d0d7de; padding: 8px 16px;
  z-index: 2; }
h1 { font-size: 15px; margin: 0 0 6px; }
h2 { font-size: 14px; margin: 18px 0 6px; }
main { padding: 0 16px 40px; }
.legend span { padding: 1px 6px; margin-right: 6px; border-radius: 3px; font-size: 12px; }
.controls { font-size: 12px; margin-top: 6px; }
.controls input[type=number] { width: 5em; }
.block { border-left: 3px solid #d0d7de; margin: 8px 0; padding-left: 8px; }
.block.generated { border-color: #2da44e; }
.block.observation { border-color: #218bff; }
.head { font-size: 12px; color: #57606a; font-weight: 600; margin-bottom: 2px; }
pre.verdict { white-space: pre-wrap; margin: 0; font: 13px/1.45 ui-monospace, monospace; }
pre.tokens { white-space: pre-wrap; word-break: break-word; margin: 0; font: 13px/1.55 ui-monospace, monospace; }
.notes { font-size: 12px; margin: 4px 0; padding-left: 18px; color: #444; }
.t { border-radius: 2px; }
.img { max-width: 480px; max-height: 360px; border: 1px solid #999; }
.t.p { color: #6e7781; }
.t.o { background: #d3ebff; }
.t.o:nth-child(even) { background: #b3dbff; }
.t.m1 { background: #c9f5d3; }
.t.m1:nth-child(even) { background: #9fe6b1; }
.t.m1.low { background: #ff8182; color: #fff; }
.t.nl::before { content: "\\21B5"; opacity: .35; }
.t:hover, .t.focus { outline: 2px solid #0969da; }
body.hide-prompt .block.prompt pre { display: none; }
#tip { position: fixed; background: #24292f; color: #fff; font: 12px ui-monospace, monospace; padding: 4px 8px;
  border-radius: 4px; pointer-events: none; z-index: 3; white-space: pre; }
"""

_SCRIPT = """
(function () {
  var threshold = document.getElementById("threshold");
  var count = document.getElementById("low-count");
  var trained = Array.prototype.slice.call(document.querySelectorAll("pre.tokens .t.m1"));
  var tip = document.getElementById("tip");
  function mark() {
    var limit = parseFloat(threshold.value), n = 0;
    trained.forEach(function (el) {
      var low = parseFloat(el.dataset.lp) < limit;
      el.classList.toggle("low", low);
      if (low) { n += 1; }
    });
    count.dataset.count = String(n);
    count.textContent = n + " trained token" + (n === 1 ? "" : "s") + " below it";
  }
  function describe(el) {
    var lp = parseFloat(el.dataset.lp), kind = { p: "prompt", g: "generated", o: "tool / template" };
    var k = el.classList.contains("p") ? "p" : el.classList.contains("g") ? "g" : "o";
    var text = "token " + el.dataset.i + " · id " + el.dataset.id + " · " + kind[k] +
      " · loss mask " + (el.classList.contains("m1") ? 1 : 0);
    if (el.classList.contains("m1")) { text += "\\nlogprob " + lp.toFixed(4) + " · p " + Math.exp(lp).toFixed(4); }
    return text;
  }
  function show(el, x, y) {
    tip.textContent = describe(el);
    tip.dataset.token = el.dataset.i;
    tip.style.left = (x + 12) + "px";
    tip.style.top = (y + 12) + "px";
    tip.hidden = false;
  }
  document.addEventListener("mouseover", function (event) {
    var el = event.target.closest ? event.target.closest("pre.tokens .t") : null;
    if (el) { show(el, event.clientX, event.clientY); } else { tip.hidden = true; }
  });
  function jump() {
    var match = /^#t-(\\d+)-(\\d+)$/.exec(window.location.hash);
    if (!match) { return; }
    var el = document.querySelector("#segment-" + match[1] + " .t[data-i='" + match[2] + "']");
    if (!el) { return; }
    document.querySelectorAll(".t.focus").forEach(function (f) { f.classList.remove("focus"); });
    el.classList.add("focus");
    el.scrollIntoView({ block: "center" });
    var box = el.getBoundingClientRect();
    show(el, box.left, box.bottom);
  }
  threshold.addEventListener("input", mark);
  document.getElementById("show-prompt").addEventListener("change", function (event) {
    document.body.classList.toggle("hide-prompt", !event.target.checked);
  });
  window.addEventListener("hashchange", jump);
  mark();
  jump();
  document.body.dataset.ready = "1";
})();
"""


def render_html(view: TrajectoryView, *, low_logprob: float) -> str:
    row = view.row
    segments = "".join(_segment(s, len(view.segments)) for s in view.segments) or (
        f"<p>No tokens: {_e(row.error or 'the episode produced none')}</p>"
    )
    verdict = (
        f"<section id='verdict'><h2>{_e(view.verdict[0])}</h2>"
        f"<pre class='verdict'>{_e(chr(10).join(view.verdict[1:]))}</pre></section>"
        if view.verdict
        else ""
    )
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'; img-src data:\">"
        f"<title>trajectory {_e(row.key)} · slime-strands inspect</title><style>{_STYLE}</style></head>"
        f"<body data-key='{_e(row.key)}'><header><h1>{_e(view.headline)}</h1>"
        "<div class='legend'><span class='t p'>prompt</span><span class='t m1'>trained (loss mask 1)</span>"
        "<span class='t o'>tool / template (loss mask 0)</span><span class='t m1 low'>low confidence</span></div>"
        "<div class='controls'><label>low confidence: logprob below "
        f"<input id='threshold' type='number' step='0.1' value='{low_logprob:g}'></label> "
        "<span id='low-count'></span> · <label><input id='show-prompt' type='checkbox' checked> show the prompt"
        "</label></div></header>"
        f"<main>{verdict}{segments}</main><div id='tip' hidden></div><script>{_SCRIPT}</script></body></html>\n"
    )


def _segment(segment: SegmentView, total: int) -> str:
    blocks = "".join(_block(b) for b in segment.blocks)
    about = f" · {_e(segment.about)}" if segment.about else ""
    return (
        f"<section class='segment' id='segment-{segment.number}'><h2>segment {segment.number} of {total} · "
        f"{segment.tokens} tokens · {segment.trained} trained{about}</h2>{blocks}</section>"
    )


def _block(block: Block) -> str:
    notes = "".join(f"<li>{_e(note)}</li>" for note in block.notes)
    notes_html = f"<ul class='notes'>{notes}</ul>" if notes else ""
    kind = _KIND_CLASS[block.kind]
    tokens = "".join(
        f"<span class='t {kind}{' m1' if c.trained else ''}{' nl' if chr(10) in c.text else ''}' "
        f"data-i='{c.index}' data-id='{c.token_id}' data-lp='{c.logprob:.6g}'>{_cell(c)}</span>"
        for c in block.cells
    )
    head = f"<div class='head'>{_e(' · '.join(block.header()))}</div>"
    body = f"<pre class='tokens'>{tokens}</pre>"
    inner = head + (body + notes_html if block.kind == "generated" else notes_html + body)
    return f"<div class='block {block.kind}' data-start='{block.start}' data-end='{block.end}'>{inner}</div>"


def _cell(cell: TokenCell) -> str:
    """A token's text; an image's run: its name and the image inline (a data:image URI, checked when read)."""
    if cell.image is None:
        return _e(cell.text)
    return f"{_e(cell.text)}<br><img class='img' src='{_e(cell.image)}' alt='{_e(cell.text)}'><br>"


def _e(text: str) -> str:
    return html.escape(text, quote=True)
