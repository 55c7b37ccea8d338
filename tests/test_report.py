"""`dimr report`: a self-contained HTML page, looked at in a real headless Chromium (a screenshot that is not
blank, the key elements in the rendered DOM), and its pictures as PNG files."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_runner import cli

from dimr.search import run_search

SMALL = dict(num_sequences=2, seq_len=16)
CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium")
                 if p and Path(p).is_file()), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here: `apt-get install -y chromium`")


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('report')}/r.db"
    run_search("tiny-random", 3, trials=10, objective="pareto", storage=url, study="p", **SMALL)
    run_search("tiny-random", 3, trials=6, storage=url, study="c", **SMALL)
    return url


def _chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "profile"
    profile.mkdir(exist_ok=True)
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run",
                           f"--user-data-dir={profile}", *args, page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=True)


@needs_chromium
@pytest.mark.parametrize("study, sections", [("p", ["convergence", "importance", "pareto", "strips", "top-trials"]),
                                             ("c", ["convergence", "importance", "strips", "top-trials"])])
def test_report_renders_in_chromium(capsys, tmp_path, url, study, sections):
    from PIL import Image

    page = tmp_path / "report.html"
    code, out, err = cli(capsys, "report", study, "--storage", url, "-o", str(page))
    assert code == 0 and f"wrote {page}" in out, err
    text = page.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", text), "the page fetches nothing"
    assert "<script" not in text

    dom = _chromium(tmp_path, page, "--dump-dom").stdout
    ids = re.findall(r'<section id="([^"]+)"', dom)
    assert ids == sections
    assert dom.count('src="data:image/png;base64,') == len(sections) - 1
    assert 'id="importance-note"' in dom and "fixed budget" in dom
    assert dom.count('<span class="strip">') == min(10, 10 if study == "p" else 6)
    assert re.search(r"<tbody><tr><td class=\"num\">\d+</td>", dom), "the top-trials table has rows"

    shot = tmp_path / "shot.png"
    _chromium(tmp_path, page, f"--screenshot={shot}", "--window-size=1100,2400")
    img = Image.open(shot).convert("L")
    pixels = list(img.tobytes())
    dark = sum(p < 200 for p in pixels) / len(pixels)
    assert 0.03 < dark < 0.9, f"the screenshot is blank or a solid block ({dark:.3f} dark)"
    assert len(set(pixels)) > 50, "the screenshot has no pictures in it"


def test_report_pngs_and_bad_input(capsys, tmp_path, url):
    code, out, err = cli(capsys, "report", "p", "--storage", url, "-o", str(tmp_path / "r.html"),
                         "--png", str(tmp_path / "png"))
    assert code == 0, err
    pngs = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert pngs == ["convergence.png", "importance.png", "pareto.png", "strips.png"]
    assert all((tmp_path / "png" / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in pngs)
    for args, needle in ((["nope", "-o", str(tmp_path / "x.html")], "no study 'nope'"),
                         (["p", "-o", str(tmp_path / "no" / "x.html")], "does not exist")):
        code, _, err = cli(capsys, "report", *args, "--storage", url)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.html").exists()


def test_layer_importance_numbers(url):
    from dimr.masks import mask_from_key
    from dimr.report import _complete, marginal_effects, single_skip_profile
    from dimr.studies import load_study
    from storage import open_storage

    trials = _complete(load_study(open_storage(url), "p"))
    profile = single_skip_profile(trials, 8)
    singles = {mask_from_key(t.user_attrs["mask"]).index(False): t.values[0] for t in trials
               if t.user_attrs["mask"].count("0") == 1}
    assert profile == dict(sorted(singles.items())) and profile
    effects = marginal_effects(trials, 8)
    assert len(effects) == 8 and any(e is not None for e in effects)
