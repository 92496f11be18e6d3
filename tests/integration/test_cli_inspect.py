"""``slime-strands inspect``: trajectories written by a real eval, shown token by token in the terminal and as
an HTML page, both parsed back; the page is also opened in headless Chromium."""

from __future__ import annotations

import dataclasses
import html.parser
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from cli_helpers import (
    call,
    check_row,
    eval_argv,
    low_confidence,
    read_rows,
    run_cli,
    run_cli_process,
    write_config,
    write_data,
)

from slime_strands.cli.inspect.terminal import STYLES, visible
from slime_strands.testing import SGLangTestServer, Turn
from slime_strands.trajectories.file import TrajectoryRow, TrajectoryWriter
from slime_strands.trajectories.view import token_texts

pytestmark = pytest.mark.timeout(120)

HOSTILE = '<script>alert("x")</script></pre><img src=x onerror=alert(1)>\x1b[2J'
ANSI_RUN = re.compile(r"\x1b\[([0-9;]+)m(.*?)\x1b\[0m", re.S)
CLASS_OF_STYLE = {style: name for name, pair in STYLES.items() for style in pair}


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory, tokenizer):
    """A tool-using episode whose tool returns markup and escape codes, and a one-turn episode with a
    multi-byte answer."""
    tmp = tmp_path_factory.mktemp("inspect")
    data = write_data(tmp / "data.jsonl", [{"prompt": "Echo something, then answer 5.", "label": "5"}])
    config = write_config(tmp / "plugin.yaml")
    out = tmp / "traj.jsonl"
    with SGLangTestServer(tokenizer, context_length=8192) as server:
        server.script(
            "<think>\nI will echo.\n</think>\n\n" + call("echo", text=HOSTILE),
            "<think>\nDone.\n</think>\n\nThe answer is 5 ✓.\nAnswer: \\boxed{5}",
            key="0:0",
        )
        server.script("Résumé: 五 is five.\nAnswer: \\boxed{5}", key="0:1")
        assert main_ok(
            eval_argv(server.base_url, data, "--n", "2", "--config", str(config), "--out", str(out))
        )
        rows = {row.key: row for row in read_rows(out)}
        for row in rows.values():
            check_row(row, server)
    return out, rows


def main_ok(argv):
    from slime_strands.cli import main

    return main(argv) == 0


def _index(path: Path, key: str) -> str:
    """What --index takes: the row key itself."""
    return key


def test_terminal_colours_parse_back(trajectories, tokenizer, capsys):
    path, rows = trajectories
    row = rows["0:0"]
    code, out, _ = run_cli(capsys, "inspect", str(path), "--index", _index(path, "0:0"), "--color", "always")
    assert code == 0
    (segment,) = row.segments
    texts = token_texts(tokenizer, segment.token_ids)
    legend, body = out.split("══ segment 1 of 1", 1)
    assert [CLASS_OF_STYLE[style] for style, _ in ANSI_RUN.findall(legend) if style in CLASS_OF_STYLE] == [
        "prompt",
        "trained",
        "untrained",
        "low",
    ]
    runs = [
        (CLASS_OF_STYLE[style], text) for style, text in ANSI_RUN.findall(body) if style in CLASS_OF_STYLE
    ]
    assert len(runs) == len(segment.token_ids), "one coloured run per token"
    kinds = {i: span.kind for span in segment.spans for i in range(span.start, span.end)}
    low = set(low_confidence(segment, -2.3))
    for i, (token_class, text) in enumerate(runs):
        assert text == visible(texts[i])
        if segment.loss_mask[i]:
            assert token_class == ("low" if i in low else "trained"), i
        else:
            assert token_class == ("prompt" if kinds[i] == "prompt" else "untrained"), i
    assert low, "the test server's logprobs put some tokens below -2.3"
    assert "".join(texts) == tokenizer.decode(segment.token_ids), "token texts cover the trajectory exactly"
    plain = ANSI_RUN.sub(lambda m: m.group(2), out)
    assert "\x1b[2J" not in plain and "\\x1b[2J" in plain, "escape codes from tools are shown, not obeyed"
    assert "── turn 1 · tokens" in plain and "finish stop" in plain and "── tool results · tokens" in plain
    assert (
        f"↳ call echo {json.dumps({'text': HOSTILE}, ensure_ascii=False)}".replace("\x1b", "\\x1b") in plain
    )
    assert "↳ echo -> <script>" in plain
    assert "══ segment 1 of 1" in plain and "trajectory 0:0 · dataset data · reward 1" in plain


def test_plain_text_and_token_table(trajectories, tokenizer, capsys):
    path, rows = trajectories
    row = rows["0:1"]
    (segment,) = row.segments
    index = _index(path, "0:1")
    code, out, _ = run_cli(
        capsys, "inspect", str(path), "--index", index, "--color", "never", "--low-logprob", "-3"
    )
    assert code == 0 and "\x1b[" not in out
    assert out.split("══ segment 1 of 1")[1].count("⟦") == len(low_confidence(segment, -3.0)) > 0
    assert "Résumé: 五 is five." in out.replace("⟦", "").replace("⟧", "")
    code, table, _ = run_cli(capsys, "inspect", str(path), "--index", index, "--tokens")
    header, *lines = table.splitlines()
    assert header.split("\t") == ["segment", "index", "block", "loss_mask", "logprob", "token_id", "text"]
    cells = [line.split("\t") for line in lines]
    assert [int(c[5]) for c in cells] == segment.token_ids
    assert [int(c[3]) for c in cells] == segment.loss_mask
    assert [float(c[4]) for c in cells] == pytest.approx(segment.logprobs, abs=1e-6)
    assert "".join(json.loads(c[6]) for c in cells) == tokenizer.decode(segment.token_ids)
    assert {c[2] for c in cells} == {"prompt", "turn 1"}


def test_list_and_index_errors(trajectories, tmp_path, capsys):
    path, _ = trajectories
    code, out, _ = run_cli(capsys, "inspect", str(path), "--list")
    assert code == 0 and out.splitlines()[0].split()[:3] == ["key", "dataset", "reward"]
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["0:0", "0:1"]
    code, _, err = run_cli(capsys, "inspect", str(path), "--index", "7")
    assert code == 2
    (line,) = err.splitlines()
    assert (
        "no trajectory with key 7:0: the file holds keys 0:0 to 0:1 (2 trajectories) -- hint: name a row"
        in line
    )
    for bad, says in (("-3", "no trajectory at --index -3"), ("first", "--index 'first' is not a row key")):
        code, _, err = run_cli(capsys, "inspect", str(path), "--index", bad)
        assert code == 2 and says in err and len(err.splitlines()) == 1
    code, _, err = run_cli(capsys, "inspect", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "no such trajectory file" in err and len(err.splitlines()) == 1
    broken = tmp_path / "broken.jsonl"
    broken.write_text(path.read_text().splitlines()[0] + "\n" + '{"schema": "something else"}\n')
    code, _, err = run_cli(capsys, "inspect", str(broken), "--list")
    assert code == 2 and f"{broken}:2: not a trajectory row: schema is 'something else'" in err
    code, _, err = run_cli(capsys, "inspect", str(path), "--tokenizer", "/nonexistent/tokenizer")
    assert code == 2 and "tokenizer '/nonexistent/tokenizer' not found" in err
    code, _, err = run_cli(capsys, "inspect", str(path), "--html", str(tmp_path / "no" / "t.html"))
    assert code == 2 and "cannot write" in err and len(err.splitlines()) == 1


class _Tokens(html.parser.HTMLParser):
    """Every token span of the page (class, data attributes, text), scripts and external references."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: list[dict] = []
        self.scripts = 0
        self.external: list[str] = []
        self._open: dict | None = None
        self._in_pre = False

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        for name in ("src", "href"):
            if attributes.get(name):
                self.external.append(attributes[name])
        if tag == "script":
            self.scripts += 1
        if tag == "pre":
            self._in_pre = True
        if tag == "span" and self._in_pre and "t" in (attributes.get("class") or "").split():
            self._open = {**attributes, "text": ""}

    def handle_endtag(self, tag):
        if tag == "span" and self._open is not None:
            self.tokens.append(self._open)
            self._open = None
        if tag == "pre":
            self._in_pre = False

    def handle_data(self, data):
        if self._open is not None:
            self._open["text"] += data


def _page_tokens(page: str) -> _Tokens:
    parser = _Tokens()
    parser.feed(page)
    return parser


def test_html_page_parses_back(trajectories, tokenizer, tmp_path, capsys):
    path, rows = trajectories
    row = rows["0:0"]
    page_path = tmp_path / "t.html"
    code, out, _ = run_cli(
        capsys, "inspect", str(path), "--index", _index(path, "0:0"), "--html", str(page_path)
    )
    assert code == 0 and out.startswith(f"wrote {page_path}")
    page = page_path.read_text()
    parsed = _page_tokens(page)
    (segment,) = row.segments
    assert len(parsed.tokens) == len(segment.token_ids)
    texts = token_texts(tokenizer, segment.token_ids)
    kinds = {i: span.kind[0] for span in segment.spans for i in range(span.start, span.end)}
    for i, token in enumerate(parsed.tokens):
        classes = token["class"].split()
        assert int(token["data-i"]) == i and int(token["data-id"]) == segment.token_ids[i]
        assert float(token["data-lp"]) == pytest.approx(segment.logprobs[i], rel=1e-5)
        assert ("m1" in classes) == bool(segment.loss_mask[i])
        assert {"p": "p", "g": "g", "o": "o"}[kinds[i]] in classes
        assert token["text"] == texts[i]
    assert parsed.scripts == 1 and parsed.external == [], "self-contained: one inline script, nothing fetched"
    assert "default-src 'none'" in page, "the page forbids network access"
    assert "<script>alert" not in page and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "<img src=x" not in page


def _chromium() -> str:
    found = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if found is None:
        pytest.skip("no chromium: apt-get install -y chromium (.ci/run installs it)")
    return found


def _rendered_dom(page: Path, fragment: str, tmp_path: Path) -> str:
    """The DOM after the page's script ran, from headless Chromium."""
    profile = tmp_path / "chromium-profile"
    result = subprocess.run(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--dump-dom",
            page.resolve().as_uri() + fragment,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.parametrize("threshold", [-2.3, -0.5])
def test_html_page_runs_in_headless_chromium(trajectories, tmp_path, capsys, threshold):
    path, rows = trajectories
    row = rows["0:0"]
    (segment,) = row.segments
    focus = segment.spans[1].start + 2  # a token of the first generated turn
    page = tmp_path / "t.html"
    code, _, _ = run_cli(
        capsys,
        "inspect",
        str(path),
        "--index",
        _index(path, "0:0"),
        "--html",
        str(page),
        "--low-logprob",
        str(threshold),
    )
    assert code == 0
    dom = _rendered_dom(page, f"#t-1-{focus}", tmp_path)
    assert 'data-ready="1"' in dom, "the page's script ran to the end"
    parsed = _page_tokens(dom)
    low = [int(t["data-i"]) for t in parsed.tokens if "low" in t["class"].split()]
    assert low == low_confidence(segment, threshold), "exactly the trained tokens below the threshold are red"
    count = re.search(r'id="low-count" data-count="(\d+)"', dom)
    assert count and int(count.group(1)) == len(low)
    focused = [int(t["data-i"]) for t in parsed.tokens if "focus" in t["class"].split()]
    assert focused == [focus]
    tip = re.search(r'<div id="tip"([^>]*)>(.*?)</div>', dom, re.S)
    assert tip and "hidden" not in tip.group(1) and f'data-token="{focus}"' in tip.group(1)
    assert f"token {focus} · id {segment.token_ids[focus]} · generated · loss mask 1" in tip.group(2)
    assert f"logprob {segment.logprobs[focus]:.4f}" in tip.group(2)


def test_multi_segment_row(trajectories, tokenizer, tmp_path, capsys):
    """A compacted episode's row holds several context windows: each is shown, bounded and numbered."""
    _, rows = trajectories
    first = dataclasses.replace(rows["0:1"].segments[0], info={"kind": "main", "closed_by": "compaction"})
    second = dataclasses.replace(rows["0:0"].segments[0], info={"kind": "main", "opened_by": "summarize"})
    combined = dataclasses.replace(rows["0:0"], key="0:9", segments=[first, second])
    out = tmp_path / "segments.jsonl"
    writer = TrajectoryWriter(out)
    writer.append(combined)
    writer.close()
    assert TrajectoryRow.from_json(json.loads(out.read_text())).segments == [first, second]
    code, text, _ = run_cli(capsys, "inspect", str(out), "--color", "never")
    assert code == 0
    text = text.replace("⟦", "").replace("⟧", "")
    assert "══ segment 1 of 2 · " in text and "trained · kind main · closed_by compaction ══" in text
    assert "══ segment 2 of 2 · " in text and "trained · kind main · opened_by summarize ══" in text
    assert text.index("segment 1 of 2") < text.index("Résumé") < text.index("segment 2 of 2")
    assert "↳ call echo" in text.split("segment 2 of 2")[1], "tool calls annotate the last segment"
    page = tmp_path / "segments.html"
    assert run_cli(capsys, "inspect", str(out), "--html", str(page))[0] == 0
    parsed = _page_tokens(page.read_text())
    assert len(parsed.tokens) == len(first) + len(second)
    assert "id='segment-1'" in page.read_text() and "id='segment-2'" in page.read_text()
    assert "trained · kind main · opened_by summarize</h2>" in page.read_text()


def test_index_names_the_row_key_not_the_completion_order(tokenizer, tmp_path, capsys):
    """Episode 0:0 finishes last, so its line is the file's last (the eval a real process, as a user runs it):
    --list shows key order and --index 0:0 (or 0) is that episode. inspect runs in this process: a process of its
    own per call would load the same tokenizer again each time, seconds of CPU apiece."""
    data = write_data(
        tmp_path / "data.jsonl", [{"prompt": "1 + 4?", "label": "5"}, {"prompt": "2 + 3?", "label": "5"}]
    )
    config = write_config(tmp_path / "plugin.yaml")
    out = tmp_path / "traj.jsonl"

    def respond(body, headers):
        if headers["x-smg-routing-key"] == "0:0":  # answered once the three others are written
            deadline = time.monotonic() + 60  # a safety net for a hung eval, not a speed requirement
            while (not out.exists() or out.read_text().count("\n") < 3) and time.monotonic() < deadline:
                time.sleep(0.05)
        return Turn(f"Answer: \\boxed{{{headers['x-smg-routing-key']}}}")

    with SGLangTestServer(tokenizer, context_length=8192) as server:
        server.responder = respond
        argv = eval_argv(server.base_url, data, "--n", "2", "--concurrency", "4", "--config", str(config))
        code, _, stderr = run_cli_process(*argv, "--out", str(out))
        assert code == 0, stderr
        rows = {row.key: row for row in read_rows(out)}
        for row in rows.values():
            check_row(row, server)
    assert [row.key for row in read_rows(out)][-1] == "0:0", "completion order"
    code, listed, _ = run_cli(capsys, "inspect", str(out), "--list")
    assert code == 0 and [line.split()[0] for line in listed.splitlines()] == [
        "key",
        "0:0",
        "0:1",
        "1:0",
        "1:1",
    ]
    for selector, key in (("0:0", "0:0"), ("0", "0:0"), ("1:1", "1:1"), ("-1", "1:1")):
        code, table, stderr = run_cli(capsys, "inspect", str(out), "--index", selector, "--tokens")
        assert code == 0, stderr
        ids = [int(line.split("\t")[5]) for line in table.splitlines()[1:]]
        assert ids == rows[key].segments[0].token_ids, selector


def test_each_turn_shows_its_weight_version(tokenizer, tmp_path, capsys):
    """A turn's version is the server's ``weight_version`` of its answer: kept in the row, shown per turn in the
    terminal and on the page (an episode continued across a weight update has turns of several versions)."""
    data = write_data(tmp_path / "data.jsonl", [{"prompt": "Echo, then answer 5.", "label": "5"}])
    config = write_config(tmp_path / "plugin.yaml")
    out = tmp_path / "traj.jsonl"
    with SGLangTestServer(tokenizer, context_length=8192) as server:
        server.script(
            Turn(call("echo", text="hi"), weight_version="7"),
            Turn("The answer is 5.\nAnswer: \\boxed{5}", weight_version="8"),
            key="0:0",
        )
        assert main_ok(
            eval_argv(server.base_url, data, "--n", "1", "--config", str(config), "--out", str(out))
        )
        served = [server.meta_infos[r.body["rid"]]["weight_version"] for r in server.generate_requests]
    (row,) = read_rows(out)
    (segment,) = row.segments
    generated = [s for s in segment.spans if s.kind == "generated"]
    assert [s.weight_version for s in generated] == served == ["7", "8"]
    assert {s.weight_version for s in segment.spans if s.kind != "generated"} == {None}
    code, text, _ = run_cli(capsys, "inspect", str(out), "--color", "never")
    assert code == 0
    turns = [line for line in text.splitlines() if line.startswith("── turn ")]
    assert len(turns) == 2
    assert "· version 7 ·" in turns[0] and "· version 8 ·" in turns[1]
    page = tmp_path / "traj.html"
    assert run_cli(capsys, "inspect", str(out), "--html", str(page))[0] == 0
    heads = re.findall(r"<div class='head'>(turn \d[^<]*)</div>", page.read_text())
    assert ["version 7" in h for h in heads] == [True, False] and "version 8" in heads[1]
