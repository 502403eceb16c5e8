"""The serving store: a shard set's bits and tokens laid out for point reads, beside its Parquet part files.

- `layout`: the bucket file format (`store/part-NNNNN.sbits`) and `store/set.json`; no Arrow, no torch;
- `bitstore`: `BitStore`, opened once, many lookups, thread-safe, an optional DRAM cache;
- `writer`, `index`: bucket files written with their part files, or built from them (`sift index`);
- `check`: a store against its part files (`sift validate`).
"""
