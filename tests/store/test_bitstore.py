"""The serving store against brute-force reads of the Parquet shards: every id, across files and row groups; after
additions, concurrent writers and for skipped documents; damaged and stale files refused with one line; a lookup
reads its own record's bytes and the bucket's table, nothing else; threads; the DRAM cache's cap; no torch or
Arrow on the read path."""

import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from sift_cli.config import ProfileConfig
from sift_cli.corpus import Document
from sift_cli.errors import SiftError
from sift_cli.lab.bench.store_sets import build_synthetic_set, doc_id
from sift_cli.prefill.missing import profile_config_of
from sift_cli.profile.additions import add_documents
from sift_cli.profile.job import profile_corpus
from sift_cli.shards.files import list_parts
from sift_cli.shards.names import doc_key
from sift_cli.store.bitstore import BitStore
from sift_cli.store.index import bucket_state, index_set
from sift_cli.store.layout import RECORD, STORE_DIR, BucketView, bucket_file_name

ROOT = Path(__file__).resolve().parents[2]


def parquet_rows(directory: Path) -> dict:
    """Every row of every part file, read whole with pyarrow: the brute-force reference."""
    rows = {}
    for p in list_parts(directory):
        for r in pq.read_table(p, columns=["doc_id", "tokens", "la_bits", "ca_bits"]).to_pylist():
            rows[r["doc_id"]] = r
    return rows


def index_of(view: BucketView, doc_id: str) -> int:
    """The position of `doc_id`'s record in a bucket file (its key's, keys being distinct here)."""
    i = int(np.searchsorted(view.keys, np.uint64(doc_key(doc_id))))
    assert int(view.keys[i]) == doc_key(doc_id)
    return i


def assert_same(store: BitStore, rows: dict, ids) -> None:
    got = store.records(list(ids))
    assert set(got) == set(ids)
    for d in ids:
        r = rows[d]
        assert (got[d].tokens, got[d].la_bits, got[d].ca_bits) == (r["tokens"], r["la_bits"], r["ca_bits"]), d


@pytest.fixture(scope="module")
def big_set(tmp_path_factory):
    """2,600 synthetic SmolLM2-shaped documents in 2 buckets of ~1,300 rows: every part file has 2 row groups."""
    out = tmp_path_factory.mktemp("store") / "set"
    build_synthetic_set(out, 2600, "smollm2", docs_per_shard=1300, lengths=(1, 300), workers=2)
    return out


def test_every_lookup_equals_the_parquet_rows(big_set):
    assert all(pq.ParquetFile(p).num_row_groups == 2 for p in list_parts(big_set))
    rows = parquet_rows(big_set)
    store = BitStore(big_set)
    ids = [doc_id(i) for i in range(2600)]
    random.Random(0).shuffle(ids)
    assert_same(store, rows, ids)
    la, ca = store.bits(ids[:20])
    assert la == [rows[d]["la_bits"] for d in ids[:20]] and ca == [rows[d]["ca_bits"] for d in ids[:20]]
    assert store.count() == 2600 and "nope" not in store and store.missing(["nope", ids[0]]) == ["nope"]
    with pytest.raises(SiftError, match=r"'nope' is not in the shard set .* — .*sift ids"):
        store.bits([ids[0], "nope"])


def test_a_lookup_reads_its_record_and_the_table_only(big_set, tmp_path):
    """Every other record of the bucket zeroed: the lookup still finds and verifies its own; the bytes it reads are
    its record, the table once, and a few probes."""
    target = doc_id(7)
    copy = tmp_path / "set"
    copy.mkdir()
    for p in big_set.rglob("*"):
        if p.is_file():
            dest = copy / p.relative_to(big_set)
            dest.parent.mkdir(exist_ok=True)
            os.link(p, dest) if p.suffix == ".parquet" else dest.write_bytes(p.read_bytes())
    store = BitStore(copy)
    shard = doc_key(target) % store.num_shards
    path = copy / STORE_DIR / bucket_file_name(shard)
    data = bytearray(path.read_bytes())
    view = BucketView(bytes(data))
    i = index_of(view, target)
    first, end = int(view.offsets[0]), int(view.offsets[-1])
    keep = (int(view.offsets[i]), int(view.offsets[i + 1]))
    own = bytes(data[keep[0]:keep[1]])
    data[first:end] = bytes(end - first)
    data[keep[0]:keep[1]] = own
    path.write_bytes(data)
    expected = parquet_rows(big_set)[target]
    got = store.records([target])[target]
    assert (got.tokens, got.la_bits, got.ca_bits) == (expected["tokens"], expected["la_bits"], expected["ca_bits"])
    table = int(view.offsets[0])  # header, meta, keys and offsets: read once when the bucket is mapped
    assert store.stats.bytes_read <= table + 4096 + (keep[1] - keep[0]) + 16 * 64
    with pytest.raises(SiftError, match="record .* checksum mismatch .* `sift index .* --verify`"):
        store.records([doc_id(i) for i in range(2600) if doc_key(doc_id(i)) % store.num_shards == shard][:5])


@pytest.mark.parametrize("damage", ["record", "swapped", "header", "truncate", "stale", "missing"])
def test_damaged_or_stale_files_are_refused_with_one_line(big_set, tmp_path, damage):
    import shutil

    copy = tmp_path / "set"
    shutil.copytree(big_set, copy)
    path = copy / STORE_DIR / bucket_file_name(0)
    some = next(doc_id(i) for i in range(2600) if doc_key(doc_id(i)) % 2 == 0)
    data = bytearray(path.read_bytes())
    if damage == "record":
        view = BucketView(bytes(data))
        o = int(view.offsets[index_of(view, some)])
        data[o + RECORD.size + 40] ^= 0xFF
        path.write_bytes(data)
        expected = "record .* checksum mismatch"
    elif damage == "swapped":  # two whole records of equal size exchanged: each checksum holds, the keys do not
        view = BucketView(bytes(data))
        sizes = np.diff(view.offsets.astype(np.int64))
        i = index_of(view, some)
        j = next(j for j in range(view.n) if j != i and sizes[j] == sizes[i])
        a, b = (int(view.offsets[i]), int(view.offsets[i + 1])), (int(view.offsets[j]), int(view.offsets[j + 1]))
        data[a[0]:a[1]], data[b[0]:b[1]] = data[b[0]:b[1]], data[a[0]:a[1]]
        path.write_bytes(data)
        expected = "does not hold the document its key names"
    elif damage == "header":
        data[20] ^= 0x01
        path.write_bytes(data)
        expected = "header checksum mismatch"
    elif damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
        expected = "truncated"
    elif damage == "stale":  # the part file rewritten (another writer, another version) without its store file
        part = copy / "part-00000.parquet"
        pq.write_table(pq.read_table(part), part)
        expected = "stale: part-00000.parquet changed after it was built"
    else:
        path.unlink()
        expected = "missing, so part-00000.parquet's documents cannot be served"
    store = BitStore(copy)
    with pytest.raises(SiftError, match=expected) as err:
        store.records([some])
    assert "\n" not in str(err.value) and f"sift index {copy}" in str(err.value)
    verify = damage in ("record", "swapped", "header", "truncate")
    assert ("--verify" in str(err.value)) == verify
    assert bucket_state(copy / "part-00000.parquet", verify=True) is not None
    index_set(copy, verify=verify)  # the remedy it names
    assert bucket_state(copy / "part-00000.parquet") is None
    assert_same(BitStore(copy), parquet_rows(copy), [some])


def test_threads_see_the_same_records(big_set):
    rows = parquet_rows(big_set)
    store = BitStore(big_set, cache_bytes=200_000)
    errors = []

    def work(seed):
        try:
            rng = random.Random(seed)
            for _ in range(40):
                assert_same(store, rows, rng.sample(sorted(rows), 20))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert store.stats.lookups == 8 * 40 * 20 and store._cache_size <= 200_000 and store.stats.cache_hits > 0


def test_the_read_path_imports_neither_torch_nor_arrow(big_set):
    code = (f"import sys; from sift_cli.store.bitstore import BitStore; s = BitStore({str(big_set)!r}); "
            f"s.bits({[doc_id(i) for i in range(20)]!r}); "
            "assert not {'torch', 'pyarrow'} & set(sys.modules), sorted(m for m in sys.modules if 'arrow' in m "
            "or 'torch' in m)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_skipped_documents_and_additions(tmp_path, tiny_lm, small_corpus):
    (small_corpus / "empty.txt").write_text("  \n")
    (small_corpus / "huge.txt").write_text("zebra quartz " * 400)  # longer than the tiny model's context
    out = tmp_path / "set"
    profile_corpus(small_corpus, out, tiny_lm, ProfileConfig(tile=16), num_shards=2)
    store = BitStore(out)  # opened before the additions below: it must see them
    assert store.skip_reason("empty") == "empty document"
    assert store.skip_reason("huge").startswith("longer than the model's context")
    with pytest.raises(SiftError, match=r"'huge' was skipped when .* profiled: longer than"):
        store.get(["doc01", "huge"])
    assert_same(store, parquet_rows(out), [f"doc{i:02d}" for i in range(12)])

    docs = [Document(f"new{i}", f"Document {i}: " + "words about foxes and dogs " * (3 + i), f"new{i}")
            for i in range(4)]
    add_documents(out, docs, tiny_lm, profile_config_of(store, tiny_lm), store.prefix_token_ids)
    assert_same(store, parquet_rows(out), ["new0", "new1", "new2", "new3", "doc05"])
    assert all(bucket_state(p) is None for p in list_parts(out))


ADDER = """
import sys
from sift_cli.corpus import Document
from sift_cli.models import load_model
from sift_cli.prefill.missing import profile_config_of
from sift_cli.profile.additions import add_documents
from sift_cli.store.bitstore import BitStore
ckpt, out, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
lm = load_model(ckpt, device="cpu")
s = BitStore(out)
docs = [Document(n, f"Document {n}: " + " ".join(["words about foxes and dogs"] * (5 + len(n))), n) for n in names]
add_documents(out, docs, lm, profile_config_of(s, lm), s.prefix_token_ids)
"""


def test_concurrent_adders_keep_the_store_whole(tmp_path, tiny_ckpt, tiny_lm, small_corpus):
    out = tmp_path / "set"
    profile_corpus(small_corpus, out, tiny_lm, ProfileConfig(tile=16), num_shards=3)
    names = [[f"a{i}" for i in range(8)] + ["both"], [f"b{i}" for i in range(8)] + ["both"]]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", ADDER, str(tiny_ckpt), str(out), ",".join(n)], env=env,
                              stderr=subprocess.PIPE, text=True) for n in names]
    for p in procs:
        _, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr[-2000:]
    rows = parquet_rows(out)
    assert set(rows) == {f"doc{i:02d}" for i in range(12)} | set(names[0]) | set(names[1])
    assert_same(BitStore(out), rows, sorted(rows))
    assert all(bucket_state(p) is None for p in list_parts(out))
    assert json.loads((out / STORE_DIR / "set.json").read_text())["num_shards"] == 3


def test_validate_compares_the_store_with_the_parts(big_set, tmp_path):
    import shutil

    from sift_cli.shards.validate import validate_path

    copy = tmp_path / "set"
    shutil.copytree(big_set, copy)
    assert validate_path(copy, workers=2)["ok"]
    path = copy / STORE_DIR / bucket_file_name(1)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x10  # a record's byte: the header and table still check out
    path.write_bytes(data)
    (copy / STORE_DIR / bucket_file_name(9)).write_bytes(b"stray")
    problems = validate_path(copy, workers=1)["problems"]
    assert [p["code"] for p in problems] == ["store-content", "store-foreign"]
    assert problems[0]["file"] == f"{STORE_DIR}/{bucket_file_name(1)}" and "sift index" in problems[0]["message"]
    index_set(copy, rebuild=True)
    assert validate_path(copy)["ok"]
    (copy / STORE_DIR / bucket_file_name(0)).unlink()
    assert [p["code"] for p in validate_path(copy)["problems"]] == ["store-missing"]
