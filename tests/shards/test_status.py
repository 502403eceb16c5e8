"""`sift status` while workers run, and `--finalize`."""

import json

import pytest

from sift_cli.launch.claims import BucketClaims
from sift_cli.profile.job import profile_corpus
from sift_cli.shards.validate import validate_path

from ..cli.test_cli import run
from ..launch.workers import CFG, leftovers


@pytest.mark.slow
def test_status_shows_shards_in_progress_and_finalize_cleans_up(tmp_path, tiny_lm, small_corpus, capsys):
    out = tmp_path / "o"
    profile_corpus(small_corpus, out, tiny_lm, CFG, num_shards=4, only_shards={0, 1}, write_index=False)

    def status(*extra):
        code, stdout, _ = run(capsys, "status", out, "--json", *extra)
        return code, stdout

    with BucketClaims(out)(2) as mine:
        assert mine
        code, stdout = status()
        assert json.loads(stdout)["running"] == [2] and json.loads(stdout)["missing"] == [2, 3]
    (out / ".part-00003.parquet.zz.tmp").write_bytes(b"junk")
    profile_corpus(small_corpus, out, tiny_lm, CFG, only_shards={2, 3}, write_index=False)
    (out / ".part-00001.lock").write_text("{}")  # a lock file a killed worker left
    code, stdout = status("--finalize")
    assert code == 0 and json.loads(stdout)["manifest"]
    assert leftovers(out) == [] and validate_path(out)["ok"]
