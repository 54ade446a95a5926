"""mkdocs hooks (mkdocs.yml ``hooks:``): pages that include a repository file, and the
guide's links to repository files outside ``docs/`` (tutorials, benchmarks and their
results), checked and published with the site.

A line ``<!-- include: ../ARCHITECTURE.md -->`` in a page is replaced by that file, its
relative links rewritten to stay correct from the page: the page then always shows what
the file says, with nothing to keep in sync by hand.

Written as ``../tutorials/01_quickstart_cora.py`` such a link works where the Markdown is
read in the repository; for the site, each target is copied under ``repo/`` and the link
rewritten to it, so mkdocs' own link check covers it too. A target that does not exist,
or a folder (the site cannot list one: link a file in it), fails a strict build.
"""
from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any, Dict

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.repo_links")
INCLUDE = re.compile(r"^<!-- include: (\S+) -->$", re.M)
TARGET = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|#|/)([^)\s]+)\)")
LINK = re.compile(r"\]\((\.\./[^)\s#]+)((?:#[^)\s]*)?)\)")
SITE_FOLDER = "repo"


class RepoFile(File):
    """A repository file published as it is (a Markdown file too: not rendered as a page)."""

    def is_documentation_page(self) -> bool:
        return False

    def is_static_page(self) -> bool:
        return False


def expand(page_path: Path, text: str) -> str:
    """``text`` with each include line replaced by the file it names (relative to the page)."""

    def include(match: "re.Match[str]") -> str:
        source = (page_path.parent / match.group(1)).resolve()
        if not source.is_file():
            log.warning("%s includes %s, which is not a file", page_path.name, match.group(1))
            return ""
        shift = posixpath.relpath(source.parent.as_posix(), page_path.parent.resolve().as_posix())

        def relink(link: "re.Match[str]") -> str:
            return f"]({posixpath.normpath(posixpath.join(shift, link.group(1)))})"

        return TARGET.sub(relink, source.read_text())

    return INCLUDE.sub(include, text)


def _targets(page_uri: str, text: str) -> Dict[str, str]:
    """``{link as written: path from the repository root}`` for links leaving docs/."""
    found = {}
    for match in LINK.finditer(text):
        link = match.group(1)
        found[link] = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page_uri), link))
    return found


def on_files(files: Files, config: Any) -> Files:
    docs = Path(config["docs_dir"])
    root = docs.parent
    wanted: Dict[str, str] = {}
    for page in files.documentation_pages():
        for link, rel in _targets(page.src_uri, expand(Path(page.abs_src_path), Path(page.abs_src_path).read_text())).items():
            target = root / rel
            if rel.startswith("..") or not target.exists():
                log.warning("%s links to %s, which is not a file of the repository", page.src_uri, link)
            elif target.is_dir():
                log.warning("%s links to the folder %s: link a file in it (the site cannot list "
                            "a folder)", page.src_uri, link)
            else:
                wanted[rel] = str(target)
    for rel, path in sorted(wanted.items()):
        uri = f"{SITE_FOLDER}/{rel}"
        if uri not in files:
            files.append(RepoFile.generated(config, uri, abs_src_path=path))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    depth = posixpath.dirname(page.file.src_uri).count("/") + bool(posixpath.dirname(page.file.src_uri))

    def rewrite(match: "re.Match[str]") -> str:
        rel = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page.file.src_uri), match.group(1)))
        return f"]({'../' * depth}{SITE_FOLDER}/{rel}{match.group(2)})"

    return LINK.sub(rewrite, expand(Path(page.file.abs_src_path), markdown))
