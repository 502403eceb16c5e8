"""The optional Ray launcher on a local Ray instance (CPU workers); skipped where ray is not installed."""

import filecmp

import pytest

ray = pytest.importorskip("ray")

from sift_cli.config import ProfileConfig  # noqa: E402
from sift_cli.profile.job import profile_corpus  # noqa: E402
from sift_cli.shards.files import list_parts  # noqa: E402


@pytest.mark.slow
@pytest.mark.heavy
def test_ray_workers_give_the_same_shards_as_one_process(tmp_path, tiny_lm, tiny_ckpt, small_corpus):
    from sift_cli.launch.ray_tasks import profile_with_ray

    clean, out = tmp_path / "clean", tmp_path / "ray"
    profile_corpus(small_corpus, clean, tiny_lm, ProfileConfig(tile=16, batch_tokens=2048), num_shards=4)
    summary = profile_with_ray(small_corpus, out, num_workers=2, num_shards=4, model=str(tiny_ckpt),
                               gpus_per_worker=0, device="cpu", config={"tile": 16, "batch_tokens": 2048},
                               init_kwargs={"num_cpus": 2, "include_dashboard": False, "log_to_driver": False})
    assert summary["manifest"] and summary["profiled"] == 12 and summary["shards_written"] == 4
    assert sorted(r["rank"] for r in summary["per_worker"]) == [0, 1]
    names = sorted(p.name for p in list_parts(clean))
    assert names == sorted(p.name for p in list_parts(out))
    for n in names:
        assert filecmp.cmp(clean / n, out / n, shallow=False), n
