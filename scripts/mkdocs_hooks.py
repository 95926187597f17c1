"""mkdocs hooks of the documentation site (mkdocs.yml ``hooks:``).

The pages are also read on their own (in the repository, on a code host), where a link such as
``[the test files](../tests/data/runs/README.md)`` opens that file. On the site such a file is
not a page, so mkdocs would report the link as broken; here a link that leaves ``docs/`` and
names a file or folder that exists in the repository becomes its path in code (``tests/data/runs/README.md``),
and one that names nothing in the repository is reported as a warning (so ``--strict`` fails).

``CHANGELOG.md`` lives at the repository's root (where keep-a-changelog readers look); the site
shows it as ``changelog.md``.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.plugins.priosim")
LINK = re.compile(r"(?<!!)\[([^\]\n]+)\]\(([^)\s#]+)(#[^)\s]*)?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _root(config) -> Path:
    return Path(config["docs_dir"]).resolve().parent


def on_files(files, config):
    changelog = _root(config) / "CHANGELOG.md"
    if changelog.is_file():
        # (its links name pages as seen from the root: docs/engines.md is engines.md here)
        text = changelog.read_text().replace("](docs/", "](")
        files.append(File.generated(config, "changelog.md", content=text))
    return files


def on_page_markdown(markdown: str, page, config, files):
    docs = Path(config["docs_dir"]).resolve()
    root = _root(config)
    src = page.file.src_uri
    here = (docs / src).parent if not page.file.generated_by else docs

    def repo_link(m: re.Match) -> str:
        text, target, anchor = m.group(1), m.group(2), m.group(3) or ""
        if re.match(r"[a-z]+:", target) or target.startswith("/"):
            return m.group(0)
        path = (here / target).resolve()
        if path.is_relative_to(docs):
            return m.group(0)  # a page or a file of the site: mkdocs checks it
        if not path.is_relative_to(root) or not path.exists():
            log.warning("%s: link to %s, which is not in the repository", src, target)
            return m.group(0)
        rel = path.relative_to(root).as_posix()
        return f"{text} (`{rel}`)" if text.strip("`") != rel else f"`{rel}`"

    # (links inside code blocks are text, not links)
    out, last = [], 0
    for fence in FENCE.finditer(markdown):
        out += [LINK.sub(repo_link, markdown[last:fence.start()]), fence.group(0)]
        last = fence.end()
    out.append(LINK.sub(repo_link, markdown[last:]))
    return "".join(out)
