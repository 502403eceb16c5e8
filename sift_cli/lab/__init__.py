"""The lab: the measurements beside the product. `eval` reproduces the paper's claims on a model and corpus, `bench`
measures speed, `datasets` finds the evaluation data, `plots` draws figures. It calls the library (`sift_cli`)
like any user would; the library never imports it, and it never imports the CLI."""
