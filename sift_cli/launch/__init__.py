"""Running `sift profile` as many workers: `ranks` (which worker this is: flags, torchrun, Slurm), `claims` (per-bucket
locks so two processes never write one shard), `worker` (one worker in this process), `local` (`--gpus N` local
processes) and `ray_tasks` (one Ray task per worker)."""
