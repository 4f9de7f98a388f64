"""vLLM's engine as a :class:`~verl.core.engine.RequestStream`: requests join and leave its continuous
batch one by one.

``LLM.generate`` adds a batch of requests to the in-process ``LLMEngine`` and steps it until all are done.
Here the caller adds requests whenever it has one (``LLMEngine.add_request``, token ids in) and steps the
engine itself (``LLMEngine.step``); vLLM's scheduler puts a new request into the running batch at its next
step, exactly as its asynchronous engine (``AsyncLLM``) does for a server. Stepping in the worker's own
thread keeps the engine in-process, where the hybrid engine loads weights into it and puts it to sleep.

Outputs are asked for when a request finishes only (``RequestOutputKind.FINAL_ONLY``, as ``LLM.generate``
does), with the same sampling, eos and log-prob settings as a batch (``sampling``). Each request brings its
own seed; it is mixed with the data-parallel rank, so that two ranks never share a random stream.
"""

from __future__ import annotations

from verl.core.engine import FinishedRequest, RequestStream, SamplingParams
from verl.engines.rollout.vllm.output import sampled_logprobs
from verl.engines.rollout.vllm.sampling import stream_seed, to_vllm_sampling


class VLLMRequestStream(RequestStream):
    def __init__(self, llm_engine, vllm, eos_token_ids: list[int], lora_request, rank: int):
        self.llm_engine = llm_engine
        self._vllm = vllm
        self.eos_token_ids = eos_token_ids
        self.lora_request = lora_request
        self.rank = rank
        self._in_flight: dict[str, bool] = {}  # request id -> whether log-probs were asked for

    def submit(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams) -> None:
        if sampling.n != 1:
            raise ValueError(f"a streamed request generates one completion; got SamplingParams.n={sampling.n}")
        if request_id in self._in_flight:
            raise ValueError(f"request {request_id!r} is already in flight")
        from vllm.sampling_params import RequestOutputKind

        params = to_vllm_sampling(self._vllm, sampling, stream_seed(sampling.seed, self.rank), self.eos_token_ids)
        params.output_kind = RequestOutputKind.FINAL_ONLY
        self.llm_engine.add_request(
            request_id, {"prompt_token_ids": list(prompt_ids)}, params, lora_request=self.lora_request
        )
        self._in_flight[request_id] = sampling.logprobs

    def step(self) -> list[FinishedRequest]:
        finished = []
        for output in self.llm_engine.step():
            if not output.finished or output.request_id not in self._in_flight:
                continue
            with_logprobs = self._in_flight.pop(output.request_id)
            (completion,) = output.outputs
            ids = list(completion.token_ids)
            logprobs = sampled_logprobs(completion, ids) if with_logprobs else None
            finished.append(FinishedRequest(output.request_id, ids, logprobs, completion.finish_reason or "stop"))
        return finished

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def abort(self) -> None:
        if self._in_flight:
            self.llm_engine.abort_request(list(self._in_flight))
            self._in_flight.clear()
