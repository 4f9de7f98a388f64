"""A tiny randomly initialized Qwen2 model folder with a tokenizer suited to digits, built locally.

The tokenizer is byte-level BPE trained on the texts of the task the model will learn, with every
digit kept as its own token (``Digits(individual_digits=True)`` runs before the byte-level split):
words of the fixed prompt merge into a few tokens, so sequences stay short, while numbers are spelled
digit by digit, which is what lets a tiny transformer compute with them. A ChatML template makes the
prompts look like an instruct model's. Nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Iterable

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]


def build_digit_tokenizer(corpus: Iterable[str], vocab_size: int = 128):
    """Byte-level BPE over ``corpus`` (only the characters it contains, so the vocabulary stays small),
    single-digit tokens, ChatML chat template; eos is ``<|im_end|>``, padding ``<|endoftext|>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    texts = list(corpus) + ["user", "assistant", "system", "\n"]
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        chat_template=CHATML_TEMPLATE,
    )


def build_tiny_model_folder(
    path: str,
    corpus: Iterable[str],
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
) -> str:
    """Write a random Qwen2 causal LM (untied embeddings) and its tokenizer to ``path``; returns ``path``."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_digit_tokenizer(corpus)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
