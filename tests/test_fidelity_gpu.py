"""The noise floor and the mass rule on the GPU with the bundled SmolLM2 in bf16 (what `sift prefill` serves)."""

import pytest
import torch

from sift_cli.config import ProfileConfig
from sift_cli.lab.datasets import write_jsonl
from sift_cli.models import load_model
from sift_cli.prefill.assemble import assemble
from sift_cli.prefill.options import PrefillOptions
from sift_cli.prefill.report import run_prefill
from sift_cli.profile.job import profile_corpus
from sift_cli.sample import sample_documents
from sift_cli.store.bitstore import BitStore

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def smol_bf16():
    return load_model(None, device="cuda", dtype="bfloat16")


@pytest.mark.parametrize("cfg", [ProfileConfig(), ProfileConfig(rule="mass", epsilon=0.02, ca_epsilon=0.05)],
                         ids=["paper", "mass"])
def test_bf16_prefill_reports_the_fp32_noise_floor(tmp_path, smol_bf16, cfg):
    docs = [{"id": name, "title": "", "text": text} for name, text in sample_documents()[:4]]
    profile_corpus(write_jsonl(docs, tmp_path / "c.jsonl"), tmp_path / "s", smol_bf16, cfg, num_shards=1)
    store = BitStore(tmp_path / "s")
    assert (store.meta.get("sift.rule") or "paper") == cfg.rule
    prompt = assemble(store, smol_bf16, [d["id"] for d in docs], "Which module sorts a heap?")
    before = {n: p.detach().clone() for n, p in smol_bf16.model.named_parameters()}
    r = run_prefill(smol_bf16, prompt, PrefillOptions(repeat=1, warmup=1, max_new_tokens=8))
    for n, p in smol_bf16.model.named_parameters():  # the fp32 reference left the served weights as they were
        assert p.dtype == torch.bfloat16 and torch.equal(p, before[n]), n
    floor = r["noise_floor"]
    assert floor["reference_dtype"] == "float32" and 0 < floor["kl"] < 0.05
    assert floor["verdict"] in ("within", "near", "above") and r["first_token_match"]
    print(f"{cfg.rule}: cells {r['density']['cells']:.3f} kl {r['kl']:.2e} floor {floor['kl']:.2e} "
          f"x{r['kl_over_noise']} {floor['verdict']}")
