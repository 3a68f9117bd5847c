"""Interface pins as TOML: one file per overlay and release.

``anchors/<engine>-<version>/api/<overlay>.toml`` lists every vLLM name the
overlay's code relies on, as the scan found them in that release; ``overlay``
checks each against a tree before it writes (docs/OVERLAYS.md, "Interface
pins"). The text is generated: sorted, stable, one ``[[uses]]`` table a name.
"""

from __future__ import annotations

import json

from .walk import Use

FORMAT = 1
HEADER = """\
# Interface pins: every vLLM name {overlay}'s code relies on, found in
# {engine} {version} by `python3 -m apipins` (generated; do not edit by hand).
# `overlay plan`, `apply` and `check` verify each against the target tree
# before any write; docs/OVERLAYS.md, "Interface pins", says how to read one.
"""


def _q(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _list(xs: list[str]) -> str:
    return "[" + ", ".join(_q(x) for x in xs) + "]"


def render(
    overlay: str, engine: str, version: str, uses: list[tuple[Use, list[str]]]
) -> str:
    """uses: (use, its sites in this overlay), in any order."""
    out = [HEADER.format(overlay=overlay, engine=engine, version=version)]
    out.append(f"format = {FORMAT}")
    out.append(f"overlay = {_q(overlay)}")
    out.append(f"engine = {_q(engine)}")
    out.append(f"engine_version = {_q(version)}")
    for use, sites in sorted(uses, key=lambda u: _order(u[0])):
        out.append("")
        out.append("[[uses]]")
        out.append(f"kind = {_q(use.kind)}")
        if use.kind == "local":
            out.append(f"file = {_q(use.file)}")
            out.append(f"scope = {_q(use.scope)}")
            out.append(f"name = {_q(use.name)}")
        else:
            out.append(f"module = {_q(use.module)}")
            if use.name:
                out.append(f"name = {_q(use.name)}")
            if use.member:
                out.append(f"member = {_q(use.member)}")
        if use.is_:
            out.append(f"is = {_q(use.is_)}")
        if use.defined_in and use.defined_in != f"{use.module}.{use.name}":
            out.append(f"defined_in = {_q(use.defined_in)}")
        if not use.present:
            out.append("present = false")
        if use.type:
            out.append(f"type = {_q(use.type)}")
        if use.annotation:
            out.append(f"annotation = {_q(use.annotation)}")
        if use.params:
            out.append(f"params = {_list(use.params)}")
        if use.keywords:
            out.append(f"keywords = {_list(use.keywords)}")
        if use.signature is not None:
            out.append(f"signature = {_list(use.signature)}")
        if use.kind == "abstract":
            out.append(f"methods = {_list(use.methods)}")
        out.append(f"used_by = {_list(sorted(sites, key=_site_key))}")
    return "\n".join(out) + "\n"


def _order(u: Use) -> tuple:
    return (
        u.kind != "module",
        u.kind == "local",
        u.module or u.file,
        u.name,
        u.member,
        u.scope,
    )


def _site_key(site: str) -> tuple[str, int]:
    path, _, line = site.rpartition(":")
    return (path, int(line) if line.isdigit() else 0)


def split_by_overlay(uses: list[Use]) -> dict[str, list[tuple[Use, list[str]]]]:
    """Each use, under every overlay that has a site of it."""
    out: dict[str, list[tuple[Use, list[str]]]] = {}
    for u in uses:
        by: dict[str, list[str]] = {}
        for s in u.sites:
            overlay, _, rest = s.partition("/")
            by.setdefault(overlay, []).append(rest)
        for overlay, sites in by.items():
            out.setdefault(overlay, []).append((u, sites))
    return out
