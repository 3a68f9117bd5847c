"""Stands for vllm.distributed.parallel_state: no process groups exist.

Calling a group getter raises: code that needs torch.distributed is not run
by the harness.
"""


def _no_groups(*args, **kwargs):
    raise RuntimeError("vllm.distributed.parallel_state stub: no process groups")


get_world_group = get_inner_dp_world_group = get_tp_group = _no_groups
# vLLM 0.34.0's TieringOffloadingSpec asks these whether workers span nodes.
get_pp_group = get_pcp_group = in_the_same_node_as = _no_groups
