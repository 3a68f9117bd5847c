"""Stands for vllm.v1.utils: tensor_data needs real tensors, so it raises."""


def tensor_data(*args, **kwargs):
    raise NotImplementedError("vllm.v1.utils stub: tensor_data needs torch")
