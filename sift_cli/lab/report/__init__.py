"""The docs' current tables, rendered from committed results (`docs/results/*.json`): `published` says which table
comes from which result and command, `tables` renders each, `pages` writes them between the markers in docs/*.md
(`sift report`) or lists the ones that differ (`sift report --check`, tests/test_docs_tables.py)."""
