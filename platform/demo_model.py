"""A small random-weight Llama-architecture model in the HuggingFace layout, made offline.

`loraplex up` registers it by default so the platform has a base model to serve and to
validate adapters against without downloading anything. Same seed, same files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HIDDEN = 256
LAYERS = 4
HEADS = 8
KV_HEADS = 4
INTERMEDIATE = 688
TARGET_VOCAB = 1000
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2 as in Llama
INIT_STD = 0.02

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# Our own small corpus, so the byte-level BPE merges are the same on every machine.
CORPUS = """\
The library opens at nine in the morning and closes at six in the evening.
Every visitor signs the book by the door, then walks past the long tables to the shelves.
On rainy days the reading room is full, and the only sound is the turning of pages.
A good question is worth more than a quick answer; a careful answer is worth the wait.
The train left the station on time, crossed the river, and climbed slowly into the hills.
Farmers in the valley grow apples, pears, barley and potatoes, and they sell them at the market.
She wrote the letter twice, because the first draft said too much and the second said too little.
The children counted the stars: one, two, three, four, five, six, seven, eight, nine, ten.
Water boils at one hundred degrees at sea level, and at a lower temperature on a high mountain.
He fixed the old bicycle with a new chain, two tyres, and a bell that rang like a small bird.
Numbers such as 12, 345, 2026 and 3.14 appear in tables, recipes, maps and timetables.
Hello! How are you today? I am fine, thank you. What would you like to talk about?
Please summarise the report in three sentences and list the main risks it mentions.
The model reads the prompt, predicts the next token, appends it, and repeats until it stops.
A server handles many requests at once; it batches them so that each step does more work.
Clouds gathered over the harbour, the wind turned cold, and the fishing boats came home early.
The museum shows paintings, maps, clocks, coins and a very old wooden boat found in the mud.
When the bakery opens, the smell of fresh bread drifts down the street and wakes the neighbours.
Learning to play the piano takes patience: scales in the morning, songs in the afternoon.
The committee met on Tuesday, discussed the budget, and agreed to meet again next month.
Her garden has roses along the wall, herbs by the kitchen door, and a lemon tree in a pot.
In winter the lake freezes, and people skate on it from the village to the island and back.
The recipe needs two eggs, a cup of flour, half a cup of milk, sugar, butter and a pinch of salt.
Our team reviewed the code, wrote tests for the edge cases, and shipped the fix on Friday.
The old map marked a path through the forest, over a bridge, and up to a tower on the cliff.
Questions and answers, stories and lists, letters and notes: all of them are made of words.
The weather report says sunny skies tomorrow, light winds from the west, and a warm afternoon.
If the light is red, wait; if it is green, cross the road; if it is yellow, slow down and look.
The student asked why the sky is blue, and the teacher drew a diagram of light and air.
They planted trees along the river so that the banks would hold during the spring floods.
"""


def _corpus_lines() -> list[str]:
    lines = [line for line in CORPUS.splitlines() if line.strip()]
    # Lower-case and title-case variants widen the merges without new source text.
    return lines + [line.lower() for line in lines] + [line.upper() for line in lines[:10]]


def build_tokenizer(vocab_size: int = TARGET_VOCAB) -> Tokenizer:
    """A byte-level BPE tokenizer trained on the built-in corpus; adds `<s>` in front."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus_lines(), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
            ),
        ]
    )
    return tok


def llama_config(vocab_size: int) -> dict[str, Any]:
    """The HuggingFace `config.json` of the demo model."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "initializer_range": INIT_STD,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": vocab_size,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }


def llama_weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Random weights under HuggingFace Llama parameter names, initialised like HF does
    (normal(0, initializer_range) for matrices and embeddings, ones for RMSNorm)."""
    gen = torch.Generator().manual_seed(seed)
    hidden = int(config["hidden_size"])
    inter = int(config["intermediate_size"])
    vocab = int(config["vocab_size"])
    head_dim = int(config["head_dim"])
    q_out = int(config["num_attention_heads"]) * head_dim
    kv_out = int(config["num_key_value_heads"]) * head_dim
    std = float(config["initializer_range"])

    def normal(*shape: int) -> torch.Tensor:
        return torch.empty(*shape).normal_(0.0, std, generator=gen)

    tensors: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(vocab, hidden)}
    for i in range(int(config["num_hidden_layers"])):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = normal(q_out, hidden)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv_out, hidden)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv_out, hidden)
        tensors[p + "self_attn.o_proj.weight"] = normal(hidden, q_out)
        tensors[p + "mlp.gate_proj.weight"] = normal(inter, hidden)
        tensors[p + "mlp.up_proj.weight"] = normal(inter, hidden)
        tensors[p + "mlp.down_proj.weight"] = normal(hidden, inter)
        tensors[p + "input_layernorm.weight"] = torch.ones(hidden)
        tensors[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
    tensors["model.norm.weight"] = torch.ones(hidden)
    tensors["lm_head.weight"] = normal(vocab, hidden)
    return tensors


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def make_demo_model(out_dir: str | Path, seed: int = 0) -> Path:
    """Write the demo model (config, safetensors weights, tokenizer) to `out_dir`; return it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    vocab_size = tok.get_vocab_size()
    config = llama_config(vocab_size)
    tok.save(str(out / "tokenizer.json"))
    save_file(
        llama_weights(config, seed), str(out / "model.safetensors"), metadata={"format": "pt"}
    )
    _write_json(out / "config.json", config)
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False, "max_new_tokens": 64},
    )
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "add_bos_token": True,
            "add_eos_token": False,
            "model_max_length": 2048,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _write_json(
        out / "special_tokens_map.json",
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    )
    return out
