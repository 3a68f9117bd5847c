# SPDX-License-Identifier: Apache-2.0
"""The writer's two errors: one a layout or binding problem, one the boot refusal."""


class WriterDisabled(RuntimeError):
    """The writer cannot run safely here (a layout it cannot describe, a vLLM
    object without what it needs, an unsafe store folder, ...)."""


class StoreRefused(RuntimeError):
    """GLM53_KV_OFFLOAD=1 asked for the tier and this rank cannot run it: the
    worker's boot fails with this one line rather than serve without the tier."""

    def __init__(self, reason: str):
        super().__init__(
            f"KV store: GLM53_KV_OFFLOAD=1 is refused on this rank: {reason}"
        )
        self.reason = reason
