"""The documents agree with what they describe: docs/settings.md with the keys the engine's
parser accepts, docs/design.md's index with the Notes in the source, and every benchmark
record in bench/results/ (and docs/notes/results/) with a document that cites it."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from build_scripts.paths import REPO_ROOT

CONFIG_CPP = REPO_ROOT / "c10_overlay" / "c10" / "cuda" / "um" / "Config.cpp"
SETTINGS = REPO_ROOT / "docs" / "settings.md"
RECORD_DIRS = ("bench/results", "docs/notes/results")
# Folders of records: what lies there is cited, it does not cite.
NOT_DOCUMENTS = ("bench/results/", "docs/notes/results/", "tests/gpu/results/")

# A record named in a document: `results/NAME`, `bench/results/NAME` or a relative link to it.
# NAME may hold shell patterns: {a,b} alternatives, * and a trailing ... or - for "these".
_CITATION = re.compile(r"(?<![\w/.-])((?:\.\.?/|[\w.-]+/)*results/(?:[^\s`'\"<>(),;\[\]{}|]|\{[^{}\s]*\})+)")
_ROOTED = ("bench/", "docs/", "tests/")
SKIP = {"build", "dist", "node_modules", "__pycache__"}  # build outputs, not documents


def config_keys() -> list[str]:
    """The keys Config.cpp's parser accepts: its kKeys list (test_c_api checks that this list
    and the parser's ``key == "..."`` branches are the same)."""
    text = CONFIG_CPP.read_text()
    listed = re.search(r"kKeys\s*=\s*((?:\s*\"[^\"]*\")+)\s*;", text)
    assert listed is not None, "Config.cpp: the kKeys list was not found"
    joined = "".join(re.findall(r'"([^"]*)"', listed.group(1)))
    keys = [k.strip() for k in joined.split(",")]
    assert sorted(keys) == sorted(set(re.findall(r'key == "(\w+)"', text)))
    return keys


def _expand(pattern: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m is None:
        return [pattern]
    return [
        x
        for alt in m.group(1).split(",")
        for x in _expand(pattern[: m.start()] + alt + pattern[m.end() :])
    ]


def citations(doc: Path, text: str) -> list[str]:
    """The repository-relative patterns of the records ``doc`` cites."""
    found = []
    for token in _CITATION.findall(text):
        token = token.rstrip(".:")
        token = token.replace("…", "*").replace("...", "*")
        if token.endswith("-"):
            token += "*"
        if token.startswith(_ROOTED):
            found += _expand(token)
            continue
        try:
            base = (doc.parent / token).resolve().relative_to(REPO_ROOT.resolve())
        except ValueError:  # a path outside the repository
            continue
        found += _expand(base.as_posix())
    return found


def documents(root: Path = REPO_ROOT) -> list[Path]:
    """Every Markdown document of the tree, records aside."""
    return sorted(
        p
        for p in root.rglob("*.md")
        if not any(part.startswith(".") or part in SKIP for part in p.relative_to(root).parts)
        and not p.relative_to(root).as_posix().startswith(NOT_DOCUMENTS)
    )


def records(root: Path = REPO_ROOT) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix()
        for d in RECORD_DIRS
        if (root / d).is_dir()
        for p in (root / d).iterdir()
        if p.is_file()
    )


def uncited(root: Path = REPO_ROOT) -> list[str]:
    patterns = [c for doc in documents(root) for c in citations(doc, doc.read_text())]
    return [r for r in records(root) if not any(fnmatch.fnmatchcase(r, p) for p in patterns)]


def test_settings_page_documents_every_key_the_parser_accepts() -> None:
    keys = config_keys()
    text = SETTINGS.read_text()
    documented = re.findall(r"^### `(\w+)`$", text, re.M)
    assert sorted(documented) == sorted(keys), (
        f"docs/settings.md: missing {sorted(set(keys) - set(documented))}, "
        f"not accepted by Config.cpp {sorted(set(documented) - set(keys))}"
    )
    sections = re.split(r"^### ", text, flags=re.M)[1:]
    for section in sections:
        key = section.split("`")[1]
        for field in ("- Kind: ", "- Default: ", "- Accepts: ", "- When to change: "):
            assert field in section, f"docs/settings.md, `{key}`: no '{field.strip()}' line"
        assert re.search(r"- Kind: (user|tuning)\b", section), key
    summary = re.findall(r"^\| \[`(\w+)`\]\(#\w+\) \| (user|tuning) \|", text, re.M)
    assert sorted(k for k, _ in summary) == sorted(keys)


def test_readme_settings_table_names_the_user_keys() -> None:
    text = SETTINGS.read_text()
    user = {k for k, kind in re.findall(r"^\| \[`(\w+)`\]\(#\w+\) \| (user|tuning) \|", text, re.M)
            if kind == "user"}
    readme = (REPO_ROOT / "README.md").read_text()
    table = re.search(r"\| key \| default \| meaning \|\n\|[-|]+\|\n((?:\|.*\n)+)", readme)
    assert table is not None
    assert set(re.findall(r"^\| `(\w+)` \|", table.group(1), re.M)) == user


def test_design_index_names_every_note_in_the_source() -> None:
    head = re.compile(r'^\s*(?://|#|"""|\*)?\s*Note \[([^\]]+)\](?::|\s*$)')
    notes = {
        m.group(1)
        for p in (REPO_ROOT / "c10_overlay").rglob("*")
        if p.is_file() and p.suffix in (".h", ".cpp", ".cu", ".py")
        for line in p.read_text(errors="replace").splitlines()
        if (m := head.match(line))
    }
    index = (REPO_ROOT / "docs" / "design.md").read_text().split("## Index of the Notes")[-1]
    missing = sorted(n for n in notes if f"[{n}]" not in index)
    assert not missing, f"docs/design.md's index of Notes lacks {missing}"


def test_every_record_is_cited_by_a_document() -> None:
    left = uncited()
    assert not left, (
        f"{len(left)} records no document cites, e.g. {left[:5]}: cite each from the README, "
        "bench/README.md or the lab note that discusses it (docs/notes/), or remove it"
    )


def test_citations_read_patterns_and_paths(tmp_path: Path) -> None:
    doc = REPO_ROOT / "docs" / "notes" / "x.md"
    got = citations(
        doc,
        "see `results/a-{1,2}.json`, `bench/results/b.{json,png}`, "
        "[c](../../bench/results/c.json) and `results/d-…` and results/e-",
    )
    assert got == [
        "docs/notes/results/a-1.json",
        "docs/notes/results/a-2.json",
        "bench/results/b.json",
        "bench/results/b.png",
        "bench/results/c.json",
        "docs/notes/results/d-*",
        "docs/notes/results/e-*",
    ]
    readme = REPO_ROOT / "bench" / "README.md"
    assert citations(readme, "(`results/step_time-h200-2026-11-21.{json,png}`)") == [
        "bench/results/step_time-h200-2026-11-21.json",
        "bench/results/step_time-h200-2026-11-21.png",
    ]


def test_configure_takes_exactly_the_documented_keys() -> None:
    """torch.cuda.um.configure()'s keywords (read from its source: um.py needs torch to
    import) are the keys docs/settings.md documents: the Python layer has none of its own."""
    source = (REPO_ROOT / "c10_overlay" / "torch" / "cuda" / "um.py").read_text()
    signature = re.search(r"^def configure\(\n(.*?)\n\) -> None:", source, re.M | re.S)
    assert signature is not None
    keywords = re.findall(r"^    (\w+): ", signature.group(1), re.M)
    assert sorted(k for k in keywords if k != "conf") == sorted(config_keys())


def test_readme_and_bench_readme_stay_short() -> None:
    readme = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(readme) <= 250
    fence = False
    for n, line in enumerate(readme, 1):
        fence ^= line.startswith("```")
        if not fence and not line.startswith(("|", "```")):
            assert len(line) <= 200, f"README.md:{n}: a prose line over 200 characters"
    results = "\n".join(readme).split("## Results")[1].split("\n## ")[0]
    # every number of the results section is a link to its record
    bare = re.sub(r"\[[^\]]*\]\([^)]*\)", "", results)
    bare = re.sub(r"`[^`]*`|\d+(\.\d+)? (GiB|B)\b|\d+ x \d+|\b\d+ new tokens|H200s?|Gen5|torch [\d.]+\+cu\d+", "", bare)
    assert not re.findall(r"\d+\.\d+", bare), "README.md, Results: a measured number without a link"
    links = re.findall(r"\[[\d.]+[^\]]*\]\(([^)]+)\)", results)
    assert links and all(link.startswith("bench/results/") for link in links), links
    assert all((REPO_ROOT / link).is_file() for link in links)
    assert len((REPO_ROOT / "bench" / "README.md").read_text().splitlines()) <= 300
