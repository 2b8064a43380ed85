"""The Python and TOML blocks of README.md, examples/README.md and docs/**/*.md run or say why not.

The rule (docs/development.md says it for writers):

* ``python`` blocks of one page run in page order, concatenated, in one fresh process of the
  environment's Python, from a scratch folder, with ``HF_HUB_OFFLINE=1``, ``COLUMNS=120``, no
  ``MIXPREC_*`` variables, the data folder per page and the cache folder per test session in
  temporary folders. A block may use what an earlier block of its page defined. A block
  preceded by ``<!-- not run: REASON -->`` is left out, and its reason is required.
* ``toml`` blocks are parsed; a policy file (top-level ``version``, ``rules`` or ``compile``)
  is loaded with ``Policy.from_toml``, any other as a mixprec configuration file through
  ``mixprec.config.resolve``, so a wrong key fails.
* Untagged blocks are shown output. Shell blocks are tests/test_readme.py's. Any other tag fails
  until this test knows how to check it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

import pytest

from docs_blocks import ROOT, Block, all_blocks, doc_files

SHELL = ("bash", "sh", "shell", "console")
#: Keys only a policy file has at its top level.
POLICY_KEYS = {"version", "rules", "compile"}

BLOCKS = all_blocks()
PAGES = [name for name in doc_files() if any(b.lang == "python" and not b.not_run for b in BLOCKS if b.file == name)]


def _id(block: Block) -> str:
    return f"{block.file}:{block.line}"


def test_every_block_has_a_known_language():
    unknown = [f"{_id(b)}: ```{b.lang}" for b in BLOCKS if b.lang not in ("", "python", "toml", *SHELL)]
    assert not unknown, f"code blocks in a language no test checks (add it to tests/test_docs_blocks.py): {unknown}"


def test_every_skipped_block_is_a_python_block_with_a_reason():
    for block in BLOCKS:
        if block.not_run is not None:
            assert block.lang == "python", f"{_id(block)}: only python blocks are skipped by a comment"
            assert len(block.not_run) > 10, f"{_id(block)}: say why the block is not run"


def test_the_pages_have_python_blocks_that_run_and_some_that_say_why_not():
    assert "README.md" in PAGES and "docs/your-app.md" in PAGES
    assert any(b.not_run for b in BLOCKS)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One cache folder for the session: the hardware probe is measured once, not per page."""
    return tmp_path_factory.mktemp("cache")


@pytest.mark.real_probe  # a fresh process without MIXPREC_* variables: a probe there measures this machine
@pytest.mark.parametrize("page", PAGES)
def test_the_python_blocks_of_each_page_run(page, tmp_path, cache_dir):
    code = [b for b in BLOCKS if b.file == page and b.lang == "python" and not b.not_run]
    # Each block starts on its own line in the script, with a marker naming where it came from.
    script = "".join(f"# --- {_id(b)}\n{b.text}\n" for b in code)
    (tmp_path / "blocks.py").write_text(script, encoding="utf-8")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MIXPREC_", "MYAPP_", "ACE_STEP_"))}
    env.update(HF_HUB_OFFLINE="1", COLUMNS="120", XDG_DATA_HOME=str(tmp_path / "data"), XDG_CACHE_HOME=str(cache_dir))
    done = subprocess.run([sys.executable, "blocks.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, (f"the python blocks of {page} ({', '.join(_id(b) for b in code)}) failed:\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


TOML = [b for b in BLOCKS if b.lang == "toml"]


@pytest.mark.parametrize("block", TOML, ids=[_id(b) for b in TOML])
def test_each_toml_block_loads_with_mixprecs_own_reader(block, tmp_path):
    from mixprec import Policy
    from mixprec.config import resolve

    data = tomllib.loads(block.text)
    if POLICY_KEYS & set(data):
        Policy.from_toml(block.text, _id(block))
    else:
        path = tmp_path / "mixprec.toml"
        path.write_text(block.text, encoding="utf-8")
        resolved = resolve(config_file=path, search_dir=tmp_path, environ={})
        for key in data:
            assert resolved.source_of(key).layer != "default", f"{_id(block)}: {key} was not read"
