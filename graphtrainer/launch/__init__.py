"""Starting and watching ranks: local processes (fork, spawn, forkserver), ranks that already
exist (torchrun, Slurm), the supervisor, fork safety, the fork server, the shared graph,
threads and memory per rank."""
