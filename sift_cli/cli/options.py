"""Options several commands share, defined once."""

import typer

ModelOpt = typer.Option(None, "--model", help="HF model id (offline cache), local directory or .gguf file; "
                                              "default: the bundled SmolLM2-135M-Instruct GGUF")
DeviceOpt = typer.Option("auto", "--device", help="cpu, cuda, cuda:N or auto")
DtypeOpt = typer.Option("auto", "--dtype", help="model dtype: auto (bf16 on GPU, fp32 on CPU), float32, bfloat16")
JsonOpt = typer.Option(False, "--json", help="print one JSON object on stdout")
TrustOpt = typer.Option(False, "--trust-remote-code", help="allow model code from the checkpoint (off by default)")
OnlineOpt = typer.Option(False, "--online", help="allow downloading the model from the Hugging Face Hub")
PlotOpt = typer.Option(None, "--plot", help="write a figure to this .png (needs matplotlib)")
DataOpt = typer.Option(None, "--data-dir", help="folder with nq-open-oracle.jsonl.gz and paul-graham-essays/ "
                                                "(default: $SIFT_DATA_DIR or ../shared/data)")
WorkOpt = typer.Option(None, "--work", help="work directory for the profiled documents (default: under the sift cache)")
ThreadsOpt = typer.Option(0, "--threads", help="CPU threads for torch (0: torch's default; 1 is faster on a busy "
                                               "machine)")
BackendOpt = typer.Option("auto", "--backend", help="auto, reference, flex or cuda")
# the thresholds and block sizes of the evaluations that profile their own documents
TileOpt = typer.Option(64, "--tile")
AlphaOpt = typer.Option(1e-3, "--alpha")
BetaOpt = typer.Option(1e-2, "--beta")
GammaOpt = typer.Option(0.10, "--gamma")
BlockMOpt = typer.Option(128, "--block-m")
BlockNOpt = typer.Option(64, "--block-n")
SeedOpt = typer.Option(0, "--seed")
TilesOpt = typer.Option("32,64", "--tiles")  # the tile sizes a grid of thresholds tries
# how a corpus's records read (`sift profile`, and `sift calibrate`, which samples the corpus you will profile)
IdFieldOpt = typer.Option("id", "--id-field", help="JSONL/Parquet id field")
TextFieldOpt = typer.Option("text", "--text-field", help="JSONL/Parquet text field")
TitleFieldOpt = typer.Option("title", "--title-field", help="JSONL/Parquet title field (optional)")
TemplateOpt = typer.Option(None, "--template", help="document template with {title}, {text}, {id}; default "
                                                    "'Title: {title}\\n{text}\\n\\n'")
