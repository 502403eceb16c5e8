"""Each family's tiny model (tests/families.py) in bf16: how far every-block sparse prefill (reference, flex, cuda)
is from the model's own eager forward, beside how far bf16 itself moves that forward (the same weights in fp32);
and sparse lists on flex against the reference, beside the reference's own bf16-to-fp32 change. One JSON row per
family and head dim (the family's own, and 64 for the cuda kernel).

    PYTHONPATH=. python experiments/families_rounding.py        # writes $OUT/families-rounding.json
    DEV=cpu FAM=mistral PYTHONPATH=. python experiments/families_rounding.py   # a CPU smoke run (no cuda rows)
"""
import copy, json, os, sys, torch
sys.path.insert(0, os.getcwd())
from tests.families import FAMILIES, family_model
from sift_cli.attention.backends import get_backend
from sift_cli.attention.flex import FlexBackend
from sift_cli.attention.cuda import CudaBackend
from sift_cli.attention.reference import ReferenceBackend
from sift_cli.attention.integration import prepare_plan, sparse_attention
from sift_cli.attention.swap import swapped_attention
from sift_cli.block_lists import dense_block_lists
from sift_cli.block_table import BlockTable
from sift_cli.model_features import features_of
from sift_cli.cuda.checks import random_block_lists
dev = torch.device(os.environ.get("DEV", "cuda"))
if os.environ.get("FAM"): FAMILIES = os.environ["FAM"].split(",")
out = []
def run(model, ids, backend, table, lists):
    with sparse_attention(model, prepare_plan(backend, table, lists)):
        return model(input_ids=ids, use_cache=False).logits.float()
def md(a, b): return float((a - b).abs().max())
with torch.inference_mode():
    for name in FAMILIES:
        for hd in (None, 64):
            rec = {"family": name, "head_dim": hd}
            try:
                m32 = family_model(name, seed=3, dtype=torch.float32, head_dim=hd).to(dev)
                m16 = copy.deepcopy(m32).to(torch.bfloat16)
                feats = features_of(m16)
                L = 301
                ids = torch.randint(0, 97, (1, L), generator=torch.Generator().manual_seed(0)).to(dev)
                with swapped_attention(m32, "eager"):
                    f32 = m32(input_ids=ids, use_cache=False).logits.float()
                with swapped_attention(m16, "eager"):
                    e16 = m16(input_ids=ids, use_cache=False).logits.float()
                rec["scale"] = float(f32.abs().max())
                rec["eager16_vs_fp32"] = md(e16, f32)
                table = BlockTable.causal(L, 64, 64, device=dev)
                dense = [dense_block_lists(table, feats.n_heads)] * feats.n_layers
                backs = [("reference", ReferenceBackend()), ("flex", FlexBackend())]
                if hd == 64 and CudaBackend.available()[0]:
                    try:
                        backs.append(("cuda", get_backend("cuda", dev, feats.for_length(L))))
                    except Exception as e:
                        rec["cuda_refused"] = str(e)[:120]
                for bn, b in backs:
                    s = run(m16, ids, b, table, dense)
                    rec[f"{bn}_dense_vs_eager16"] = md(s, e16)
                    rec[f"{bn}_dense_vs_fp32"] = md(s, f32)
                    rec[f"{bn}_first_eq"] = bool(s[0, -1].argmax() == e16[0, -1].argmax())
                # sparse lists, flex vs reference (bf16 model) and vs the fp32 model on reference
                L2 = 517
                t2 = BlockTable.causal(L2, 128, 64, device=dev)
                sl = [random_block_lists(t2, feats.n_heads, 0.4, seed=i) for i in range(feats.n_layers)]
                ids2 = torch.randint(3, 97, (1, L2), generator=torch.Generator().manual_seed(1)).to(dev)
                r16 = run(m16, ids2, ReferenceBackend(), t2, sl)
                r32 = run(m32, ids2, ReferenceBackend(), t2, sl)
                fx = run(m16, ids2, FlexBackend(), t2, sl)
                rec["sparse_scale"] = float(r32.abs().max())
                rec["sparse_ref16_vs_ref32"] = md(r16, r32)
                rec["sparse_flex_vs_ref16"] = md(fx, r16)
                rec["sparse_flex_vs_ref32"] = md(fx, r32)
            except Exception as e:
                rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            print(json.dumps(rec), flush=True)
            out.append(rec)
from sift_cli.lab.results import make_result, write_result  # noqa: E402

protocol = ("max |Δlogit| over all positions of a 301-token (dense) and a 517-token (sparse, 40 % of blocks) random "
            "prompt; fp32 rows: the same weights before the cast to bf16")
write_result(os.path.join(os.environ.get("OUT", "."), "families-rounding.json"), "families-rounding",
             make_result("families-rounding", out, protocol))
