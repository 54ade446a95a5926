"""Small helpers about this machine's processes, below every layer that starts or watches
them: whether a pid still runs (:mod:`.pids`), which cores a launched rank is pinned to
(:mod:`.affinity`), and ending a process with the one that started it (:mod:`.parent`)."""
