"""Stands for vllm.multimodal.utils: multimodal inputs are not modelled.

Both helpers raise; requests built in tests carry no multimodal features.
"""


def get_mm_features_in_window(*args, **kwargs):
    raise NotImplementedError("vllm.multimodal.utils stub: no multimodal support")


def strip_covered_mm_data(*args, **kwargs):
    raise NotImplementedError("vllm.multimodal.utils stub: no multimodal support")
