"""Pipeline parallelism: partitioning, transports (TCP mesh, MPI), the process group and the
coordinator. Stages live in rlx.stages (exported as rlx.PipelineStage / rlx.PipelineDecodeStage)."""

from rlx.distributed.coordinator import PipelineCoordinator, ProcessGroup
from rlx.distributed.partition import (
                                      BlockSpec,
                                      Role,
                                      block_role,
                                      block_weight_filter,
                                      head_layers,
                                      pipeline_layer_range,
)
from rlx.distributed.transport import MpiTransport, TcpTransport, Transport, free_loopback_addrs

__all__ = [
    "BlockSpec",
    "Role",
    "block_role",
    "block_weight_filter",
    "head_layers",
    "pipeline_layer_range",
    "ProcessGroup",
    "PipelineCoordinator",
    "Transport",
    "TcpTransport",
    "MpiTransport",
    "free_loopback_addrs",
]
