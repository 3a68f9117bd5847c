"""Stands for vllm.logger: init_logger returns a standard logging.Logger.

Adds the *_once helpers vLLM's logger has (they log every time here: the
de-duplication is cosmetic). Does not configure handlers or formats.
"""

import logging


class _Logger(logging.Logger):
    def info_once(self, msg, *args, **kwargs) -> None:
        kwargs.pop("scope", None)
        self.info(msg, *args, **kwargs)

    def warning_once(self, msg, *args, **kwargs) -> None:
        kwargs.pop("scope", None)
        self.warning(msg, *args, **kwargs)

    def debug_once(self, msg, *args, **kwargs) -> None:
        kwargs.pop("scope", None)
        self.debug(msg, *args, **kwargs)


def init_logger(name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.__class__ = _Logger
    return logger
