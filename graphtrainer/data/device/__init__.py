"""Neighbour sampling in plain torch ops on the rank's device (``Trainer(sampling="device")``).

- :mod:`.graph`: the graph's CSC structure and the node data loaders gather, copied to the
  device once per rank;
- :mod:`.neighbors`: one layer of uniform in-edge sampling (without replacement, with
  replacement, all), with edges excluded;
- :mod:`.compact`: sampled edges into DGL's block layout (destinations first), as torch blocks;
- :mod:`.sampler`: DGL's samplers read into settings, and whole batches of blocks;
- :mod:`.edges`: link-prediction batches (pair graphs, uniform negatives, exclusion);
- :mod:`.mode`: whether a loader samples on the device (``"auto"``, ``"device"``, ``"cpu"``).
"""
