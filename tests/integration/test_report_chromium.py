"""The HTML report in a real browser: headless Chromium (Debian's ``chromium``), network off.

Skips cleanly where Chromium is not installed. The network is cut twice: Chromium runs in a new
network namespace when ``unshare -n`` works here, and every request goes to an unreachable proxy
whatever happens; the page's Content-Security-Policy forbids loads as well.
"""
from __future__ import annotations

import base64
import html
import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import models_doctor  # noqa: E402

from quantdbg import report  # noqa: E402

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None,
                                reason="headless Chromium not installed (apt-get install chromium)")
BAR_BLUE = (0x1F, 0x77, 0xB4)  # the ranking chart's bars: only an embedded plot can paint this colour
LEAD_BACKGROUND = (0xF5, 0xF8, 0xFC)  # the first screen's box
VIEWPORT = (1280, 800)
# Appended to a copy of the page (without its CSP): where each needle's first occurrence is drawn.
PROBE = """<script>
const found = {};
const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
  for (const needle of NEEDLES) {
    const at = node.data.indexOf(needle);
    if (at < 0 || needle in found) continue;
    const range = document.createRange();
    range.setStart(node, at); range.setEnd(node, at + needle.length);
    const r = range.getBoundingClientRect();
    found[needle] = [r.left, r.top, r.right, r.bottom];
  }
}
const out = document.createElement("pre");
out.id = "probe";
out.textContent = JSON.stringify({width: innerWidth, height: innerHeight, found: found});
document.body.appendChild(out);
</script>"""


def _offline_prefix() -> list[str]:
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        return [unshare, "-n"]
    return []


def _chromium(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [*_offline_prefix(), CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--no-first-run", "--disable-quic", f"--user-data-dir={profile}",
               "--proxy-server=http://127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND", *extra,
               page.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


class _Dom(HTMLParser):
    """Collects <img> sources and the cells of every table row by table id."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.tables: dict[str, list[list[str]]] = {}
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = dict(attrs)
        if tag == "img":
            self.images.append(attr.get("src") or "")
        elif tag == "table":
            self._table = attr.get("id") or ""
            self.tables.setdefault(self._table, [])
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    pytest.importorskip("matplotlib")  # the page carries its plots
    folder = tmp_path_factory.mktemp("chromium")
    results = models_doctor.report_results()
    page = folder / "report.html"
    report.write_report(results["bundle"], html=page)
    return results, page, folder


def test_dom_has_decodable_plots_and_the_ranking_table(rendered):
    results, page, folder = rendered
    done = _chromium(page, folder / "profile-dom", "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = _Dom()
    dom.feed(done.stdout)
    assert len(dom.images) == 6  # the two rankings, fallback search, weights zeroed, histograms, scale curves
    for src in dom.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n")
    ranking = dom.tables["sensitivity-ranking"]
    header, rows = ranking[0], ranking[1:]
    assert header[:3] == ["rank", "node", "op"]
    assert [r[1] for r in rows] == list(results["sensitivity"].ranking)
    assert [int(r[0]) for r in rows] == list(range(1, len(rows) + 1))
    assert dom.tables["doctor-findings"][1:]  # the doctor's findings are listed too


def test_screenshot_shows_the_plots(rendered):
    plt_image = pytest.importorskip("matplotlib.image")
    _, page, folder = rendered
    shot = folder / "shot.png"
    done = _chromium(page, folder / "profile-shot", "--window-size=1200,6000", f"--screenshot={shot}",
                     "--hide-scrollbars")
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    pixels = (plt_image.imread(str(shot))[..., :3] * 255).round().astype(int)
    blue = (abs(pixels - BAR_BLUE).sum(axis=-1) <= 6).sum()
    assert blue > 500, "the ranking chart's bars are not on screen: embedded images did not render"


def _probe(page: Path, folder: Path, needles: list[str]) -> dict:
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page.read_text())
    script = PROBE.replace("NEEDLES", json.dumps(needles))
    probe = folder / "probe.html"
    probe.write_text(text.replace("</body>", script + "</body>"))
    done = _chromium(probe, folder / "profile-probe", f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
                     "--hide-scrollbars", "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stdout[-2000:]
    return json.loads(html.unescape(found.group(1)))


def test_first_viewport_shows_the_verdict_and_the_layers_kept_out_of_int8(rendered):
    results, page, folder = rendered
    kept = list(results["fallback"].exclude)
    assert kept
    measured = _probe(page, folder, ["Target met", *kept, "Sensitivity ranking"])
    # --dump-dom's window keeps room for browser chrome: its viewport is at most 1280x800, which makes
    # the check stricter, never looser.
    width, height = measured["width"], measured["height"]
    assert width == VIEWPORT[0] and 600 <= height <= VIEWPORT[1]
    for needle in ["Target met", *kept]:
        left, top, right, bottom = measured["found"][needle]
        assert 0 <= top < bottom <= height and 0 <= left < right <= width, (needle, measured)
    # The long sections start below the first screen (their first mention is in the contents list).
    assert measured["found"]["Sensitivity ranking"][1] > measured["found"][kept[-1]][1]
    plt_image = pytest.importorskip("matplotlib.image")
    shot = folder / "first-screen.png"
    done = _chromium(page, folder / "profile-first", f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
                     f"--screenshot={shot}", "--hide-scrollbars")
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    pixels = (plt_image.imread(str(shot))[..., :3] * 255).round().astype(int)
    assert pixels.shape[:2] == (VIEWPORT[1], VIEWPORT[0])
    assert (abs(pixels - LEAD_BACKGROUND).sum(axis=-1) <= 3).sum() > 100_000  # the boxed first screen


def test_no_console_message(rendered, tmp_path):
    _, page, folder = rendered
    done = _chromium(page, folder / "profile-console", "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert done.returncode == 0
    assert "CONSOLE" not in done.stderr, [line for line in done.stderr.splitlines() if "CONSOLE" in line]
    # The same check sees a page breaking its own policy (so a silent stderr means something).
    bad = tmp_path / "bad.html"
    bad.write_text(page.read_text().replace("</main>", "<script>0</script></main>"))  # refused at parse time
    done = _chromium(bad, tmp_path / "profile-bad", "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert "CONSOLE" in done.stderr and "Content Security Policy" in done.stderr, done.stderr[-3000:]


def test_report_references_nothing_outside_itself(rendered):
    _, page, _ = rendered
    text = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:|#)""", text)
    assert "@import" not in text and "url(" not in text
