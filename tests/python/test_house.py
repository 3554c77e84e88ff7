"""The project's front stays what a newcomer can take in: the README short and free of commit
hashes (they go stale; docs/results.md names commits), and benchmarks/results one current run per
benchmark, variant and card, each file indexed in docs/results.md."""

import os
import re

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
README_MAX_LINES = 110
RESULTS_MAX_FILES = 40
# A word of 7 to 40 hex digits with a letter and a digit in it: how a commit is named.
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def _read(*path):
    with open(os.path.join(ROOT, *path)) as f:
        return f.read()


def test_the_readme_stays_short_and_names_no_commit():
    readme = _read("README.md")
    assert readme.count("\n") <= README_MAX_LINES
    assert COMMIT.findall(readme) == []


def test_the_commit_pattern_finds_hashes_and_spares_words():
    assert COMMIT.findall("at 0d6112a and 669c503e1f, not in 'defaced', 1234567 or 'cafe'") == \
        ["0d6112a", "669c503e1f"]


def test_results_keep_few_files_each_indexed():
    files = sorted(os.listdir(os.path.join(ROOT, "benchmarks", "results")))
    assert len(files) <= RESULTS_MAX_FILES, len(files)
    index = _read("docs", "results.md").split("\n## ", 2)[1]  # the section after the intro
    assert index.startswith("Index")
    assert [f for f in files if f"benchmarks/results/{f})" not in index] == []
