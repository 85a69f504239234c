"""Text <-> tokens, one package for the engine and the gateway (torch-free).

- `loading.py`: a model folder's tokenizer (`tokenizer.json` through `tokenizers`), its
  special tokens and end-of-sequence ids, and its chat template (`ModelTokenizer`).
- `chat_template.py`: where a model's template comes from (ONE precedence) and the ONE
  sandboxed Jinja environment every template renders in.
- `detokenizer.py`: incremental detokenization with stop strings (partial characters held
  back until complete), and how one token reads in logprobs.
- `token_bytes.py`: a token's raw bytes, and OpenAI's `bytes:\\xNN` form for tokens that are
  part of a UTF-8 character (so logprob keys stay distinct).

Who detokenizes: the replica. The gateway tokenizes prompts (it must count tokens for limits
and routing, and hash them for prefix affinity) and passes the replica's text through; it
never decodes output. The replica decodes each new token anyway to find stop strings, and
only it can end a sequence the moment one appears (no token generated past the stop, no text
streamed past it): doing it in the gateway as well would decode every token twice and let the
two decodings disagree. Logprob token strings are rendered on the replica too (`token_text`).
"""

from loraplex.platform.tokenizing.chat_template import (
    DEFAULT_CHAT_TEMPLATE,
    ChatTemplate,
    TemplateRenderError,
    load_chat_template,
)
from loraplex.platform.tokenizing.detokenizer import IncrementalDetokenizer, token_text
from loraplex.platform.tokenizing.loading import (
    TOKENIZER_FILES,
    ModelTokenizer,
    TokenizerNotFound,
    load_tokenizer,
)
from loraplex.platform.tokenizing.token_bytes import TokenBytes, display_bytes, display_token

__all__ = [
    "DEFAULT_CHAT_TEMPLATE",
    "TOKENIZER_FILES",
    "ChatTemplate",
    "IncrementalDetokenizer",
    "ModelTokenizer",
    "TemplateRenderError",
    "TokenBytes",
    "TokenizerNotFound",
    "load_chat_template",
    "display_bytes",
    "display_token",
    "load_tokenizer",
    "token_text",
]
