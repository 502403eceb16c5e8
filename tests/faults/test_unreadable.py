"""An unreadable bucket is set aside, never overwritten, and the documents added to it one prompt at a time come
back when `sift profile` redoes it."""

from sift_cli.config import ProfileConfig
from sift_cli.corpus import Document
from sift_cli.profile.additions import add_documents
from sift_cli.profile.job import profile_corpus
from sift_cli.shards.format import part_name, shard_of
from sift_cli.shards.reader import ShardSet
from sift_cli.shards.validate import validate_path

CFG = ProfileConfig(tile=16)


def test_unreadable_bucket_is_set_aside_and_its_added_documents_recovered(tmp_path, tiny_lm, small_corpus):
    out = tmp_path / "set"
    profile_corpus(small_corpus, out, tiny_lm, CFG, num_shards=2)
    extra = Document("extra", "A document no corpus has, added with a prompt.", "t")
    add_documents(out, [extra], tiny_lm, CFG, ShardSet(out).prefix_token_ids)
    bits = ShardSet(out).get(["extra"])[0]
    part = out / part_name(shard_of("extra", 2))
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])  # damaged on disk

    report = profile_corpus(small_corpus, out, tiny_lm, CFG, num_shards=2)
    assert report.set_aside == [{"file": part.name, "aside": part.name + ".unreadable",
                                 "documents": report.set_aside[0]["documents"], "recovered": 1}]
    assert report.set_aside[0]["documents"] >= 1
    assert (out / (part.name + ".unreadable")).read_bytes() == data[: len(data) // 2]  # kept as it was
    again = ShardSet(out).get(["extra"])[0]
    assert (again.la_bits, again.ca_bits, again.tokens) == (bits.la_bits, bits.ca_bits, bits.tokens)
    assert validate_path(out)["ok"]
