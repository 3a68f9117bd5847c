"""Runs real (pristine or patched) engine code in-process; see README.md."""

from . import release
from .loader import STUBS_DIR, Engine, engine
from .pins import Pin, module_name, read_pins, split_pin_dir

__all__ = [
    "STUBS_DIR",
    "Engine",
    "Pin",
    "engine",
    "module_name",
    "read_pins",
    "release",
    "split_pin_dir",
]
