"""`loraplex bench quant`'s measuring pieces: teacher-forced log-probs through the engine's own
paged cache equal transformers', KL and greedy agreement are what they say, and the held-out
stdlib files are never trained on."""

from __future__ import annotations

import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loraplex.bench._stdlib_llama import held_out_windows, stdlib_files  # noqa: E402
from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402
from loraplex.bench.quant import agree, mean_kl, sequence_logprobs  # noqa: E402
from loraplex.platform.engine import LLM  # noqa: E402


def test_sequence_logprobs_match_transformers(tmp_path) -> None:
    hf = save_tiny_model(tmp_path, "llama", seed=2, with_tokenizer=False)
    llm = LLM(str(tmp_path), max_loras=0, num_gpu_blocks=64, block_size=4)
    tokens = list(range(3, 50))
    got = sequence_logprobs(llm, tokens)
    with torch.no_grad():
        want = torch.log_softmax(hf(torch.tensor([tokens])).logits[0].float(), dim=-1)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    assert mean_kl([want], [got]) < 1e-6
    assert mean_kl([want], [want.flip(0)]) > 0.1


def test_agreement_and_held_out_split() -> None:
    assert agree([[1, 2, 3, 4]], [[1, 2, 0, 4]]) == 0.75
    train, held = stdlib_files()
    assert held and train and not set(held) & set(train)
    assert 8 < len(train) / len(held) < 12  # about one file in ten held out
    windows = held_out_windows(2, 64)
    assert len(windows) == 2 and all(len(w) == 64 and w[0] == 1 for w in windows)
