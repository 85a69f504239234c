"""The engine step's detokenizing stays linear (issue 22, item 4): a request steered to 8k lone
UTF-8 continuation bytes (a tenant's adapter can do that) costs the shared step a bounded
window per token, counted in tokens handed to the tokenizer's `decode`, not in seconds."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.byte_bpe import CountingDecoder, byte_level_tokenizer, lone_continuation_byte

from loraplex.bench._synthetic.models import save_random_model
from loraplex.platform.engine.llm import LLM
from loraplex.platform.engine.sampling_params import SamplingParams

N_TOKENS = 8192

pytestmark = pytest.mark.timeout(300)


def test_8k_lone_bytes_through_the_engine_step_cost_linear_work(tmp_path: Path) -> None:
    tok = byte_level_tokenizer()
    save_random_model(tmp_path, "llama", seed=3, vocab_size=tok.vocab_size, hidden_size=32,
                      intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=N_TOKENS + 64)  # fmt: skip
    llm = LLM(str(tmp_path), dtype="float32", max_model_len=N_TOKENS + 32)
    counting = CountingDecoder(tok)
    llm.core.tokenizer = counting  # what the step's detokenizers are built on
    cont = lone_continuation_byte(tok)
    params = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, ignore_eos=True,
                            logit_bias={cont: 100.0})  # fmt: skip
    out = llm.generate([[5, 6, 7]], params)[0].outputs[0]
    assert out.token_ids == [cont] * N_TOKENS
    assert out.text == tok.decode([cont] * N_TOKENS)  # every byte shown, none lost
    # Linear: a bounded window per token (quadratic would be ~N^2/2 = 33M tokens decoded).
    assert 0 < counting.decoded_tokens <= 64 * N_TOKENS, counting.decoded_tokens
