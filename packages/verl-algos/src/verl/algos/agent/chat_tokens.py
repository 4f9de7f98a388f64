"""Token ids of the conversation pieces the agent loop adds, taken from the chat template.

The prompt is the templated conversation with the generation prompt. What the loop inserts after a
model turn (tool or user messages, then the next generation prompt) is the *delta* between two
templated conversations: a fixed placeholder exchange ending with an assistant turn, and the same
exchange followed by the new messages. The delta starts right after the assistant turn's end-of-turn
token, so it includes the template's separator that follows that token (the model stops at the token;
the template's newline after it is not the model's). The model's own tokens are never re-tokenised.
"""

from __future__ import annotations

from typing import Any

_PLACEHOLDER = [{"role": "user", "content": "placeholder"}, {"role": "assistant", "content": "placeholder"}]


class ChatTokens:
    def __init__(self, tokenizer: Any, eos_token_ids: list[int], tools: list[dict] | None = None):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "multi-turn rollouts need a tokenizer with a chat template (to format tool responses); "
                "this tokenizer has none: set the model's chat_template in its tokenizer_config.json"
            )
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.tools = tools or None
        base = self._template(_PLACEHOLDER, add_generation_prompt=False)
        ends = [i for i, token in enumerate(base) if token in self.eos_token_ids]
        if not ends:
            raise ValueError(
                "the chat template does not end an assistant turn with an eos token "
                f"({sorted(self.eos_token_ids)}); the agent loop cannot tell where a model turn stops"
            )
        self._base = base
        self._cut = ends[-1] + 1

    def _template(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages, tools=self.tools, add_generation_prompt=add_generation_prompt, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers >= 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def prompt(self, messages: list[dict]) -> list[int]:
        return self._template(messages, add_generation_prompt=True)

    def inserted(self, messages: list[dict]) -> list[int]:
        """The ids that follow a model turn ended by its end-of-turn token: ``messages`` and the next
        generation prompt."""
        full = self._template(_PLACEHOLDER + messages, add_generation_prompt=True)
        if full[: len(self._base)] != self._base:
            raise ValueError(
                "the chat template renders an exchange differently once messages follow it, so inserted "
                "turns cannot be taken as a token delta; use a template whose earlier turns do not change"
            )
        return full[self._cut :]
