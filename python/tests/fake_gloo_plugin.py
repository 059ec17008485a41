"""A stand-in third-party backend for checking python/tests/torch_suite.py.

Importing this module registers a torch.distributed backend named "fakegloo"
that is gloo under another name: its creator returns an ordinary
ProcessGroupGloo. Every test that torch_suite.py selects for a plugin backend
should pass against it; one that fails here points at the driver or at the
selection, not at a backend.

    python python/tests/torch_suite.py --backend fakegloo --module fake_gloo_plugin
"""

import torch.distributed as dist

NAME = "fakegloo"


def _create_fakegloo(dist_backend_opts, backend_options):
    # extended_api=True: torch passes a _DistributedBackendOptions (store,
    # group_rank, group_size, timeout, group_id, global_ranks_in_group) and the
    # user's backend options (None unless init_process_group got pg_options).
    return dist.ProcessGroupGloo(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        dist_backend_opts.timeout,
    )


if NAME not in dist.Backend.backend_list:
    dist.Backend.register_backend(
        NAME, _create_fakegloo, extended_api=True, devices=["cpu"]
    )
