"""Prints, as one JSON line, the traces of the named scenarios on the engine found on the path.

    python tests/realsched/realsched_trace.py prefix reload evict

The tests run it with no path added, i.e. on the venv's pristine vLLM, to compare with the
patched tree they run in-process.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import realsched  # noqa: E402

try:
    traces = {name: realsched.run_scenario(name)[2] for name in sys.argv[1:]}
finally:
    realsched.shut_down_booted()  # its log lines go to stdout too: print after them
print(json.dumps(traces))
