# SPDX-License-Identifier: Apache-2.0
"""The one error that turns the writer off on a rank."""


class WriterDisabled(RuntimeError):
    """The writer cannot run safely here; serving continues without it."""
