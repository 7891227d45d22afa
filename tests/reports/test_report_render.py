"""Rendering: the recorded result to Markdown and HTML (`python -m reports render`), what a timeline shows of a
hand-written history, what a witness names, and tolerance of histories from other suite versions."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import RECORDED, run_python

from reports.html import render_html
from reports.markdown import render_markdown
from reports.result import histories_dir
from reports.timeline import build_timeline, named_in

pytestmark = pytest.mark.cpu


class _Page(HTMLParser):
    """Ids, in-page links, and anything a page could fetch."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.fetches: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and (a.get("href") or "").startswith("#"):
            self.links.append(a["href"][1:])
        for name in ("src", "srcset", "data", "poster"):
            if a.get(name):
                self.fetches.append(f"{tag} {name}={a[name]}")
        if tag == "link" or (tag in ("script", "img", "iframe") and a.get("src")):
            self.fetches.append(tag)


def parse(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    return page


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``python -m reports render`` of the recorded result into another folder."""
    out = tmp_path_factory.mktemp("rendered")
    done = run_python("-m", "reports", "render", str(RECORDED), "--out", str(out), cwd=out)
    assert done.returncode == 0, done.stderr
    html = out / "conformance-result.html"
    assert str(html) in done.stdout
    return out, html.read_text()


@pytest.mark.slow  # a second Python process
def test_markdown_summary_has_the_matrix_the_metrics_and_the_witness(rendered: tuple[Path, str]) -> None:
    md = (rendered[0] / "conformance-result.md").read_text()
    assert md.startswith("# Conformance: version_bump_aborts on fake (SGLang 0.5.23, seed 0, 1 node(s))")
    assert "✅ pass 18 · ❌ fail 1" in md
    assert re.search(r"^\| I1-I2 \| +\| ❌ \|$", md, re.M), md
    assert "| I1-I2-steady-tensor-in_place | requests=" in md
    assert re.search(r"^- \*\*I1-I2-steady-tensor-in_place\*\* \(fail\): \d+ of \d+ requests", md, re.M)


@pytest.mark.slow  # a second Python process
def test_html_matrix_links_every_case_and_is_self_contained(rendered: tuple[Path, str], recorded: dict) -> None:
    html = rendered[1]
    page = parse(html)
    cases = {f"case-{c['backend']}-{c['case']}" for c in recorded["cases"]}
    matrix = html[html.index('id="matrix"'):html.index('id="failures"')]
    assert {m for m in re.findall(r'href="#([^"]+)"', matrix)} == cases
    assert cases <= page.ids
    assert set(page.links) <= page.ids, set(page.links) - page.ids
    assert not page.fetches
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", html), "a URL other than the SVG namespace"


@pytest.mark.slow  # a second Python process
def test_html_highlights_what_the_witness_names_in_the_scenario_timeline(rendered: tuple[Path, str],
                                                                        recorded: dict) -> None:
    html = rendered[1]
    failing = next(c for c in recorded["cases"] if c["status"] == "fail")
    named_rids = {m for line in failing["witness"] for m in re.findall(r"request (\S+) \(engine", line)}
    assert named_rids
    section = html[html.index(f"<h2>{failing['scenario']}"):]
    section = section[:section.index("</section>")]
    highlighted = {rid for cls, rids in re.findall(r'<rect class="rq ([^"]*)" data-rid="([^"]*)"', section)
                   if " hl" in f" {cls}" for rid in rids.split()}
    assert named_rids <= highlighted
    assert re.search(r'<rect class="cy hl" data-c="0"', section), "the cycle the witness names"
    assert section.count('class="lane hl"') == 2, "both engines are named"
    show = re.search(r'<a class="show" href="#(tl\d+)" data-hl="([^"]+)"', html)
    assert show and f'id="{show.group(1)}"' in section
    assert named_rids <= set(json.loads(show.group(2).replace("&quot;", '"'))["r"])
    other = html[html.index("<h2>answers-while-paused"):]
    other = other[other.index("<svg"):other.index("</svg>")]
    assert not re.search(r'class="[^"]*\bhl\b', other), "nothing is named in a scenario whose cases passed"


def test_html_shows_the_costs_the_seed_incident_needed(rendered: tuple[Path, str]) -> None:
    html = rendered[1]
    for title in ("Requests decoding at each pause", "Aborted requests per update (rate)",
                  "Staleness of consumed groups", "Cost per scenario run"):
        assert title in html
    row = re.search(r'<td><a href="#tl\d+">steady-tensor-in_place</a></td><td>(\d+)</td><td class="bad">(\d+)/\1',
                    html)
    assert row and int(row.group(2)) > 0, "the aborted requests of the failing run are counted"


@pytest.mark.slow  # a second Python process
def test_bad_input_is_a_one_line_error_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "not-a-result.json").write_text('{"hello": 1}')
    (tmp_path / "broken.json").write_text("{")
    for name, message in (("missing.json", "no such file"), ("not-a-result.json", "not a conformance result"),
                          ("broken.json", "not a readable JSON file")):
        done = run_python("-m", "reports", "render", str(tmp_path / name), cwd=tmp_path)
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.json", "not-a-result.json"]


# -- a hand-written history ---------------------------------------------------------------------------------------

def _generate(seq: int, engine: int, t0: float, t1: float | None, rid: str, finish: str = "length",
              versions: tuple[str, ...] = ("1",), status: int | None = 200, origin: str = "integration") -> dict:
    out = {"meta_info": {"id": rid, "finish_reason": {"type": finish}, "completion_tokens": 8,
                         "weight_version": versions[-1],
                         "weight_versions": [{"version": v, "start": 0, "end": 8} for v in versions]}}
    return {"seq": seq, "engine": engine, "method": "POST", "path": "/generate", "payload": {"rid": rid},
            "t_start": t0, "t_end": t1, "status": status if t1 is not None else None,
            "response": out if status == 200 and t1 is not None else None, "origin": origin}


def _control(seq: int, engine: int, t: float, path: str, payload: dict | None = None) -> dict:
    return {"seq": seq, "engine": engine, "method": "POST", "path": path, "payload": payload or {}, "t_start": t,
            "t_end": t + 0.01, "status": 200, "response": {"success": True}, "origin": "integration"}


def hand_written_history(**extra: object) -> dict:
    """Two engines on two nodes; one update cycle (1.0–2.0 s) paused in place on engine 0 (mode sent) and with no
    mode on engine 1 (SGLang's default, abort); requests of every outcome; two consumed groups."""
    wire = [
        _generate(0, 0, 0.1, 0.5, "r-done", versions=("default",)),
        _generate(1, 0, 0.8, 2.5, "r-span", versions=("default", "1")),
        _generate(2, 1, 0.9, 1.3, "r-aborted", finish="abort", versions=("default",)),
        _generate(3, 1, 2.6, 2.9, "r-injected", finish="abort"),
        _generate(4, 1, 2.6, 2.7, "r-error", status=500),
        _generate(5, 0, 2.7, 2.8, "r-dropped", status=None),
        _generate(6, 0, 2.9, None, "r-open"),
        _generate(7, 0, 0.95, 1.9, "sentinel-0", origin="sentinel", finish="abort", versions=("default",)),
        _control(8, 0, 1.1, "/pause_generation", {"mode": "in_place"}),
        _control(9, 1, 1.1, "/pause_generation"),
        _control(10, 0, 1.5, "/update_weights_from_tensor", {"flush_cache": False}),
        _control(11, 0, 1.7, "/update_weight_version", {"new_version": "1", "abort_all_requests": False}),
        _control(12, 0, 1.8, "/continue_generation"),
        _control(13, 1, 1.8, "/continue_generation"),
    ]
    batch = {"groups": [
        {"prompt_index": 4, "samples": [{"index": 0, "turns": [{"rid": "r-span"}, {"rid": "r-done"}]}]},
        {"prompt_index": 5, "samples": [{"index": 1, "turns": [{"rid": "r-injected", "continues": ["r-aborted"]}]}]}],
        "weight_version": 1}
    return {"scenario": "hand", "integration": "x", "backend": "fake", "profile": "0.5.23", "seed": 0,
            "max_staleness": 1, "wire": wire,
            "cycles": [{"index": 0, "t_start": 1.0, "t_end": 2.0, "ok": True, "transport": "tensor",
                        "pause_mode": "in_place", "returned": 1}],
            "batches": [{"index": 0, "t": 2.95, "batch": batch, "published_truth": 2}],
            "injected": [{"t": 2.65, "kind": "abort", "engine": 1, "detail": "abort_all"}],
            "final_labels": ["1", "1"], "nodes": ["node-a", "node-b"], **extra}


def test_timeline_outcomes_pauses_versions_costs_and_staleness() -> None:
    t = build_timeline(hand_written_history())
    outcome = {r.rids[0] if r.rids else r.seq: r.outcome for r in t.requests}
    assert outcome == {"r-done": "finished", "r-span": "spanning", "r-aborted": "aborted", "r-injected": "injected",
                       4: "failed", 5: "dropped", 6: "open", "sentinel-0": "aborted"}
    assert [(r.rids, r.continued_by) for r in t.requests if r.continued_by] == [(["r-aborted"], "r-injected")]
    late = hand_written_history()  # the fault's t is taken before it is sent; it lands at r-injected's answer
    late["wire"] += [_generate(14, 1, 2.66, 2.9, "r-late", finish="abort"),  # open when it landed (2.9)
                     _generate(15, 1, 2.95, 2.99, "r-after", finish="abort")]  # sent after it landed
    outcome = {r.rids[0]: r.outcome for r in build_timeline(late).requests if r.rids}
    assert (outcome["r-late"], outcome["r-after"]) == ("injected", "aborted")
    late["injected"][0]["t_end"] = 2.97  # when the history records the injection's answer, that is the window
    outcome = {r.rids[0]: r.outcome for r in build_timeline(late).requests if r.rids}
    assert (outcome["r-after"], outcome["r-aborted"]) == ("injected", "aborted")
    span = next(r for r in t.requests if r.rids == ["r-span"])
    assert (span.versions, span.cycles) == (["default", "1"], [0])
    assert [(p.engine, p.mode, p.how, p.t1, p.resident) for p in t.pauses] == [
        (0, "in_place", "mode: 'in_place' sent", 1.81, {"integration": 1, "sentinel": 1}),
        (1, "abort", "no 'mode' sent: SGLang's default", 1.81, {"integration": 1})]
    old = build_timeline(hand_written_history(profile="0.5.4"))
    assert [(p.mode, p.how) for p in old.pauses] == [("abort", "SGLang 0.5.4's handler takes no 'mode'")] * 2
    newer = build_timeline(hand_written_history(profile="0.5.99rc1"))  # read by the newest snapshot not newer
    assert [(p.mode, p.how) for p in newer.pauses] == [(p.mode, p.how) for p in t.pauses]
    real = build_timeline(hand_written_history(profile="0.4.9"))  # older than every snapshot: the mode as sent
    assert [(p.mode, p.how) for p in real.pauses] == [("in_place", "sent"), ("abort", "no 'mode' sent")]
    assert [(m.kind, m.label) for m in t.marks] == [("transfer", ""), ("version", "v1")]
    assert t.groups == ["node node-a", "node node-b"]
    ray = build_timeline(hand_written_history(nodes=["a1" * 28, "b2" * 28]))
    assert ray.groups == ["node a1a1a1a1a1…", "node b2b2b2b2b2…"], "Ray's 56-digit node ids, shortened"
    (cost,) = t.costs
    assert cost.in_flight == {"node node-a": 1, "node node-b": 1}
    assert cost.aborted == {"node node-a": 0, "node node-b": 1}
    assert cost.resident == {"node node-a": {"integration": 1, "sentinel": 1}, "node node-b": {"integration": 1}}
    assert t.staleness == [1, 1], "consumed at 2; the oldest numeric version of both groups is 1 ('default' is none)"
    assert t.group_rids[(0, 4)] == ["r-span", "r-done"]


def test_a_schema_1_result_names_what_its_details_say_and_never_parses_its_witness() -> None:
    """Results written before anomalies existed: their details' fields are data, their sentences are not read."""
    t = build_timeline(hand_written_history())
    named = named_in({"witness": ["request r-aborted (engine 1) was in flight during update cycle 0 at t=1.250s"],
                      "details": {"engine": [0], "rid": "r-z", "cycle": 2}}, t)
    assert named.engines == {0} and named.rids == {"r-z"} and named.cycles == {2} and not named.times
    assert not named_in({"witness": ["engine 1 no update cycle ran"]}, t)


def test_anomalies_name_engines_requests_cycles_groups_and_times_by_their_fields() -> None:
    t = build_timeline(hand_written_history())
    named = named_in({"witness": ["engine 7 cycle 9 request r-prose t=9.000s"],  # prose is not read
                      "anomalies": [{"kind": "aborted-request", "text": "lost: a request", "engine": 1,
                                     "rids": ["r-aborted"], "cycle": 0, "times": [1.25]},
                                    {"kind": "oldest-version", "text": "a group", "batch": 0, "prompt": 4},
                                    {"kind": "note", "text": "engine 3 request r-q"}]}, t)
    assert named.engines == {1} and named.cycles == {0} and named.times == {1.25}
    assert named.rids == {"r-aborted", "r-span", "r-done"}


def test_html_highlights_from_the_fields_when_the_sentence_is_reworded(tmp_path: Path) -> None:
    """A checker that rewords its sentence keeps its highlighting: the report reads the anomaly's fields."""
    path = _result_with(hand_written_history(), tmp_path)
    result = json.loads(path.read_text())
    result["schema_version"] = 2
    result["cases"][0].update(witness=["Something else entirely."], anomalies=[
        {"kind": "aborted-request", "text": "Something else entirely.", "engine": 1, "rids": ["r-aborted"],
         "cycle": 0}])
    path.write_text(json.dumps(result))
    html = render_html(json.loads(path.read_text()), path)
    assert re.search(r'class="rq o-aborted continued hl" data-rid="r-aborted"', html), "the request it names"
    assert re.search(r'<rect class="cy hl" data-c="0"', html), "the cycle it names"
    assert html.count('class="lane hl"') == 1, "the one engine it names"
    assert "Something else entirely." in html
    assert "- **I1-I2-hand** (fail): Something else entirely." in render_markdown(result)


def _result_with(history: dict, tmp_path: Path, status: str = "fail") -> Path:
    result = json.loads(RECORDED.read_text())
    witness = "request r-aborted (engine 1) was aborted in update cycle 0"
    result["schema_version"] = 2
    result["cases"] = [{**result["cases"][0], "scenario": "hand", "case": "I1-I2-hand", "invariant": "I1-I2",
                        "status": status, "witness": [witness],
                        "anomalies": [{"kind": "aborted-request", "text": witness, "engine": 1,
                                       "rids": ["r-aborted"], "cycle": 0}],
                        "history": f"{histories_dir(tmp_path / 'r.json').name}/hand.fake.json.gz"}]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    folder = histories_dir(path)
    folder.mkdir(exist_ok=True)
    (folder / "hand.fake.json.gz").write_bytes(gzip.compress(json.dumps(history).encode()))
    return path


def test_histories_with_unknown_fields_and_older_shapes_render(tmp_path: Path) -> None:
    history = hand_written_history(errors=["RuntimeError: the manager died"], something_new={"a": [1]})
    history.pop("nodes")
    for call in history["wire"]:
        call.pop("origin")  # before the suite told sentinels apart
        call["priority"] = 3
    history["cycles"][0]["resident_at_pause"] = [[1], [1]]
    path = _result_with(history, tmp_path)
    html = render_html(json.loads(path.read_text()), path)
    assert "RuntimeError: the manager died" in html and ">engine 1</text>" in html
    assert re.search(r'class="rq o-aborted continued hl" data-rid="r-aborted"', html)
    assert "- **I1-I2-hand** (fail): request r-aborted (engine 1)" in render_markdown(json.loads(path.read_text()))


def test_a_missing_history_is_said_not_fatal(tmp_path: Path) -> None:
    path = _result_with(hand_written_history(), tmp_path)
    shutil.rmtree(histories_dir(path))
    html = render_html(json.loads(path.read_text()), path)
    assert "hand.fake.json.gz: not available" in html and 'id="case-fake-I1-I2-hand"' in html


def test_a_history_that_cannot_be_drawn_costs_only_its_timeline(tmp_path: Path) -> None:
    history = hand_written_history()
    history["cycles"][0].pop("t_start")
    path = _result_with(history, tmp_path)
    html = render_html(json.loads(path.read_text()), path)
    assert "hand.fake.json.gz: KeyError: &#x27;t_start&#x27;" in html and 'id="case-fake-I1-I2-hand"' in html


def test_a_broken_run_shows_what_it_was_stuck_on(tmp_path: Path) -> None:
    hang = {"kind": "hang", "message": "Updater.update did not return within 20s", "t": 2.5,
            "open_calls": [{"engine": 0, "method": "POST", "path": "/unload_lora_adapter", "since": 1.5,
                            "origin": "integration"}]}
    path = _result_with(hand_written_history(breaks=[hang]), tmp_path)
    html = render_html(json.loads(path.read_text()), path)
    assert "<b>hang</b>: Updater.update did not return within 20s<br>open call: engine 0 POST /unload_lora_adapter " \
           "since t=1.500s (integration)" in html
    assert re.search(r'<g class="break"><line x1="[\d.]+"[^>]*/><text[^>]*>hang</text>', html)


def test_lanes_and_charts_per_node_when_the_backend_reports_nodes(tmp_path: Path) -> None:
    path = _result_with(hand_written_history(), tmp_path)
    html = render_html(json.loads(path.read_text()), path)
    assert '>engine 1</text><text class="node-label" x="4" y=' in html and ">node node-b<title>" in html
    assert "node node-a (integration)" in html and "node node-b (integration)" in html  # resident at the pause
    assert "node node-b · c0: 1/1" in html  # aborted requests per update, per node


def test_the_timeline_marks_where_an_engine_held_unpublished_weights_and_what_it_served() -> None:
    """P8's reading, drawn: engine 0 continued on half-loaded weights after failed cycle 0 serves r1; the span ends
    at the next load into it."""
    from conformance.history import History, UpdateCycle, WireCall
    from reports.svg import timeline_svg
    from reports.timeline import Named

    def call(seq: int, path: str, t0: float, t1: float, status: int = 200, response=None) -> WireCall:
        return WireCall(seq, 0, "POST", path, {}, t0, t1, status, response or {})

    answer = {"text": "", "meta_info": {"id": "r1", "finish_reason": {"type": "length"}, "completion_tokens": 4}}
    h = History("hand-written", "test", "fake", "0.5.23", 0, initial_digest={"a": "a0", "b": "b0"}, wire=[
        call(0, "/pause_generation", 1.1, 1.2), call(1, "/update_weights_from_disk", 1.3, 1.4, 400),
        call(2, "/continue_generation", 1.5, 1.6), call(3, "/generate", 2.5, 3.5, response=answer),
        call(4, "/pause_generation", 4.1, 4.2), call(5, "/update_weights_from_disk", 4.3, 4.4),
        call(6, "/continue_generation", 4.5, 4.6)], cycles=[
        UpdateCycle(0, 0, "disk", False, "retract", 1.0, 2.0, False, "EngineError", 0, 0, None, None, None,
                    ["default"], ["default"], trainer_digest={"a": "a1", "b": "b1"},
                    digests_after=[{"a": "a1", "b": "b0"}]),
        UpdateCycle(1, 0, "disk", False, "retract", 4.0, 5.0, True, None, 0, 1, 1, None, 1, ["default"], ["1"],
                    trainer_digest={"a": "a1", "b": "b1"}, digests_after=[{"a": "a1", "b": "b1"}])])
    t = build_timeline(json.loads(h.to_json()))
    assert [(u.engine, u.t0, u.t1, u.cycle, u.served) for u in t.unpublished] == [(0, 1.3, 4.3, 0, ["r1"])]
    svg = timeline_svg(t, Named(), "t0")
    assert re.search(r'<rect class="unpub served"[^>]*><title>engine 0 held weights of no published version after '
                     r'failed cycle 0, from t=1\.3\d* s until the load at t=4\.3\d* s; served 1 of the integration\'s '
                     r'requests on them \(r1\)</title>', svg), svg
