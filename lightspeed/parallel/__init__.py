"""Tensor parallelism: a Llama-family model split across ranks on torch.distributed (gloo on CPUs).

``sharding`` says which rows and columns each rank keeps, ``comm`` runs the collectives, ``step`` compiles
one rank's segments between the all-reduces, ``launch`` starts local ranks (``--tensor-parallel N``)."""
from .comm import (CollectiveError, Communicator, GlooCommunicator, SharedMemoryCommunicator, SingleProcess,
                   distributed_env, join_group)
from .sharding import ShardedWeights, ShardPlan, TensorParallelError, even_ranges
from .step import TensorParallelStep, shard_model
