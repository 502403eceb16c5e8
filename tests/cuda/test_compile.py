"""CPU-side checks of the bundled CUDA kernels: every .cu compiles for sm_90a with nvcc (skipped without nvcc),
with no register spills and no serialised wgmma; host-side helpers behave without a GPU."""

import re
import subprocess

import pytest
import torch

from sift_cli.cuda import attention as cuda_attention
from sift_cli.cuda import runtime
from sift_cli.errors import SiftError
from tests.conftest import nvcc_path

ATTN_CONFIGS = [(d, bn, cuda_attention.default_stages(d, bn), pp) for d in (64, 128) for bn in (64, 128)
                for pp in (1, 0)]


def _nvcc(tmp_path, source, defines):
    nvcc = nvcc_path()
    if not nvcc:
        pytest.skip("nvcc not found")
    cubin = tmp_path / "k.cubin"
    cmd = [nvcc, "-gencode=arch=compute_90a,code=sm_90a", "--cubin", "-std=c++17", "-Xptxas", "-v",
           *[f"-D{k}={v}" for k, v in defines], "-o", str(cubin), str(runtime.kernel_dir() / source)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert cubin.stat().st_size > 0
    return proc.stderr


@pytest.mark.parametrize("head_dim,block_n,stages,pingpong", ATTN_CONFIGS)
def test_attention_kernel_compiles(tmp_path, head_dim, block_n, stages, pingpong):
    report = _nvcc(tmp_path, "sparse_attn_fwd.cu",
                   [("HEAD_DIM", head_dim), ("BLOCK_N", block_n), ("STAGES", stages), ("PINGPONG", pingpong)])
    assert "C7520" not in report, "ptxas serialised the wgmma pipeline:\n" + report  # a divergent-path regression
    assert "C7508" not in report, "ptxas ignored setmaxnreg:\n" + report
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert spills and all(s == ("0", "0") for s in spills), report
    assert "0 bytes stack frame" in report, report


def test_decode_kernel_compiles(tmp_path):
    report = _nvcc(tmp_path, "decode.cu", [])
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert len(spills) == 3 and all(s == ("0", "0") for s in spills), report


def test_shared_memory_fits_hopper():
    for d in (64, 128):
        for bn in (64, 128):
            assert cuda_attention.attention_smem_bytes(d, bn, cuda_attention.default_stages(d, bn)) <= 227 * 1024


def test_sources_found_and_self_contained():
    for name in ("sparse_attn_fwd.cu", "decode.cu"):
        src = runtime.kernel_source(name)
        assert not re.search(r"^\s*#\s*include", src, re.M)  # NVRTC needs no CUDA headers for these


def test_cpu_tensors_are_refused_clearly():
    from sift_cli.attention.cuda import CudaBackend
    from sift_cli.block_lists import dense_block_lists

    q = torch.zeros(2, 10, 64, dtype=torch.bfloat16)
    with pytest.raises(SiftError, match="CUDA device"):
        CudaBackend().forward(q, q[:1], q[:1], dense_block_lists(10, 2), 0.125)
    with pytest.raises(SiftError, match="head_dim"):
        cuda_attention.attention_kernel(96, 64, 0)


def test_flex_block_mask_matches_reference():
    """The flex backend's BlockMask states the same semantics as the reference (checked eagerly)."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    from sift_cli.attention.flex import block_mask_from_lists
    from sift_cli.attention.reference import block_sparse_attention
    from sift_cli.cuda.checks import random_block_lists

    torch.manual_seed(0)
    for L, bn in ((256, 64), (300, 128)):
        lay = random_block_lists(4, L, bn, 0.3, device="cpu")
        q, k, v = torch.randn(4, L, 32), torch.randn(2, L, 32), torch.randn(2, L, 32)
        out = flex.flex_attention(q[None], k[None], v[None], block_mask=block_mask_from_lists(lay, exact_mask_mod=True), scale=0.2,
                                  enable_gqa=True)[0]
        ref = block_sparse_attention(q, k, v, lay, 0.2)
        assert float((out - ref).norm() / ref.norm()) < 1e-5
