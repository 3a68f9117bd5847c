# SPDX-License-Identifier: Apache-2.0
"""Config-side adapter: knob 1 without the offloading connector fails the boot.

Every other hook of ours lives in the offloading connector's modules, which an
engine loads only when its ``kv_transfer_config`` names that connector. An
engine started by hand with ``GLM53_KV_OFFLOAD=1`` and no such config would
load none of them and serve with no tier and no word. The hook at the end of
``VllmConfig.__post_init__`` calls ``require_connector``, which refuses that
config before any model is loaded (docs/DEPLOY.md, "Knob 1 means the tier").
"""

from typing import TYPE_CHECKING

from .deps import knobs
from .errors import StoreRefused

if TYPE_CHECKING:
    from vllm.config.kv_transfer import KVTransferConfig

CONNECTOR = "OffloadingConnector"
HOW = (
    "start it as `launch.sh plan` writes it (docs/DEPLOY.md), or unset "
    "GLM53_KV_OFFLOAD to serve without the tier"
)


def connector_problem(kv_transfer_config: "KVTransferConfig | None") -> str | None:
    """Why this config would serve without the disk tier, or None."""
    if kv_transfer_config is None or kv_transfer_config.kv_connector is None:
        return f"the engine has no --kv-transfer-config, so no {CONNECTOR} loads"
    name = kv_transfer_config.kv_connector
    if name != CONNECTOR:
        # MultiConnector included: the tier runs only as the one connector
        # (a nested one is not tested, so it is not served).
        return f"the engine's KV connector is {name}, not {CONNECTOR}"
    return None


def require_connector(kv_transfer_config: "KVTransferConfig | None") -> None:
    """Raise StoreRefused when knob 1 would serve without the tier.

    The knob is read by its rule (a bad value raises KnobError); with it
    unset or 0 any config passes.
    """
    if not knobs.tier_enabled():
        return
    problem = connector_problem(kv_transfer_config)
    if problem is not None:
        raise StoreRefused(f"{problem}; {HOW}")
