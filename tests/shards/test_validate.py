import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sift_cli.errors import SiftError
from sift_cli.shards.files import list_parts
from sift_cli.shards.manifest import write_manifest
from sift_cli.shards.format import MANIFEST, decode_metadata, encode_metadata, part_name
from sift_cli.shards.reader import ShardSet
from sift_cli.shards.validate import validate_path


def rewrite(path, change_table=None, change_meta=None):
    table = pq.read_table(path)
    meta = decode_metadata(table.schema.metadata)
    if change_table:
        table = change_table(table)
    if change_meta:
        change_meta(meta)
    pq.write_table(table.replace_schema_metadata(encode_metadata(meta)), path, compression="zstd")


def set_cell(table, column, row, value):
    values = table.column(column).to_pylist()
    values[row] = value
    idx = table.schema.get_field_index(column)
    return table.set_column(idx, table.schema.field(idx), pa.array(values, table.schema.field(idx).type))


def test_clean_set_validates(shard_dir):
    r = validate_path(shard_dir)
    assert r["ok"] and r["documents"] == 12 and r["problems"] == []
    assert validate_path(list_parts(shard_dir)[0])["ok"]


@pytest.mark.parametrize("damage,message", [
    (lambda t: set_cell(t, "la_bits", 0, b"\x00"), "la_bits has 1 bytes"),
    (lambda t: set_cell(t, "ca_bits", 0, b""), "ca_bits has 0 bytes"),
    (lambda t: set_cell(t, "token_sha256", 0, "0" * 64), "token_sha256 does not match"),
    (lambda t: set_cell(t, "n_tokens", 0, 3), "n_tokens 3 but"),
    (lambda t: t.take(list(range(t.num_rows))[::-1]), "not sorted"),
])
def test_damaged_rows_are_reported(shard_dir, damage, message):
    rewrite(shard_dir / part_name(0), damage)
    r = validate_path(shard_dir)
    assert not r["ok"] and any(message in p["message"] for p in r["problems"]), r["problems"]


def test_diagonal_and_padding_bits_are_checked(shard_dir):
    def clear_first_byte(t):
        la = t.column("la_bits").to_pylist()[0]
        return set_cell(t, "la_bits", 0, b"\x00" + la[1:])

    rewrite(shard_dir / part_name(0), clear_first_byte)
    assert any("diagonal" in p["message"] for p in validate_path(shard_dir)["problems"])


def test_duplicates_mixed_metadata_and_manifest(shard_dir):
    a, b = shard_dir / part_name(0), shard_dir / part_name(1)
    rewrite(b, lambda t: pa.concat_tables([t, pq.read_table(a).slice(0, 1).replace_schema_metadata(t.schema.metadata)])
            .sort_by("doc_id"))
    problems = validate_path(shard_dir)["problems"]
    assert any("duplicate doc_id" in p["message"] for p in problems)
    assert any("manifest" in p["message"] for p in problems)
    rewrite(b, change_meta=lambda m: m.update({"sift.tile_size": 32}))
    assert any("sift.tile_size differs" in p["message"] for p in validate_path(shard_dir)["problems"])


def test_truncated_and_missing_files(shard_dir):
    p = shard_dir / part_name(1)
    p.write_bytes(p.read_bytes()[:100])
    problems = validate_path(shard_dir)["problems"]
    assert any("not a readable Parquet" in q["message"] for q in problems)
    p.unlink()
    problems = validate_path(shard_dir)["problems"]
    assert any("1 of 2 shards missing" in q["message"] for q in problems)
    (shard_dir / MANIFEST).unlink()
    assert any("manifest.parquet missing" in q["message"] for q in validate_path(shard_dir)["problems"])


def test_manifest_lookup_and_rebuild(shard_dir):
    s = ShardSet(shard_dir)
    assert sorted(s.doc_ids()) == [f"doc{i:02d}" for i in range(12)]
    with pytest.raises(SiftError, match="not in the shard set"):
        s.get(["doc99"])
    (shard_dir / MANIFEST).unlink()
    with pytest.raises(SiftError, match="no manifest"):
        ShardSet(shard_dir)
    write_manifest(shard_dir)
    assert validate_path(shard_dir)["ok"]


def test_problems_carry_a_code_the_file_the_document_and_the_row(shard_dir):
    rewrite(shard_dir / part_name(0), lambda t: set_cell(t, "token_sha256", 1, "0" * 64))
    bad = [p for p in validate_path(shard_dir)["problems"] if p["code"] == "token-hash"]
    doc = pq.read_table(shard_dir / part_name(0)).column("doc_id")[1].as_py()
    assert bad == [{"code": "token-hash", "file": part_name(0), "doc_id": doc, "row": 1,
                    "message": f"{part_name(0)} row 1 ({doc!r}): token_sha256 does not match the token ids"}]
