# SPDX-License-Identifier: Apache-2.0
"""Which folder a rank writes: its namespace record and its TP rank."""

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from . import durable_io, store_perms
from .deps import fmt, init_logger
from .errors import WriterDisabled

if TYPE_CHECKING:
    from .worker_store import WorkerSettings

logger = init_logger(__name__)


def key_scheme(hash_algorithm: str, environ: Mapping[str, str] | None = None) -> dict:
    """How the store's keys (vLLM block hashes) are seeded, for the fenced record.

    vLLM 0.33.0 (kv_cache_utils.resolve_none_hash_seed) seeds NONE_HASH from
    PYTHONHASHSEED when set; otherwise sha256 variants use a fixed default
    and xxhash variants fresh random bytes per process. A store written under
    one scheme is a different namespace from any other, and restore refuses a
    per-process one (its keys never mean the same thing after a restart).
    """
    env = os.environ if environ is None else environ
    seed = env.get("PYTHONHASHSEED")
    if seed is not None:
        policy = f"PYTHONHASHSEED={seed}"
    elif hash_algorithm.startswith("xxhash"):
        policy = "per-process"
    else:
        policy = "default"
    return {"hash": hash_algorithm, "seed": policy}


def folder_model_name(model: str, served_name: str = "") -> str:
    """The readable model part of a rank's folder name (docs/FORMAT.md 2).

    The served model name when the operator chose one (``--served-model-name``),
    else the model as named: a hub id as it is, a local path by its last folder
    after normalising (``/srv/run/../models/llama8b`` -> ``llama8b``), so the
    folder reads the same however the path was spelled. Only a label: the
    fenced record (``model``, ``model_identity``) tells namespaces apart, and
    its hash is in the folder name too.
    """
    name = served_name if served_name and served_name != model else model
    if _is_path(name):
        name = os.path.basename(os.path.normpath(name)) or name
    return name


def _is_path(name: str) -> bool:
    """A local folder rather than a hub id (``org/name``)."""
    parts = name.split("/")
    return (
        name.startswith(("/", ".", "~"))
        or len(parts) > 2
        or ".." in parts
        or "." in parts
        or os.path.isdir(name)
    )


def open_namespace(
    root: str,
    model: str,
    rank: int,
    fenced: Mapping[str, Any],
    info: Mapping[str, Any],
) -> fmt.StoreLayout:
    """Write the record once, or check an existing one; raise WriterDisabled.

    ``model`` names the folder (folder_model_name); the identity is ``fenced``.

    The fenced part must match exactly; info fields may differ (they are
    diagnostics, such as keep-K or where the rank came from).
    """
    record = fmt.NamespaceRecord(fenced=dict(fenced), info=dict(info))
    ns = record.namespace_hash
    layout = fmt.StoreLayout.create(root, model, ns, rank)
    store_perms.make_dirs(root)
    try:
        existing = fmt.read_regular(layout.namespace_record, fmt.MAX_RECORD_BYTES)
    except FileNotFoundError:
        existing = None
    if existing is None:
        durable_io.write_file_durably(
            layout.namespace_record, [fmt.encode_namespace_record(record)]
        )
        return layout
    try:
        old = fmt.decode_namespace_record(existing)
    except fmt.FormatError as e:
        raise WriterDisabled(
            f"namespace record {layout.namespace_record} is unreadable: {e}"
        ) from e
    if fmt.canonical_json(dict(old.fenced)) != fmt.canonical_json(dict(fenced)):
        raise WriterDisabled(
            f"namespace record {layout.namespace_record} fences a different "
            "namespace (model, build, layout or format changed)"
        )
    return layout


def resolve_rank(
    config_rank: int, config_tp_size: int, tp: Callable[[], tuple[int, int]] | None
) -> tuple[int, str]:
    """The initialized TP rank, cross-checked with the connector config.

    Returns (rank, provenance); raises WriterDisabled on disagreement, so two
    ranks never share one directory.
    """
    if tp is None:
        return config_rank, "connector config (no TP group handle)"
    try:
        tp_rank, tp_size = tp()
    except (AssertionError, RuntimeError, ImportError) as e:  # no TP group yet
        reason = f"connector config (TP group unavailable: {e})"
        logger.info("KV store: rank from %s", reason)
        return config_rank, reason
    if tp_size != config_tp_size or config_rank % config_tp_size != tp_rank:
        raise WriterDisabled(
            f"TP rank {tp_rank}/{tp_size} disagrees with the connector config "
            f"(rank {config_rank}, TP size {config_tp_size})"
        )
    return tp_rank, "initialized TP group"


def state_abi(s: "WorkerSettings") -> dict[str, Any]:
    groups = []
    for g in s.groups:
        if g.kind != "state":
            continue
        layer = g.layers[0]
        groups.append(
            {
                "group": g.group,
                "mamba_type": s.mamba_types.get(g.group, ""),
                "layers": len(g.layers),
                "states": [
                    {"dtype": p.dtype, "shape": list(p.shape)} for p in layer.state
                ],
            }
        )
    return {"groups": groups}
