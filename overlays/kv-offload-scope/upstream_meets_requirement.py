# kv-offload-scope: upstream vLLM already meets this requirement (a superseded
# edit). The anchor is the upstream text itself, so this comment is never
# injected: while the text exists the edit is superseded, and once it is gone
# the anchor is gone too and the engine reports drift for a human to port.
