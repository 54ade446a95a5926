"""DistDGL: the machines of a run, their graph servers, DistGraph/PartitionedGraph, its loaders,
failures across machines and graph partitioning."""
