"""Neighbour sampling in plain torch ops on the rank's device (``Trainer(sampling="device")``).

:mod:`.graph` (CSC structure and gathered data, on the device once per rank), :mod:`.neighbors`
(one layer of uniform in-edge sampling), :mod:`.compact` (DGL's block layout), :mod:`.sampler`
(whole batches; DGL's samplers read into settings), :mod:`.edges` (link-prediction batches),
:mod:`.mode` (whether a loader samples on the device).
"""
