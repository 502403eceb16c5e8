"""What is on disk: a shard counts as done only when it is readable and complete; created files follow the umask;
`sift validate` checks the manifest's record of each file and flags files that are not the set's."""

import json
import os
import stat

import pyarrow.parquet as pq
import pytest

from sift_cli.config import ProfileConfig
from sift_cli.launch.claims import BucketClaims, lock_path
from sift_cli.profile.job import profile_corpus
from sift_cli.shards.format import MANIFEST, part_name
from sift_cli.shards.status import shard_status
from sift_cli.shards.validate import validate_path

from ..cli.test_cli import run


def test_status_on_a_truncated_shard(shard_dir, capsys):
    victim = shard_dir / part_name(1)
    victim.write_bytes(victim.read_bytes()[:-100])  # a finished file, cut short
    res = shard_status(shard_dir)
    assert res["done"] == 1 and res["missing"] == [1]
    assert [b["file"] for b in res["bad"]] == [part_name(1)] and "truncated" in res["bad"][0]["problem"]
    code, stdout, err = run(capsys, "status", shard_dir)
    assert code == 3 and "1/2 shards done" in stdout and part_name(1) in err and "re-run `sift profile`" in err
    code, stdout, _ = run(capsys, "status", shard_dir, "--json")
    assert code == 3 and json.loads(stdout)["bad"][0]["shard"] == 1
    code, _, err = run(capsys, "status", shard_dir, "--finalize")
    assert code == 2 and "not done" in err


def test_status_counts_a_file_of_another_bucket_as_not_done(shard_dir):
    (shard_dir / part_name(1)).unlink()
    os.link(shard_dir / part_name(0), shard_dir / part_name(1))  # the right name, another bucket's rows
    res = shard_status(shard_dir)
    assert res["missing"] == [1] and "says shard 0" in res["bad"][0]["problem"]


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_created_files_follow_the_umask(tmp_path, tiny_lm, small_corpus, umask, mode):
    old = os.umask(umask)
    try:
        out = tmp_path / "o"
        profile_corpus(small_corpus, out, tiny_lm, ProfileConfig(tile=16), num_shards=2)
        with BucketClaims(out)(5) as held:
            assert held and stat.S_IMODE(lock_path(out, 5).stat().st_mode) == mode
        claims = BucketClaims(out)
        claims.use_flock = False  # the O_EXCL fallback's lock file too
        with claims(6) as held:
            assert held and stat.S_IMODE(lock_path(out, 6, exclusive_file=True).stat().st_mode) == mode
    finally:
        os.umask(old)
    for name in (part_name(0), part_name(1), MANIFEST):
        assert stat.S_IMODE((out / name).stat().st_mode) == mode, name


def test_validate_checks_the_manifest_record_and_stray_files(shard_dir):
    assert validate_path(shard_dir)["ok"]
    (shard_dir / "notes.parquet").write_bytes((shard_dir / part_name(0)).read_bytes())
    problems = validate_path(shard_dir)["problems"]
    assert len(problems) == 1 and problems[0]["message"].startswith("notes.parquet: not a file of this shard set")
    assert problems[0]["code"] == "foreign-file" and problems[0]["file"] == "notes.parquet"
    (shard_dir / "notes.parquet").unlink()
    (shard_dir / "part-00007.parquet").write_bytes(b"")  # a shard index the set does not have
    assert any(p["message"].startswith("part-00007.parquet: not a file of this shard set") for p in
               validate_path(shard_dir)["problems"])
    (shard_dir / "part-00007.parquet").unlink()

    p = shard_dir / part_name(1)
    table = pq.read_table(p)
    pq.write_table(table, p, compression="none")  # same rows and metadata, another byte count
    problems = validate_path(shard_dir)["problems"]  # the manifest's record, and the store's copy of the bucket
    assert [p["code"] for p in problems] == ["store-stale", "manifest-files"]
    assert f"records {part_name(1)} as" in problems[1]["message"] and "--finalize" in problems[1]["message"]
    assert "changed after it was built" in problems[0]["message"] and "sift index" in problems[0]["message"]
