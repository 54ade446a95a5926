"""Process plumbing below every layer, so that the launcher, the loaders and the graph servers
share it: :mod:`.parent` ends a process with the one that started it."""
