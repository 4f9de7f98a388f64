"""The agent-loop tests' scripted model: a tiny random Qwen2 taught (300 Adam steps, a few seconds) three
scripted tool conversations: a good calculator call, a call the calculator refuses, and a malformed call,
each followed by the tool's response and a final answer; and a fourth with the gsm8k interaction: a wrong
answer, the interaction's "try again", the right answer. Greedy decoding then replays the scripts, which
forces real tool calls and interaction turns through the loops. Shared by the agent-loop, interaction and
``verl train`` agent tests (import the fixtures ``scripted_model`` and ``engine``).
"""

from __future__ import annotations

import concurrent.futures

import pytest
import torch
from verl_test_models import bpe_tokenizer, write_causal_lm

from verl.algos.agent.chat_tokens import ChatTokens
from verl.algos.agent.interactions.gsm8k import CORRECT, INCORRECT
from verl.algos.agent.loops import AgentLoop
from verl.core.engine import SamplingParams
from verl.core.protocol import DataProto
from verl.engines.rollout.hf import HFRolloutConfig, HFRolloutEngine

CALC = {
    "class_name": "calculator",
    "tool_schema": {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "arithmetic",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
}


def call(expression: str) -> str:
    return f'<tool_call>{{"name": "calc", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


#: (user question, first turn, tool response, final turn)
SCRIPTS = [
    ("What is 6*7?", call("6*7"), "42", "The answer is 42."),
    ("What is 1/0?", call("1/0"), "Error: division by zero.", "It cannot be divided."),
    ("What is 2+2?", '<tool_call>{"name": "calc", "arguments": [2]}</tool_call>', None, "I give up."),
]
#: (user question, wrong answer, right answer): the gsm8k interaction asks again after the first.
INTERACTION = ("What is 3+4? Answer after ####.", "#### 8", "#### 7")
GREEDY = SamplingParams(do_sample=False, max_new_tokens=64, logprobs=True)
RESPONSE_LENGTH = 96


def conversation(question):
    return [{"role": "user", "content": question}]


def script_ids(tokenizer, chat: ChatTokens, question, first, tool_text, final, error_text) -> list[int]:
    eos = tokenizer.eos_token_id
    tool = {"role": "tool", "content": tool_text if tool_text is not None else error_text}
    return (
        chat.prompt(conversation(question))
        + tokenizer.encode(first)
        + [eos]
        + chat.inserted([tool])
        + tokenizer.encode(final)
        + [eos]
    )


def interaction_ids(tokenizer, chat: ChatTokens) -> list[int]:
    question, wrong, right = INTERACTION
    eos = tokenizer.eos_token_id
    return (
        chat.prompt(conversation(question))
        + tokenizer.encode(wrong)
        + [eos]
        + chat.inserted([{"role": "user", "content": INCORRECT}])
        + tokenizer.encode(right)
        + [eos]
        + chat.inserted([{"role": "user", "content": CORRECT}])
    )


@pytest.fixture(scope="module")
def scripted_model(tmp_path_factory):
    """A tiny model that has memorised SCRIPTS (greedy decoding replays them)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    corpus = [text for script in SCRIPTS for text in script if text] * 20 + [*INTERACTION, CORRECT, INCORRECT] * 20
    tokenizer = bpe_tokenizer(corpus, vocab_size=1200)
    # head_dim 32: the smallest vLLM's CPU attention takes (the vLLM agent-loop run uses this model too)
    path = write_causal_lm(
        str(tmp_path_factory.mktemp("scripted")),
        tokenizer,
        hidden_size=64,
        num_heads=2,
        num_kv_heads=1,
        max_positions=256,
    )
    tokenizer = AutoTokenizer.from_pretrained(path)  # as the engine loads it (it may split text differently)
    chat = ChatTokens(tokenizer, [tokenizer.eos_token_id])
    bad_arguments = 'Error: the "arguments" of calc must be a JSON object, got list.'
    sequences = [script_ids(tokenizer, chat, *script, bad_arguments) for script in SCRIPTS]
    taught = [*sequences, interaction_ids(tokenizer, chat)]
    model = AutoModelForCausalLM.from_pretrained(path)
    width = max(map(len, taught))
    ids = torch.full((len(taught), width), tokenizer.pad_token_id)
    labels = torch.full((len(taught), width), -100)
    for row, sequence in enumerate(taught):
        ids[row, : len(sequence)] = labels[row, : len(sequence)] = torch.tensor(sequence)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model trains fastest on one thread (and leaves the others alone)
    try:
        for _ in range(300):
            model(input_ids=ids, attention_mask=(labels != -100).long(), labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(path)
    return path, tokenizer, sequences


@pytest.fixture(scope="module")
def engine(scripted_model):
    return HFRolloutEngine(HFRolloutConfig(model_path=scripted_model[0], micro_batch_size=4))


def greedy_turn(engine, ids: list[int]) -> tuple[list[int], list[float]]:
    batch = DataProto.from_dict(
        {
            "input_ids": torch.tensor([ids]),
            "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
            "position_ids": torch.arange(len(ids))[None],
        }
    )
    out = engine.generate(batch, GREEDY).batch
    n = int(out["response_mask"].sum())
    return out["responses"][0, :n].tolist(), out["rollout_log_probs"][0, :n].tolist()


class AskAgainLoop(AgentLoop):
    """A user's own agent loop, written as the README shows (and loaded by ``agent_loop_config_path`` in the
    tests): after the model's first turn it inserts ``message`` as a user turn once, then lets the model
    answer again."""

    def __init__(self, context, message: str = "Are you sure?"):
        super().__init__(context)
        self.message = message

    def after_generation(self, trajectory, ids, logprobs):
        trajectory.add_model_tokens(ids, logprobs)
        trajectory.assistant_turns += 1
        if trajectory.assistant_turns >= 2 or trajectory.remaining <= 0 or ids[-1] not in self.context.eos_token_ids:
            trajectory.finish("eos")
            return None
        follow_up: concurrent.futures.Future = concurrent.futures.Future()
        follow_up.set_result({"role": "user", "content": self.message})
        return follow_up

    def resume(self, trajectory, message):
        ids = self.chat.inserted([message])
        if len(ids) >= trajectory.remaining:
            trajectory.finish("length")
            return
        trajectory.add_inserted_tokens(ids)
        trajectory.user_turns += 1
