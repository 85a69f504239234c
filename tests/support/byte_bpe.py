"""A real byte-level BPE tokenizer trained in memory (no downloads), whose vocabulary leaves
some multi-byte characters unmerged so they come out as one token per byte (partial UTF-8)."""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from loraplex.platform.tokenizing import DEFAULT_CHAT_TEMPLATE, ChatTemplate, ModelTokenizer

TRAINING_TEXT = ["hello world and the end", "héllo wörld again"]


def byte_level_tokenizer(vocab_size: int = 320) -> ModelTokenizer:
    """A GPT-2 style byte-level BPE; `<s>` is id 0 and `</s>` (end of sequence) id 1."""
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>", "</s>"],
    )
    t.train_from_iterator(TRAINING_TEXT * 20, trainer)
    return ModelTokenizer(
        tokenizer=t,
        template=ChatTemplate(DEFAULT_CHAT_TEMPLATE),
        eos_token="</s>",
        eos_token_ids=[1],
    )


def byte_tokens(tok: ModelTokenizer, text: str) -> list[int]:
    """The token ids of `text`, each checked to be a single byte that is not valid UTF-8 alone."""
    ids = tok.encode(text, add_special_tokens=False)
    for i in ids:
        raw = tok.token_bytes(i)
        assert len(raw) == 1 and raw[0] >= 0x80, (i, raw)
    return ids


class WindowOnlyDecoder:
    """A tokenizer seen only through `decode` (no byte table: the detokenizer's windowed
    path), counting the tokens it is handed."""

    def __init__(self, tok: ModelTokenizer) -> None:
        self.tok = tok
        self.decoded_tokens = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.decoded_tokens += len(ids)
        return self.tok.decode(ids, skip_special_tokens)


class CountingDecoder(WindowOnlyDecoder):
    """The whole tokenizer, its work counted (tokens handed to `decode`, tokens looked up in
    its byte table): the detokenizer's work, measured without a clock."""

    def token_bytes(self, token_id: int) -> bytes:
        self.decoded_tokens += 1
        return self.tok.token_bytes(token_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tok, name)


def lone_continuation_byte(tok: ModelTokenizer) -> int:
    """A token whose bytes are one UTF-8 continuation byte (never valid text alone)."""
    for tid in range(tok.vocab_size):
        raw = tok.token_bytes(tid)
        if len(raw) == 1 and 0x80 <= raw[0] < 0xC0:
            return tid
    raise AssertionError("the tokenizer has no lone continuation-byte token")
