"""Small helpers about this machine's processes, below every layer that starts or watches
them: whether a pid still runs (:mod:`.pids`) and which cores a launched rank is pinned to
(:mod:`.affinity`)."""
