"""`sift status` while workers run, and `--finalize`."""

import json
import sys

import pytest

from sift_cli.launch.claims import BucketClaims
from sift_cli.profile.job import profile_corpus
from sift_cli.shards.validate import validate_path

from ..launch.workers import CFG, leftovers


@pytest.mark.slow
def test_status_shows_shards_in_progress_and_finalize_cleans_up(tmp_path, tiny_lm, small_corpus, capsys):
    from sift_cli.cli import main

    out = tmp_path / "o"
    profile_corpus(small_corpus, out, tiny_lm, CFG, num_shards=4, only_shards={0, 1}, write_index=False)

    def status(*extra):
        old, sys.argv = sys.argv, ["sift", "status", str(out), "--json", *extra]
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        finally:
            sys.argv = old
        return code, capsys.readouterr()

    with BucketClaims(out)(2) as mine:
        assert mine
        code, cap = status()
        assert json.loads(cap.out)["running"] == [2] and json.loads(cap.out)["missing"] == [2, 3]
    (out / ".part-00003.parquet.zz.tmp").write_bytes(b"junk")
    profile_corpus(small_corpus, out, tiny_lm, CFG, only_shards={2, 3}, write_index=False)
    (out / ".part-00001.lock").write_text("{}")  # a lock file a killed worker left
    code, cap = status("--finalize")
    assert code == 0 and json.loads(cap.out)["manifest"]
    assert leftovers(out) == [] and validate_path(out)["ok"]
