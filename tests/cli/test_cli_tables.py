"""Every table stays readable at 80 and 120 columns: nothing past the edge or cut at it, no word or
number split across lines, and a benchmark of nine configurations stays a table; ``--help`` shows
what each option takes."""

from __future__ import annotations

import io
import re

import pytest
import typer
from rich.cells import cell_len
from rich.console import Console
from typer.testing import CliRunner

from stored_runs import store_run

from mixprec.bench.runstate import with_states
from mixprec.bench.store import Store
from mixprec.bench.table import COLUMNS, render_table_rows
from mixprec.cli import _common, app
from mixprec.cli._app import METAVARS
from mixprec.cli._module_tables import PROFILE_COLUMNS, PROFILE_DROP, profile_rows
from mixprec.cli._text import LONG_WORD
from mixprec.diagnose.profile_result import ModuleStats

runner = CliRunner()
WIDTHS = (80, 120)
NINE = ["fp32", "matmul-high", "autocast-fp16", "naive-fp16", "naive-bf16", "quality", "balanced", "fast", "memory"]


def _metrics(i: int) -> dict:
    return {"snr_db": 28.5 + i, "sqnr_db": 30.0 + i, "lsd_db": 0.5, "peak_mem_bytes": 812e6 + i * 1e6,
            "weight_bytes": 563e6 / (1 + i % 2), "fallbacks": i % 2, "nonfinite": 0, "rtf": 0.31,
            "throughput_items_per_s": 3.2 + i, "token_agreement": 0.98}


def _samples(i: int) -> list[float]:
    if i == 3:
        return [0.0823]  # one sample: no interval
    spread = 0.3 if i % 3 == 0 else 0.02
    return [1.0 / (1 + 0.2 * i) * (1 + spread * (j % 2)) for j in range(6)]


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """Run 1: nine configurations; run 2: three, one failed with a long error; run 3: run 1 again, 5% slower."""
    path = tmp_path_factory.mktemp("tables") / "b.sqlite"
    with Store(path) as store:
        nine = [(n, _samples(i), _metrics(i)) for i, n in enumerate(NINE)]
        store_run(store, nine)
        run = store.start_run(pipeline="tts", size="test", machine={"name": "test cpu"}, fingerprint="f", versions={}, notes=[])
        for position, (name, samples, metrics) in enumerate(nine[:2]):
            cid = store.add_config(run, position=position, name=name, batch=1)
            for index, seconds in enumerate(samples):
                store.add_sample(cid, index, seconds)
            store.finish_config(cid, status="ok", metrics=metrics)
        cid = store.add_config(run, position=2, name="fp16+keep-fp32-attention-and-norms", batch=1)
        store.finish_config(cid, status="failed", metrics={}, error=(
            "RuntimeError: expected scalar type BFloat16 but found Float in /home/someone/projects/models/t3/modules/"
            "attention_processor.py line 412 (LlamaForCausalLM.forward)"))
        store.finish_run(run, status="complete")
        store_run(store, [(n, [s * 1.05 for s in samples], m) for n, samples, m in nine])
    return path


def _cli(monkeypatch, width: int, args: list[str]) -> str:
    monkeypatch.setenv("COLUMNS", str(width))  # the width a user gives a command
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result.output


def _render(renderable, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(renderable)
    return out.getvalue()


def _headers(text: str) -> list[str]:
    """The header cells of the first table in ``text``, each joined over its lines."""
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    end = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    columns: list[list[str]] = []
    for line in lines[top + 1:end]:
        for index, part in enumerate(line.strip("┃").split("┃")):
            if index == len(columns):
                columns.append([])
            columns[index].append(part.strip())
    return [" ".join(p for p in parts if p) for parts in columns]


def _left_out(text: str) -> str:
    flat = " ".join(text.split())
    match = re.search(r"left out at \d+ columns: (.*?) \(a wider terminal shows them\)", flat)
    return match.group(1) if match else ""


def _assert_readable(text: str, width: int, columns: list[str], rows: list[list[str]]) -> None:
    lines = text.splitlines()
    assert max(cell_len(line) for line in lines) <= width, text
    for line in lines:
        if line.startswith("│"):  # nothing cut at the edge: every row has its closing border
            assert line.rstrip().endswith("│"), text
    shown, left_out = _headers(text), _left_out(text)
    assert shown and shown[0] == columns[0], text
    for header in columns:
        assert header in shown or header in left_out.split(", "), (header, shown, left_out)
    for header in shown:
        index = columns.index(header)
        for row in rows:
            cell = str(row[index]) if row[index] is not None else "-"
            pieces = [cell] if len(cell) <= LONG_WORD else [w for w in cell.split() if len(w) <= LONG_WORD]
            for piece in pieces:  # a short cell whole on one line; a long one's every word whole
                assert any(piece in line for line in lines), (header, piece, text)


class TestTablesAt80And120Columns:
    @pytest.mark.parametrize("width", WIDTHS)
    @pytest.mark.parametrize("run_id", [1, 2])
    def test_bench(self, db, monkeypatch, width, run_id):
        from mixprec.cli.bench import _TERMINAL_COLUMNS

        path = db
        text = _cli(monkeypatch, width, ["runs", "show", str(run_id), "--db", str(path)])
        with Store(path) as store:
            rendered = render_table_rows(store.load_run(run_id))
        keys = [k for k in _TERMINAL_COLUMNS if k in rendered[0] and not (k == "sqnr" and "snr" in rendered[0])]
        keys = [k for k in keys if k != "error" or any(r["error"] for r in rendered)]
        labels = dict(COLUMNS)
        rows = [[r[k].replace(" (min–max)", "*") for k in keys] for r in rendered]
        _assert_readable(text, width, [labels[k] for k in keys], rows)
        assert text.count("┏") == 1  # one table, not a list of cards
        for key in ("config", "speedup", "latency"):  # the headline columns are never the ones left out
            assert labels[key] in _headers(text)
        if run_id == 1:
            assert "undecided (n=1)" in text

    @pytest.mark.parametrize("width", WIDTHS)
    def test_compare(self, db, monkeypatch, width):
        from mixprec.bench.gate import compare
        from mixprec.cli._verdicts import _COLUMNS, _beyond, _change, _quality, _seconds, _speedup

        path = db
        text = _cli(monkeypatch, width, ["compare", "1", "3", "--db", str(path)])
        with Store(path) as store:
            rows = compare(store.load_run(1), store.load_run(3))
        cells = [[r["config"], r["batch"], _seconds(r.get("latency_a")), _seconds(r.get("latency_b")), _change(r),
                  r.get("latency_verdict"), _speedup(r.get("speedup_a")), _speedup(r.get("speedup_b")), _beyond(r),
                  _quality(r.get("quality_a")), _quality(r.get("quality_b"))] for r in rows]
        _assert_readable(text, width, _COLUMNS, cells)

    @pytest.mark.parametrize("width", WIDTHS)
    def test_runs_list(self, db, monkeypatch, width):
        path = db
        text = _cli(monkeypatch, width, ["runs", "list", "--db", str(path)])
        with Store(path) as store:
            runs = with_states(store.runs(), store.load_run)
        columns = ["id", "started", "finished", "status", "state", "pipeline", "size", "device", "configs"]
        _assert_readable(text, width, columns, [[r[c] for c in columns] for r in runs])

    @pytest.mark.parametrize("width", WIDTHS)
    def test_diagnose(self, width):
        stats = [ModuleStats("t3", "LlamaForCausalLM", "bf16", "bf16", 24, 0.299, 0.646, 0.0, 0.0, 45.1, 40.2),
                 ModuleStats("t3.model.layers.0.self_attn", "LlamaAttention", "bf16", "bf16", 12, 3.29, 0.0722, 0.004, 0.0,
                             47.6, 44.0),
                 ModuleStats("vocoder.resblocks.2.1.convs2.0", "Conv1d", "bf16", "bf16", 1, 4.52, 0.999, 0.012, 0.0, 41.7,
                             38.9, owns_weights=True),
                 ModuleStats("s3gen.estimator", "_Estimator", "fp16", "fp16", 10, 70000.0, 80000.0, 0.2, 0.0, 12.5, None)]
        rows = profile_rows(stats)
        text = _render(_common.table("tts under memory on cpu: most at risk first", PROFILE_COLUMNS, rows,
                                     drop=PROFILE_DROP), width)
        plain = [[c.plain if hasattr(c, "plain") else c for c in row] for row in rows]
        _assert_readable(text, width, PROFILE_COLUMNS, plain)
        assert "0.299/0.646" in text and ("LlamaForCausalLM (block)" in text or width < 120)

    @pytest.mark.parametrize("width", WIDTHS)
    def test_explain(self, tmp_path, monkeypatch, width):
        policy = tmp_path / "p.toml"
        policy.write_text('[[rules]]\nmatch = "*"\nstorage = "bf16"\nreason = "weights in bf16"\n\n'
                          '[[rules]]\nmatch = "t3.model.layers.*.input_layernorm"\nkeep_fp32 = true\n'
                          'reason = "pre-attention norms in fp32"\n')
        text = _cli(monkeypatch, width, ["explain", "--pipeline", "tts", "--size", "test", "--policy", str(policy)])
        table_text = text[text.index("┏"):]
        body = [line for line in table_text.splitlines() if line.startswith("│")]
        assert max(cell_len(line) for line in text.splitlines()) <= width
        assert all(line.rstrip().endswith("│") for line in body)
        assert any("t3.model.layers.*.input_layernorm ×2" in line for line in body)
        for header in _headers(table_text):
            assert header in ("module", "type", "storage", "compute", "attention", "rule")


class TestExplainSummary:
    def test_a_summary_comes_before_the_table_and_expand_lists_every_module(self, tmp_path, monkeypatch):
        policy = tmp_path / "p.toml"
        policy.write_text('[[rules]]\nmatch = "*"\nstorage = "bf16"\n\n[[rules]]\nmatch = "type:LayerNorm"\nkeep_fp32 = true\n')
        args = ["explain", "--pipeline", "tts", "--size", "test", "--policy", str(policy)]
        text = _cli(monkeypatch, 160, args)
        head = text[:text.index("┏")]
        assert re.search(r"tts under custom on cpu: (\d+) modules in 5 components \(ve \d+, t3_cond \d+, t3 \d+", head)
        assert re.search(r"storage: bf16 \d+, fp32 \d+; compute: bf16 \d+, fp32 \d+", head)
        assert "fp32 islands: " in head and "#1 type:LayerNorm" in head
        assert re.search(r"\d+ warnings and 1 advice after the table", head)  # the advice: t3 would decode on a static cache compiled
        modules = int(re.search(r": (\d+) modules", head).group(1))
        collapsed = int(re.search(r"\((\d+) rows for", head).group(1))
        rows = [line for line in text.splitlines() if line.startswith("│")]
        assert len(rows) == collapsed < modules
        full = _cli(monkeypatch, 160, [*args, "--expand"])
        assert len([line for line in full.splitlines() if line.startswith("│")]) == modules
        assert "×" not in full and "repeated blocks" not in full


def _commands(command, path=()):
    yield path, command
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from _commands(sub, (*path, name))


class TestHelpShowsWhatOptionsTake:
    @pytest.mark.parametrize("path", [p for p, _ in _commands(typer.main.get_command(app))], ids=" ".join)
    def test_every_command(self, path):
        result = runner.invoke(app, [*path, "--help"], terminal_width=200)
        assert result.exit_code == 0, result.output
        assert "<bool>" not in result.output  # a flag takes no value
        command = dict(_commands(typer.main.get_command(app)))[path]
        for param in command.params:
            long = next((o for o in param.opts if o.startswith("--")), None)
            shown = METAVARS.get((path[-1] if path else "", long), METAVARS.get(long))
            if shown and not param.is_flag:
                assert re.search(rf"{re.escape(long)}\s+{re.escape(shown)}", result.output), (long, shown)


class TestOneSpeedupRenderingEverywhere:
    def test_terminal_html_and_ui_show_the_same_cells(self, db, monkeypatch):
        import html

        from mixprec.bench.report import render_html
        from mixprec.ui.bench_tab import results_table

        with Store(db) as store:
            run = store.load_run(1)
        cells = [r["speedup"] for r in render_table_rows(run)]
        assert cells[0] == "reference" and cells[3] == "undecided (n=1)"
        assert all(c == "reference" or c.startswith(("undecided", "unstable")) or re.fullmatch(r"\d+\.\d+x \(.*\)", c)
                   for c in cells), cells
        terminal = _cli(monkeypatch, 200, ["runs", "show", "1", "--db", str(db)])
        page, ui = render_html([run]), results_table(run, "en")
        for cell in cells:
            assert cell in terminal and html.escape(cell) in page and cell in ui, cell
