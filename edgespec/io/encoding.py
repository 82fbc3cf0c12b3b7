"""What enters a generation as tokens: a raw prompt or chat messages encoded with an export's tokenizer and chat
template, and token ids from a caller checked against the tokenizer's vocabulary (the one place both are done).
"""

from __future__ import annotations

import numpy as np

from .integrity import tokenizer_width
from .text import ChatTemplate, check_text, encode_chat, plain_text_tokenizer


class PromptEncoder:
    """An export's tokenizer (a ``tokenizers.Tokenizer``) and chat template (None: the export has none), with the
    tokenizer that keeps control-token text in message content plain, built on first use (``plain``: None until
    then; a second tokenizer costs ~100 MB for Qwen's vocabulary)."""

    def __init__(self, tokenizer, template: ChatTemplate | None = None):
        self.tokenizer, self.template = tokenizer, template
        self.n_tokens = tokenizer_width(tokenizer)  # the ids the tokenizer has: 0..n_tokens-1
        self.plain = None

    @property
    def plain_tokenizer(self):
        """The tokenizer that encodes control-token text in message content as ordinary text (built once, on
        the first message that holds such text)."""
        if self.plain is None:
            self.plain = plain_text_tokenizer(self.tokenizer)
        return self.plain

    def encode(self, prompt: str | None = None, messages: list[dict] | None = None,
               tools: list[dict] | None = None) -> list[int]:
        """Token ids int64 of a raw prompt, or of chat ``messages`` rendered with the chat template.

        Message content is plain text: control-token text in it (``<|im_end|>``) does not become a control
        token (:func:`~edgespec.io.text.encode_chat`); a raw prompt is the caller's own markup and may hold them,
        and gets the special tokens the tokenizer puts around a text (``<bos>`` for Gemma and Llama 3, none for Qwen).
        ``tools`` (OpenAI tool objects) are passed to the chat template, which renders them.

        Raises:
            ValueError: neither or both given, an empty prompt, messages that are not a list of
                ``{"role", "content"}`` dicts with known roles and str content, text that is not valid UTF-8,
                or a chat template that fails.
        """
        if (prompt is None) == (messages is None):
            raise ValueError("give exactly one of prompt or messages")
        if messages is not None:
            if self.template is None:
                raise ValueError("this export has no chat template; pass a raw prompt")
            ids = encode_chat(self.tokenizer, lambda: self.plain_tokenizer, self.template, messages, tools=tools)
        else:
            # the tokens the tokenizer adds to a text (Gemma's and Llama 3's <bos>; none for Qwen), as llama.cpp
            # and Hugging Face do for a prompt
            ids = self.tokenizer.encode(check_text(prompt, "prompt"), add_special_tokens=True).ids
        if not ids:
            raise ValueError("the prompt is empty")
        return ids

    def check_ids(self, input_ids) -> list[int]:
        """``input_ids`` as a list of ints, each an id of the tokenizer (0 ≤ id < its vocabulary).

        Raises:
            ValueError: naming ``input_ids``: not a 1-D sequence of integers (floats and bools are refused,
                never rounded), or an id out of range.
        """
        if isinstance(input_ids, (str, bytes, dict)) or not hasattr(input_ids, "__len__"):
            raise ValueError(f"input_ids must be a list of token ids, got {type(input_ids).__name__}")
        arr = np.asarray(input_ids, dtype=object if not isinstance(input_ids, np.ndarray) else None)
        if arr.ndim != 1:
            raise ValueError(f"input_ids must be a flat list of token ids, got shape {arr.shape}")
        for i, t in enumerate(arr.tolist() if arr.dtype != object else arr):
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise ValueError(f"input_ids[{i}] must be an integer token id, got {t!r}")
            if not 0 <= t < self.n_tokens:
                raise ValueError(f"input_ids[{i}] = {t} is not a token id (ids are 0..{self.n_tokens - 1})")
        return [int(t) for t in arr.tolist()]
