"""Property-based fuzzing of every ``mixprec`` command, in process (Typer's test runner).

Hypothesis draws argv, environment variables and file contents (configs, .env files,
policies, a fallback store, a benchmark store's contents). Whatever it draws, a command
ends with exit status 0, 1 or 2, prints no traceback and writes no raw control character.
The draws stay on cheap paths: invalid flags and files, a tiny factory for the commands
that run a model, pipelines that do not exist for ``bench`` and ``tune``, and ports or
languages that keep ``ui`` from serving.
"""

from __future__ import annotations

import json
import re
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mixprec.bench.store import Store
from mixprec.cli import app
from tiny_factory import tiny_factory_source

runner = CliRunner()
FUZZ = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# What a terminal would act on: C0 (but newline and tab), DEL, C1, bidirectional controls, lone surrogates.
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")

_TINY = tiny_factory_source('nn.LayerNorm(8)')

# Text that is hard on a CLI: markup, control characters, bidi overrides, lone surrogates, long runs.
_HOSTILE = ["[/", "[link=https://e]x[/link]", "[bold]", "\x1b[31m", "\x1b]8;;u\x07", "\x9b", "\u202e", "\udcff", "\r",
            "\n", "\t", "=1+2", "-", "--", "../", "/dev/zero", "%s", "{x}", "\\", "'", '"', "漢字", "עברית", " "]
hostile = st.one_of(
    st.text(max_size=40),
    st.lists(st.sampled_from(_HOSTILE) | st.text(string.ascii_letters + string.digits + "._-/:", max_size=8),
             max_size=6).map("".join),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["", "0", "-1", "1e400", "nan", "inf", "99999999999999999999", "1,2,,3", "x" * 5000]),
)
toml_like = st.one_of(
    hostile,
    st.sampled_from(['float32_matmul_precision = "high"\n', "tool = 'x'\n", "[tool]\nmixprec = 3\n", "a = [[[[\n",
                     "conv_tf32 = 7\n", "\ufefffloat32_matmul_precision = 'medium'\n", '[[rules]]\nmatch = "*"\n',
                     '[[rules]]\nmatch = "*"\nstorage = "bf16"\n', 'name = "x"\nrules = 3\n',
                     "x = " + "[" * 3000 + "]" * 3000 + "\n", '{"rules": [{"match": "*", "storage": "fp16"}]}']),
)
env_names = st.one_of(st.sampled_from(["MIXPREC_PRESET", "MIXPREC_POLICY", "MIXPREC_FLOAT32_MATMUL_PRECISION",
                                       "MIXPREC_CONV_TF32", "MYAPP_FLOAT32_MATMUL_PRECISION"]),
                      st.text(string.ascii_uppercase + "_[]/", min_size=1, max_size=30).map(lambda s: "MIXPREC_" + s))
environments = st.dictionaries(env_names, hostile.map(lambda s: s.replace("\x00", "").replace("\udcff", "?")),
                               max_size=4)


@pytest.fixture
def project(tmp_path, clean_env):
    (tmp_path / "f.py").write_text(_TINY)
    clean_env.chdir(tmp_path)
    return tmp_path


def _invoke(args: list[str], env: dict[str, str] | None = None, project=None):
    full_env = {"MIXPREC_DB": str(project / "default.sqlite")} if project is not None else {}
    full_env.update(env or {})
    result = runner.invoke(app, args, env=full_env)
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output[-2000:], repr(result.exception))
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))
    assert "Traceback" not in result.output, (args, result.output[-2000:])
    bad = RAW_CONTROL.search(result.output)
    assert bad is None, (args, repr(result.output[max(0, bad.start() - 200):bad.end() + 200]))
    return result


def _write(path, content: str) -> None:
    path.write_bytes(content.encode("utf-8", "surrogateescape"))


@FUZZ
@given(content=toml_like, dotenv=toml_like, environ=environments, flag=hostile,
       which=st.sampled_from(["config-show", "config-json", "env"]))
def test_fuzz_config_and_env(project, content, dotenv, environ, flag, which):
    _write(project / "c.toml", content)
    _write(project / ".envfile", dotenv)
    if which == "env":
        args = ["env", "--device", "cpu", "--config", "c.toml", "--env-file", ".envfile", "--float32-matmul-precision", flag]
    else:
        args = ["config", "show", "--config", "c.toml", "--env-file", ".envfile", "--conv-tf32", flag,
                *(["--json"] if which == "config-json" else [])]
    _invoke(args, environ, project)


@FUZZ
@given(policy=toml_like, suffix=st.sampled_from([".toml", ".json"]), preset=hostile,
       command=st.sampled_from(["explain", "diagnose"]), use_preset=st.booleans(), extra=st.lists(hostile, max_size=2))
def test_fuzz_explain_and_diagnose(project, policy, suffix, preset, command, use_preset, extra):
    _write(project / f"p{suffix}", policy)
    chosen = ["--preset", preset] if use_preset else ["--policy", f"p{suffix}"]
    _invoke([command, "--pipeline", "f.py:build", "--size", "test", *chosen, *extra], project=project)


@FUZZ
@given(out=hostile, seed=hostile, batch=hostile, pipeline=st.one_of(st.just("f.py:build"), hostile))
def test_fuzz_run(project, out, seed, batch, pipeline):
    _invoke(["run", "--pipeline", pipeline, "--out", out or "x.npy", "--seed", seed, "--batch", batch, "--size", "test"],
            project=project)


@FUZZ
@given(pipeline=hostile.filter(lambda s: s.strip() not in ("tts", "diffusion", "minilm", "f.py:build")),
       flags=st.lists(st.tuples(st.sampled_from(["--batch", "--repeat", "--warmup", "--seed", "--timeout", "--budget",
                                                 "--configs", "--size", "--device", "--html", "--json", "--csv"]),
                                hostile), max_size=4))
def test_fuzz_bench_validation(project, pipeline, flags):
    args = ["bench", "--pipeline", pipeline or "nope", "--db", "b.sqlite"]
    for flag, value in flags:
        args += [flag, value]
    _invoke(args, project=project)


@FUZZ
@given(pipeline=hostile.filter(lambda s: s.strip() not in ("tts", "diffusion", "minilm", "f.py:build")),
       flags=st.lists(st.tuples(st.sampled_from(["--bound", "--objective", "--budget", "--seeds", "--repeat",
                                                 "--validation-seeds", "--margin", "--out", "--html"]),
                                hostile), max_size=4))
def test_fuzz_tune_validation(project, pipeline, flags):
    args = ["tune", "--pipeline", pipeline or "nope", "--db", "t.sqlite"]
    for flag, value in flags:
        args += [flag, value]
    _invoke(args, project=project)


@FUZZ
@given(pipeline=hostile, config=hostile, error=hostile, note=hostile,
       command=st.sampled_from([["runs", "list"], ["runs", "list", "--json"], ["runs", "show", "1"],
                                ["runs", "show", "1", "--json"], ["compare", "1", "2"], ["gate", "2", "--baseline", "1"]]),
       ids=st.lists(hostile, max_size=2))
def test_fuzz_store_commands(project, pipeline, config, error, note, command, ids):
    db = project / "s.sqlite"
    db.unlink(missing_ok=True)
    with Store(db) as store:
        for _ in range(2):
            run_id = store.start_run(pipeline=pipeline, size="test", machine={"name": config}, fingerprint="f",
                                     versions={}, notes=[note], command="mixprec bench")
            config_id = store.add_config(run_id, position=0, name=config, batch=1)
            store.add_sample(config_id, 0, 0.01)
            store.finish_config(config_id, status="error", metrics={"latency_median": 0.01}, error=error)
            store.finish_run(run_id)
    _invoke([*command, *ids, "--db", str(db)], project=project)


@FUZZ
@given(data=st.one_of(hostile, st.dictionaries(hostile, st.fixed_dictionaries(
    {"model": hostile, "pins": st.dictionaries(hostile, hostile, max_size=3), "updated": hostile}), max_size=3)
    .map(json.dumps)), command=st.sampled_from([["fallbacks", "list"], ["fallbacks", "list", "--json"]]))
def test_fuzz_fallbacks(project, data, command, monkeypatch):
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(project / "cache"))
    (project / "cache").mkdir(exist_ok=True)
    _write(project / "cache" / "fallbacks.json", data)
    _invoke(command, project=project)


@FUZZ
@given(port=st.one_of(st.integers(max_value=0), st.integers(min_value=65536, max_value=10**12)).map(str) | hostile,
       lang=hostile, store_dir=hostile)
def test_fuzz_ui_never_serves_on_bad_input(project, port, lang, store_dir):
    try:
        valid_port = 1 <= int(port) <= 65535
    except ValueError:
        valid_port = False
    args = ["ui", "--port", port, "--lang", lang if valid_port else "en"]
    if valid_port and lang in ("en", "zh", "ja", "he"):
        args[-1] = "xx"  # never start a server
    _invoke([*args, "--store-dir", store_dir or "s"], project=project)


#: Commands that would do real work (run models, serve) when given valid arguments by chance.
_WORKING = {"bench", "tune", "run", "pipelines", "ui", "diagnose", "explain"}


@FUZZ
@given(argv=st.lists(hostile, max_size=5).filter(lambda a: not a or a[0] not in _WORKING), head=st.sampled_from(
    [[], ["--help"], ["env", "--help"], ["config"], ["runs"], ["fallbacks"], ["presets", "--device"], ["explain"],
     ["bench", "--help"], ["tune", "--help"], ["run", "--help"], ["diagnose", "--help"], ["gate"], ["compare"],
     ["pipelines", "--help"], ["ui", "--help"], ["fallbacks", "clear", "--help"]]))
def test_fuzz_argv(project, argv, head):
    _invoke([*head, *argv], project=project)
