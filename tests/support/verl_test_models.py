"""The one way the test suites build models: tiny tokenizers and random tiny model folders, made at test
time with nothing downloaded. Every package's tests (and the processes they spawn) import this module;
the repository's ``conftest.py`` puts this folder on ``sys.path``.

Each suite picks the shape it needs (a ChatML byte-level BPE tokenizer for chat prompts, single-digit
tokens for arithmetic, a word-level vocabulary for hand-written token ids) and the model's size; what
every folder has in common (config, weights, tokenizer, generation config, eos/pad ids taken from the
tokenizer) lives here once.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CHATML_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]


def bpe_tokenizer(
    corpus: Iterable[str],
    *,
    vocab_size: int = 400,
    chat_template: bool = True,
    individual_digits: bool = False,
    full_byte_alphabet: bool = True,
    padding_side: str = "right",
):
    """Byte-level BPE trained on ``corpus`` (any text round-trips) with ChatML's special tokens: eos
    ``<|im_end|>``, pad ``<|endoftext|>``. ``individual_digits``: every digit its own token (a tiny model
    can then compute with numbers); ``full_byte_alphabet=False`` keeps only the corpus's characters."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if individual_digits
        else byte_level
    )
    tok.decoder = decoders.ByteLevel()
    alphabet = {"initial_alphabet": pre_tokenizers.ByteLevel.alphabet()} if full_byte_alphabet else {}
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=CHATML_SPECIAL_TOKENS, show_progress=False, **alphabet
    )
    tok.train_from_iterator(list(corpus), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        chat_template=CHATML_TEMPLATE if chat_template else None,
        padding_side=padding_side,
    )


def word_tokenizer(words: Sequence[str], vocab_size: int, padding_side: str = "left"):
    """A whitespace word-level tokenizer: ids 0, 1, 2 are <pad>, <eos>, <unk>, then ``words``, then filler
    words ``w<i>`` up to ``vocab_size`` (so any id below it decodes)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for word in words:
        vocab[word] = len(vocab)
    for i in range(len(vocab), vocab_size):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side=padding_side
    )


#: The MoE architectures' extra fields: 4 experts, 2 per token (Qwen2-MoE with its gated shared expert).
MOE_FIELDS = {
    "qwen2_moe": dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48
    ),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
}


def write_causal_lm(
    path: str,
    tokenizer,
    *,
    arch: str = "qwen2",
    hidden_size: int = 64,
    intermediate_size: int | None = None,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_positions: int = 512,
    tie: bool = False,
    seed: int = 0,
    init_std: float | None = None,
    vocab_size: int | None = None,
) -> str:
    """A random causal LM folder in ``path``: config, weights, ``tokenizer`` and a generation config, with
    eos/pad ids from the tokenizer. ``init_std``: redraw every matrix from N(0, init_std) (the default
    init is so small that a tiny model's outputs barely depend on some weights)."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        GenerationConfig,
        LlamaConfig,
        Qwen2Config,
        Qwen2MoeConfig,
        Qwen3MoeConfig,
    )

    config_cls = {"qwen2": Qwen2Config, "llama": LlamaConfig, "qwen2_moe": Qwen2MoeConfig, "qwen3_moe": Qwen3MoeConfig}
    config = config_cls[arch](
        **MOE_FIELDS.get(arch, {}),
        **({"head_dim": hidden_size // num_heads} if arch.startswith("qwen3") else {}),
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    if init_std is not None:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, init_std)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def write_sequence_classifier(
    path: str, tokenizer, *, hidden_size: int = 64, num_layers: int = 2, seed: int = 1
) -> str:
    """A random Qwen2 sequence classifier with one score (a reward model) and ``tokenizer`` in ``path``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    Qwen2ForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
