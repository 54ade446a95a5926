"""Data a rank iterates: id sharding, node/edge/graph loaders, heterographs, sampling
workers, sparse formats, layer-wise inference and loader validation."""
