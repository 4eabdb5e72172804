"""How an answer's engine outputs become `Tokens` events: each step's new text for a stream (held back
to one chunk per `server.stream_interval` tokens after the first), the whole answer at its end
otherwise, its prompt in front of its first text when the request echoes, and the logprobs formatted
as the protocol answers them.
"""
from typing import Any, Callable, List, Optional

from appliance.protocol.openai_responses import TokenLogprob, answer_logprobs, prompt_token_logprobs, with_echo
from appliance.serving.engine_process.sessions import ChoiceState, Session
from appliance.serving.messages import Tokens


class AnswerEvents:
    def __init__(self, emit: Callable[[str, Any], None], decode, stream_interval: int):
        self.emit = emit  # Driver.emit: the event goes out with the turn's others
        self.decode = decode  # token id -> text, for logprobs
        self.stream_interval = stream_interval

    def score_prompt(self, session: Session, out) -> None:
        """Keep the prompt's scored tokens (echo with logprobs) that its first answer's output brings."""
        number = session.answers[out.request_id].prompt
        top_n = session.request.top_logprobs
        if top_n is None:  # parse_completion asks prompt logprobs only of a request that asks logprobs
            raise RuntimeError(f"{out.request_id}: prompt logprobs for a request that asked no logprobs")
        if number not in session.echo_logprobs:
            session.echo_logprobs[number] = prompt_token_logprobs(out.prompt_token_ids, out.prompt_logprobs,
                                                                  top_n, self.decode)

    def output(self, uid: str, session: Session, answer: ChoiceState, out, final: bool) -> None:
        """The answer's output of this step, once its counts include it; `final`: the request's last."""
        if session.request.stream:
            self._stream(uid, session, answer, out, final)
        elif out.finished:
            logprobs = answer_logprobs(out.token_ids, out.logprobs, session.request.top_logprobs, self.decode)
            self._emit(uid, session, answer, out.text, logprobs, out.finish_reason, final)

    def _stream(self, uid: str, session: Session, answer: ChoiceState, out, final: bool) -> None:
        """Send the step's new output, or hold it back: after the first chunk, an answer gets one chunk
        per `server.stream_interval` tokens (and its last one when it finishes)."""
        answer.unsent_text += out.new_text
        answer.unsent_tokens += len(out.new_token_ids)
        logprobs = answer_logprobs(out.new_token_ids, out.new_logprobs, session.request.top_logprobs, self.decode)
        if logprobs is not None:
            answer.unsent_logprobs += logprobs
        first = answer.unsent_tokens == answer.completion_tokens  # no chunk of this answer sent yet
        due = answer.unsent_tokens >= self.stream_interval or (first and answer.unsent_tokens)
        if not (due or out.finished):
            return
        wants_logprobs = session.request.top_logprobs is not None
        self._emit(uid, session, answer, answer.unsent_text, answer.unsent_logprobs if wants_logprobs else None,
                   out.finish_reason if out.finished else None, final)
        answer.unsent_text, answer.unsent_tokens, answer.unsent_logprobs = "", 0, []

    def _emit(self, uid: str, session: Session, answer: ChoiceState, text: str,
              logprobs: Optional[List[TokenLogprob]], finish_reason: Optional[str], final: bool) -> None:
        """One answer's Tokens event; its first starts with the prompt when the request echoes."""
        if session.request.echo and not answer.echoed:
            answer.echoed = True
            text, logprobs = with_echo(session.echo_texts[answer.prompt], session.echo_logprobs.get(answer.prompt),
                                       text, logprobs)
        self.emit(uid, Tokens(text, session.prompt_tokens, session.completion_tokens, logprobs, finish_reason,
                              answer.index, final))
