"""`sift inspect`'s numbers and tile map."""

import shutil

import pytest

from sift_cli.config import ProfileConfig
from sift_cli.errors import SiftError
from sift_cli.profile.job import profile_corpus
from sift_cli.shards.format import part_name
from sift_cli.shards.inspection import draw_tile_map, inspect_shards, tile_map


def test_inspect_numbers(shard_dir, tiny_lm):
    s = inspect_shards(shard_dir)
    assert s["documents"] == 12 and s["n_layers"] == 2 and len(s["per_layer"]) == 2
    assert 0 < s["la_density"] <= 1 and 0 <= s["ca_density"] <= 1
    assert s["kv_cache_bytes_bf16"] == s["tokens"] * tiny_lm.kv_bytes_per_token()
    assert s["kv_to_metadata_ratio"] > 1
    for r in s["per_layer"]:
        assert r["la_min"] <= r["la_density"] <= r["la_max"]
    tm = tile_map(shard_dir, "doc03", 1, 2)
    assert len(tm["la"]) == tm["pages"] and all(tm["la"][r][r] == 1 for r in range(tm["pages"]))
    drawing = draw_tile_map(tm)
    assert drawing.splitlines()[1].strip().endswith("█")


def test_mixed_directory_is_refused(tmp_path, tiny_lm, small_corpus, shard_dir):
    other = tmp_path / "other"
    profile_corpus(small_corpus, other, tiny_lm, ProfileConfig(tile=32), num_shards=2)
    shutil.copy(other / part_name(0), shard_dir / "part-00005.parquet")
    with pytest.raises(SiftError, match="different model or settings"):
        inspect_shards(shard_dir)
