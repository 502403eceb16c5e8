import pytest

from sift_cli.config import ProfileConfig
from sift_cli.profile.job import profile_corpus


@pytest.fixture
def shard_dir(tmp_path, tiny_lm, small_corpus):
    out = tmp_path / "shards"
    profile_corpus(small_corpus, out, tiny_lm, ProfileConfig(tile=16), num_shards=2)
    return out
