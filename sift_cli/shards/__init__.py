"""Shard sets (SPEC §5): `format` (schema, metadata, names), `files` (atomic writer, part files, manifest),
`reader` (`ShardSet`: documents by id), `validate` (`sift validate`), `inspection` (`sift inspect`) and `status`
(`sift status`)."""
