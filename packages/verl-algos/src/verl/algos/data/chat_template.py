"""``actor_rollout_ref.model.custom_chat_template``: a chat template for a tokenizer that has none (a
base model's) or the wrong one, given as the Jinja text or as the path of a ``.jinja`` file."""

from __future__ import annotations

import os
from typing import Any


def set_chat_template(tokenizer: Any, template_or_path: str) -> None:
    """Give ``tokenizer`` the chat template ``template_or_path``; a bad one fails here, naming the key."""
    template = template_or_path
    if template_or_path.endswith(".jinja") or os.path.isfile(os.path.expanduser(template_or_path)):
        path = os.path.expanduser(template_or_path)
        if not os.path.isfile(path):
            raise ValueError(f"actor_rollout_ref.model.custom_chat_template: the template file {path!r} does not exist")
        with open(path, encoding="utf-8") as fh:
            template = fh.read()
    tokenizer.chat_template = template
    try:  # render a tiny conversation now, so a broken template fails before Ray starts
        tokenizer.apply_chat_template([{"role": "user", "content": "1+1?"}], add_generation_prompt=True, tokenize=False)
    except Exception as e:
        raise ValueError(
            f"actor_rollout_ref.model.custom_chat_template does not render a conversation: {type(e).__name__}: {e}"
        ) from None
