"""The engine's beam searches, run as its ordinary sequences.

A round of a search is one request per live beam: the prompt plus the beam's tokens, one greedy token
asked for with the top 2 x width logprobs (as vLLM's engine client runs beam search). The beams share the
prompt's KV blocks, and each other's, through the block manager's prefix cache: a round recomputes only
what its block table does not find cached. The round's outputs go to `BeamSearch.advance` instead of to
the caller; once the search is done its answers come out as the finished outputs of the ids the caller
gave, one per answer, best first.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from appliance.engine.beam_search import BeamSearch, BeamSearchParams
from appliance.engine.detokenizer import IncrementalDetokenizer
from appliance.engine.outputs import RequestOutput
from appliance.engine.sampling_params import SamplingParams


@dataclass
class BeamRun:
    search: BeamSearch
    prompt: List[int]
    answer_ids: List[str]
    mm_data: Optional[list] = None
    round_ids: List[str] = field(default_factory=list)   # this round's requests, one per live beam
    entries: Dict[str, Dict[int, float]] = field(default_factory=dict)  # their next-token logprobs so far


class BeamRuns:
    def __init__(self, engine):
        self.engine = engine
        self.runs: Dict[str, BeamRun] = {}       # by answer id (each of a run's)
        self.by_round: Dict[str, BeamRun] = {}   # by the id of a request of its current round

    def add(self, prompt: List[int], params: BeamSearchParams, answer_ids: List[str], mm_data=None) -> None:
        if len(answer_ids) != params.width:
            raise ValueError(f"beam search of width {params.width} answers {params.width} ids, "
                             f"got {len(answer_ids)}")
        taken = [i for i in answer_ids if i in self.runs or i in self.engine.scheduler.requests]
        if taken:
            raise ValueError(f"request ids {taken} are already in use")
        run = BeamRun(BeamSearch(len(prompt), params, self.engine.eos_token_ids), list(prompt),
                      list(answer_ids), mm_data)
        self._launch(run)  # raises, adding nothing, when the prompt can never fit
        self.runs.update((i, run) for i in answer_ids)

    def _launch(self, run: BeamRun) -> None:
        """One request per live beam, ids that name the first answer, the round and the beam."""
        search = run.search
        params = SamplingParams(temperature=0.0, max_tokens=1,
                                logprobs=min(search.candidates, self.engine.vocab_size))
        run.round_ids, run.entries = [], {}
        try:
            for number, beam in enumerate(search.live):
                rid = self.engine.add_request(run.prompt + list(beam.tokens), params,
                                              request_id=f"{run.answer_ids[0]}:beam{search.rounds}.{number}",
                                              mm_data=run.mm_data)
                run.round_ids.append(rid)
                self.by_round[rid] = run
        except ValueError:
            self._drop(run)
            raise

    def route(self, outputs: List[RequestOutput]) -> List[RequestOutput]:
        """The step's outputs less those of beam rounds, plus the answers of searches that ended."""
        passed = []
        for out in outputs:
            run = self.by_round.pop(out.request_id, None)
            if run is None:
                passed.append(out)
                continue
            assert out.logprobs, "a beam's request asks its one token's top logprobs"
            run.entries[out.request_id] = out.logprobs[0]  # one token, so finished
            if len(run.entries) < len(run.round_ids):
                continue
            run.search.advance([run.entries[rid] for rid in run.round_ids])
            if run.search.done:
                passed += self._answers(run)
            else:
                self._launch(run)
        return passed

    def _answers(self, run: BeamRun) -> List[RequestOutput]:
        for answer_id in run.answer_ids:
            del self.runs[answer_id]
        outputs = []
        for answer_id, beam in zip(run.answer_ids, run.search.best()):
            detok = IncrementalDetokenizer(self.engine.tokenizer, run.prompt)
            text = "".join(detok.add(token) for token in beam.tokens) + detok.flush()
            tokens = list(beam.tokens)
            outputs.append(RequestOutput(answer_id, run.prompt, new_text=text, new_token_ids=tokens, text=text,
                                         token_ids=tokens, finished=True, finish_reason=beam.finish_reason))
        return outputs

    def abort(self, answer_id: str) -> bool:
        """Abort the search `answer_id` answers (every answer of it); False: no search has that id."""
        run = self.runs.get(answer_id)
        if run is None:
            return False
        self._drop(run)
        return True

    def _drop(self, run: BeamRun) -> None:
        for rid in run.round_ids:
            if self.by_round.pop(rid, None) is not None:
                self.engine.abort(rid)
        for answer_id in run.answer_ids:
            self.runs.pop(answer_id, None)
