"""The documentation holds: every relative link resolves, the README's quick
start runs, its API table names every public function, and its set-up
commands are the ones CI runs."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

import jax_rmsnorm

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md", ROOT / "benchmarks" / "RESULTS.md",
         *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(path):
    """The anchors GitHub makes of a page's headings."""
    heads = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def _section(text, title):
    """The lines under the heading ``## title``, to the next ``## ``."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def _blocks(text, lang):
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    links = LINK.findall(page.read_text())
    assert links or page != README, "no links found in README.md: is the pattern right?"
    for link in links:
        if re.match(r"[a-z]+:", link):  # http:, https:, mailto:
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{page.relative_to(ROOT)}: {link} points at nothing"
        if anchor:
            assert anchor in _anchors(path), f"{page.relative_to(ROOT)}: {link}: no such heading"


def test_link_check_catches_a_broken_link(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("see [b](b.md) and ![plot](missing.png)\n")
    (tmp_path / "b.md").write_text("# B\n")
    missing = [link for link in LINK.findall(page.read_text()) if not (tmp_path / link).exists()]
    assert missing == ["missing.png"]


def test_readme_quick_start_runs():
    """Both Python blocks of the quick start, in one process on 8 CPU devices."""
    code = "\n".join(_blocks(_section(README.read_text(), "Quick start"), "python"))
    assert "jrn.rms_norm(" in code and "shard_map" in code and "jax_rmsnorm.flax" in code
    pytest.importorskip("flax")
    pytest.importorskip("equinox")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]


def test_readme_api_table_names_every_public_function():
    api = _section(README.read_text(), "API")
    named = set(re.findall(r"`(\w+)\(?", api))
    assert not set(jax_rmsnorm.__all__) - named, sorted(set(jax_rmsnorm.__all__) - named)


def test_readme_setup_commands_are_what_ci_runs():
    setup = [line for block in _blocks(_section(README.read_text(), "Set up"), "bash") for line in block.splitlines()]
    assert setup == ['pip install ".[test]" && python examples/llama.py', "pytest -q -n auto tests"], setup
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for command in ('pip install ".[test]"', "python examples/llama.py", "pytest -q -n auto tests"):
        assert command in ci, command


def test_readme_is_short_and_names_no_commits():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    commits = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text) if not w.isdigit()]
    assert not commits, commits
