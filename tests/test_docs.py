"""The repository is self-contained: no file points at notes outside it, every relative link in
the docs resolves, the licence is there, and README measurements carry a date and a commit
instead of words about when in the work they were taken."""
from __future__ import annotations

import re
import tomllib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

# Built from pieces so that this file does not match itself.
OUTSIDE = ["../" + "shared", "shared/" + "paper", "shared/" + "reference",
           "official-" + "code.md"]  # the private notes' name; the in-repo page is docs/paper-vs-code.md
README_PHRASES = ["measured " + "here", "this " + "session", "to" + "day"]
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _repo_files() -> list[Path]:
    """Tracked files plus new ones git does not ignore (what a commit would ship)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, check=True).stdout
    names = sorted({n for n in out.decode("utf-8", "surrogateescape").split("\0") if n})
    return [ROOT / n for n in names if ".git" not in Path(n).parts and (ROOT / n).is_file()]


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None  # binary
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_no_file_points_outside_the_repository():
    bad = []
    for path in _repo_files():
        text = _text(path)
        if text is None:
            continue
        low = text.lower()
        for needle in OUTSIDE:
            i = low.find(needle.lower())
            if i >= 0:
                line = text.count("\n", 0, i) + 1
                bad.append(f"{path.relative_to(ROOT)}:{line}: {needle!r}")
    assert not bad, "references to files outside the repository:\n" + "\n".join(bad)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", h).replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in md.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        m = None if in_code else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = _slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
        if not in_code:
            out.update(re.findall(r'<a id="([^"]+)"></a>', line))
    return out


def _markdown_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _links(md: Path) -> list[str]:
    text = md.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)   # no links inside code blocks
    text = re.sub(r"`[^`\n]*`", "", text)                # nor inside inline code
    return LINK.findall(text)


@pytest.mark.parametrize("page", _markdown_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_markdown_links_resolve(page):
    bad = []
    for target in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):   # http:, https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if path and (ROOT.resolve() not in dest.parents and dest != ROOT.resolve()):
            bad.append(f"{target}: leaves the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor.lower() not in _anchors(dest):
            bad.append(f"{target}: no heading '{anchor}' in {dest.relative_to(ROOT.resolve())}")
    assert not bad, f"{page.relative_to(ROOT)}:\n" + "\n".join(bad)


def test_slug_matches_github():
    assert _slug("The run.sh overrides") == "the-runsh-overrides"
    assert _slug("Deep-Squeeze (`gossip_ds`)") == "deep-squeeze-gossip_ds"
    assert _slug("Where each η comes from") == "where-each-η-comes-from"
    assert _slug("Optimizer, schedule, batch and seeds") == "optimizer-schedule-batch-and-seeds"


def test_license_is_mit():
    lic = ROOT / "LICENSE"
    assert lic.is_file()
    first = lic.read_text(encoding="utf-8").splitlines()[0]
    assert "MIT" in first and "license" in first.lower()
    # the package metadata says the same, as an SPDX expression (the table form is deprecated)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]


def test_readme_dates_its_measurements():
    text = (ROOT / "README.md").read_text(encoding="utf-8").lower()
    found = [p for p in README_PHRASES if p in text]
    assert not found, f"README.md says when in the work something was measured: {found}"


def test_readme_is_short():
    """What lpdl is, the two commands, what you get, SLURM and a map of the docs: the rest is in docs/."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_screenshot_is_a_png():
    shot = ROOT / "docs" / "report-screenshot.png"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_measurements_page_and_quotes_are_current():
    """docs/measurements.md and every quoted figure are what scripts/measurements.py writes from
    docs/measurements/facts/*.json (run `make measurements` after editing a fact)."""
    import measurements
    assert measurements.stale() == []
    assert subprocess.run([sys.executable, str(ROOT / "scripts/measurements.py"), "--check"]).returncode == 0


def test_every_quote_names_a_known_fact():
    import measurements
    facts, machines = measurements.load()
    assert facts, "no facts"
    for page in measurements.quoting_pages():
        if page.exists():
            for fid in measurements.QUOTE.findall(page.read_text(encoding="utf-8")):
                assert fid[0] in facts, f"{page.name} quotes unknown fact {fid[0]}"


def test_a_malformed_fact_is_one_line(tmp_path, monkeypatch):
    import json

    import measurements
    facts = tmp_path / "facts"
    facts.mkdir()
    (facts / "x.json").write_text(json.dumps({"topic": "step", "title": "t", "value": "1 s",
                                               "date": "26 Nov 2026", "commit": "abc1234",
                                               "machine": "epyc-2core", "command": "c"}))
    monkeypatch.setattr(measurements, "FACTS", facts)
    with pytest.raises(measurements.FactError, match="date '26 Nov 2026' is not YYYY-MM-DD"):
        measurements.load()
    (facts / "x.json").write_text(json.dumps({"topic": "step", "title": "t", "value": "1 s",
                                               "date": "2026-11-26", "commit": "abc1234",
                                               "machine": "a-laptop", "command": "c"}))
    with pytest.raises(measurements.FactError, match="machine 'a-laptop' is not in machines.json"):
        measurements.load()


def test_fact_commits_exist_in_history():
    """A fact names a commit of this repository (skipped in a shallow clone)."""
    import measurements
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT,
                             capture_output=True, text=True).stdout.strip()
    if shallow == "true":
        pytest.skip("shallow clone")
    facts, _ = measurements.load()
    missing = [f"{k}: {f['commit']}" for k, f in facts.items()
               if subprocess.run(["git", "cat-file", "-e", f"{f['commit']}^{{commit}}"], cwd=ROOT,
                                 capture_output=True).returncode != 0]
    assert not missing, missing


def test_every_evidence_file_belongs_to_a_cited_measurement():
    """Evidence under docs/measurements/ is kept for a fact: every file there is cited (a fact's
    evidence, or a link in the docs) or sits in a folder beside a cited file (one measurement's
    set of outputs, with its README). A superseded measurement's files go with it."""
    import measurements
    facts, _ = measurements.load()
    root = ROOT / "docs" / "measurements"
    cited = {ROOT / e for f in facts.values() for e in f.get("evidence", [])}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for link in re.findall(r"\]\(([^)#\s]+)", page.read_text(encoding="utf-8")):
            cited.add((page.parent / link).resolve())
    folders = {p.parent for p in cited}
    kept = [p for p in root.rglob("*") if p.is_file() and "facts" not in p.relative_to(root).parts
            and p.name != "machines.json" and "__pycache__" not in p.parts]
    orphans = sorted(str(p.relative_to(ROOT)) for p in kept if p not in cited and
                     (p.parent == root or p.parent not in folders))
    assert not orphans, f"evidence no fact or doc cites (remove it, or cite it): {orphans}"
