"""`/tokenize`, `/detokenize` and `/tokenizer_info` jobs of a generating server, beside the engine, never
in it.

They run on the driver's preparer threads and touch no engine state: a chat goes through the online head
(`chat_prompt`) exactly as a chat completion is prepared, so its images are loaded, preprocessed and
counted as the placeholder tokens they expand to (what clients budget with); a text is encoded with
the pipeline's one tokenizer. The answer is posted to the loop, which sends it as a `Done` event.
"""
from typing import Any, Dict, List, Set

from appliance.protocol.tokenize import detokenize_response, tokenize_response, tokenizer_info_response
from appliance.serving.engine_process.inbox import Tokenized, Unanswerable
from appliance.serving.engine_process.records import ChatRecord, as_record
from appliance.serving.messages import DetokenizeJob, TokenizeJob, TokenizerInfoJob
from appliance.stages.chat.template import ChatRendering


class Tokenizing:
    def __init__(self, driver):
        """`driver`: the GenerateDriver (its threads, inbox, online head and engine stage)."""
        self.driver = driver
        self.pending: Set[str] = set()  # uids whose answer is still wanted

    def admit(self, uid: str, job) -> None:
        self.pending.add(uid)
        self.driver.executor.submit(self._run, uid, job)

    def forget(self, uid: str) -> bool:
        """Drop the job (its thread finishes, its answer is not sent); False if it was not pending."""
        if uid in self.pending:
            self.pending.discard(uid)
            return True
        return False

    def _run(self, uid: str, job) -> None:
        """In a preparer thread."""
        if uid not in self.pending:  # aborted while it waited for a thread
            return
        try:
            if isinstance(job, TokenizeJob):
                result = self._tokenize(uid, job)
            elif isinstance(job, TokenizerInfoJob):
                result = tokenizer_info_response(self.driver.stage.engine.tokenizer)
            else:
                result = self._detokenize(job)
            self.driver.post(Tokenized(uid, result))
        except Exception as e:  # noqa: BLE001 - every failure becomes the client's answer
            self.driver.post(Unanswerable(uid, self.driver.failure(e, "tokenizing")))

    def _tokenize(self, uid: str, job: TokenizeJob) -> Dict[str, Any]:
        request, stage = job.request, self.driver.stage
        tokenizer = stage.engine.tokenizer
        if request.messages is not None:
            rendering = ChatRendering(request.add_generation_prompt, request.continue_final_message,
                                      request.add_special_tokens, fit_context=False)
            record = as_record(ChatRecord(request.messages, {}, "messages", job.media_dir, uid, request.model,
                                          rendering))
            (prepared,) = self.driver.head.run_each([record])
            if isinstance(prepared, Exception):
                raise prepared
            tokens = list(prepared["prompt"])
        else:
            tokens = list(tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens))
        strings = tokenizer.convert_ids_to_tokens(tokens) if request.return_token_strs else None
        return tokenize_response(tokens, stage.engine.max_model_len, strings)

    def _detokenize(self, job: DetokenizeJob) -> Dict[str, Any]:
        tokens: List[int] = self.driver.stage.prompt_ids(job.tokens, "tokens")  # ids outside the vocabulary: 400
        return detokenize_response(self.driver.stage.engine.tokenizer.decode(tokens))
