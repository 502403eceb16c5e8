"""Which worker a process is: rank detection from flags, torchrun and Slurm, and the buckets a rank owns."""

import pytest

from sift_cli.errors import SiftError
from sift_cli.launch.ranks import detect_rank, owned_shards


@pytest.mark.parametrize("env,expected", [
    ({}, (0, 1, None, "single")),
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, (3, 8, 1, "torchrun")),
    ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "10", "SLURM_ARRAY_TASK_MIN": "0"},
     (4, 10, None, "slurm-array")),
    ({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "1",
      "SLURM_ARRAY_TASK_STEP": "2"}, (3, 4, None, "slurm-array")),
    ({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "2", "SLURM_LOCALID": "2",
      "SLURM_NTASKS": "4"}, (2, 4, 2, "slurm-srun")),
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_STEP_ID": "0",
      "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "1"}, (3, 6, 1, "slurm-array+srun")),
    # a batch script's own shell (no srun step) is one worker even in a 4-task allocation: nothing left out
    ({"SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_JOB_ID": "1"}, (0, 1, None, "single")),
    # torchrun wins over Slurm (torchrun started inside an allocation)
    ({"RANK": "1", "WORLD_SIZE": "2", "SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "9"},
     (1, 2, None, "torchrun")),
])
def test_rank_from_environment(env, expected):
    w = detect_rank(env=env)
    assert (w.rank, w.world_size, w.local_rank, w.source) == expected

def test_rank_flags_win_and_are_checked():
    w = detect_rank(2, 3, env={"RANK": "0", "WORLD_SIZE": "8"})
    assert (w.rank, w.world_size, w.source) == (2, 3, "flags")
    for bad in ((3, 3), (-1, 2), (0, 0)):
        with pytest.raises(SiftError, match="rank"):
            detect_rank(*bad, env={})
    with pytest.raises(SiftError, match="go together"):
        detect_rank(1, None, env={})
    with pytest.raises(SiftError, match="does not map"):
        detect_rank(env={"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "1",
                         "SLURM_ARRAY_TASK_STEP": "2"})
    with pytest.raises(SiftError, match="not an integer"):
        detect_rank(env={"RANK": "x", "WORLD_SIZE": "2"})

def test_owned_shards_partition_the_buckets():
    parts = [owned_shards(10, r, 3) for r in range(3)]
    assert set().union(*parts) == set(range(10)) and sum(map(len, parts)) == 10
    assert parts[1] == {1, 4, 7}
