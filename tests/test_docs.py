"""The docs a newcomer reads: a README of at most 15 KB, every relative link (and #anchor) in
the README, CONTRACTS.md, docs/ and the benchmarks' pages resolving to a file of the repo, and
no changelog prose."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parent.parent
README_MAX_BYTES = 15 * 1024
# Pages other engineers are writing in parallel; the README and docs/deployment.md link them as
# they will be after the merge. Links to these may dangle until then: remove this list (and
# the pages' skip) once they are merged.
EXPECTED_AFTER_MERGE: set[str] = set()


def pages() -> list[Path]:
    return [PROJECT_ROOT / "README.md", PROJECT_ROOT / "CONTRACTS.md",
            *sorted((PROJECT_ROOT / "docs").glob("*.md")),
            PROJECT_ROOT / "benchmarks" / "RESULTS.md",
            PROJECT_ROOT / "benchmarks" / "README.md",
            *sorted((PROJECT_ROOT / "benchmarks" / "results").glob("**/README.md"))]


def _without_code(text: str) -> str:
    """Markdown minus fenced blocks and inline code (a `[x](y)` there is no link)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def links(path: Path) -> list[str]:
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", _without_code(path.read_text()))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    heading = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_readme_is_at_most_15_kb():
    size = len((PROJECT_ROOT / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move detail into docs/"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        rel = dest.relative_to(PROJECT_ROOT).as_posix() if dest.is_relative_to(
            PROJECT_ROOT) else str(dest)
        if not dest.exists():
            if rel not in EXPECTED_AFTER_MERGE:
                broken.append(f"{target} (no file {rel})")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {rel})")
    assert not broken, f"{page.relative_to(PROJECT_ROOT)}: {broken}"


def test_the_link_checker_catches_a_broken_link_and_anchor(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[ok](#top) [bad](missing.md) [anchor](#nowhere) "
                    "`[code](not-a-link.md)`\n")
    assert links(page) == ["#top", "missing.md", "#nowhere"]
    assert anchors(page) == {"top"}
    assert slug("Kubernetes (`provisioner: kubernetes`)") == "kubernetes-provisioner-kubernetes"


def test_the_readme_links_the_rest():
    """The README is the way in: it links every page of docs/ and the references."""
    readme = links(PROJECT_ROOT / "README.md")
    pages = {f"docs/{p.name}" for p in (PROJECT_ROOT / "docs").glob("*.md")}
    for page in sorted(pages | {"CONTRACTS.md", "benchmarks/RESULTS.md"} | EXPECTED_AFTER_MERGE):
        assert page in readme, f"README.md does not link {page}"
    deployment = links(PROJECT_ROOT / "docs" / "deployment.md")
    for page in ("deployment-iam.md", "preflight-and-logs.md", "checkpoints.md", "spot.md",
                 "model-sizes.md"):
        assert page in deployment, f"docs/deployment.md does not link {page}"


# Prose that tells the history of the code instead of what it is.
CHANGELOG = re.compile(r"\b(until this stop|this stop|previous stop|stops ago|until now|no longer|"
                       r"is now|are now|now (?:takes|uses|runs|sets|trains))\b", re.I)


@pytest.mark.parametrize("page", [PROJECT_ROOT / "README.md", PROJECT_ROOT / "CONTRACTS.md",
                                  *sorted((PROJECT_ROOT / "docs").glob("*.md")),
                                  PROJECT_ROOT / "benchmarks" / "RESULTS.md"],
                         ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_no_changelog_prose(page):
    found = [m.group(0) for m in CHANGELOG.finditer(page.read_text())]
    assert not found, f"{page.relative_to(PROJECT_ROOT)}: describe what is, not {found}"
