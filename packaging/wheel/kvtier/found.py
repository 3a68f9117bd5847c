"""Where an engine distribution is installed on a sys.path, from its
metadata only (dist-info METADATA, RECORD, top_level.txt): the engine is
never imported, since importing vLLM loads torch and may fail before a patch.
"""

from __future__ import annotations

import importlib.metadata
import os


def _package_of(dist: importlib.metadata.Distribution, engine: str) -> str:
    """The top-level package the distribution installs: the engine's own
    name, unless top_level.txt names one other package only."""
    name = engine.replace("-", "_")
    top = (dist.read_text("top_level.txt") or "").split()
    return top[0] if len(top) == 1 and name not in top else name


def search(engine: str, path: list[str]) -> dict[str, list]:
    """{"found": [{root, version, dist_info}], "skipped": [reason]} for every
    distribution named `engine` on `path`: found ones hold the package's
    __init__.py in their RECORD and on disk beside the dist-info; the others
    (an editable install, a broken one) are skipped with the reason."""
    found: list[dict[str, str]] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for dist in importlib.metadata.distributions(name=engine, path=path):
        root = os.path.realpath(str(dist.locate_file("")))
        info = getattr(dist, "_path", None)
        info_name = os.path.basename(str(info)) if info else f"{engine} metadata"
        key = os.path.join(root, info_name)
        if key in seen:  # the same folder twice on sys.path
            continue
        seen.add(key)
        package = _package_of(dist, engine)
        init = f"{package}/__init__.py"
        recorded = {str(f) for f in dist.files or ()}
        where = os.path.join(root, info_name)
        if init not in recorded:
            skipped.append(
                f"{where}: its RECORD lists no {init} (an editable or broken install: "
                "pass the source tree as ROOT)"
            )
        elif not os.path.isfile(os.path.join(root, init)):
            skipped.append(
                f"{where}: RECORD lists {init}, but {root}/{init} is missing"
            )
        else:
            found.append({"root": root, "version": dist.version, "dist_info": where})
    return {"found": found, "skipped": skipped}
