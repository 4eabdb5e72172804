"""`chat_responses`: completions -> the answer text (single prompt) or the OpenAI batch output file.

A single prompt yields `display` = the answer (surrounding whitespace stripped; Markdown, which the
CLI renders on a terminal: appliance/display.py) and `response` = the chat.completion object. A batch
run collects its `request_count` answers and writes one line per request, in input order:

    {"id": "batch_req_...", "custom_id": ..., "response": {"status_code": 200, "request_id": "req_...",
     "body": <chat.completion or text_completion>}, "error": null}

to a temp file in the output directory, renamed over `output_path` only once every line is written
(`write_atomic`), so a failed run never leaves a half-written file, and `overwrite=true` replaces an
existing one only then; `display` = "wrote N answers to ..." ("1 answer").

A completion request's records (one per prompt, in order) make one text_completion, shaped as the
server's `/v1/completions` answers: choice p * n + j is prompt p's answer j, with the prompt in front
when it echoes (its scored tokens, from its first answer, in front of the logprobs), usage counting each
prompt once.
"""
import json
import os
import time
from typing import Any, Dict, Iterable, Iterator, List, Sequence

from appliance.display import MarkdownText
from appliance.output_files import AtomicFile
from appliance.pipeline import Record, Stage, register_stage
from appliance.protocol.openai_responses import (Choice, answer_logprobs, chat_completion, echo_text, new_id,
                                                 prompt_token_logprobs, text_completion, token_decoder, usage,
                                                 with_echo)
from appliance.stages.engine_stage import model_tokenizer
from appliance.words import counted


def batch_line(custom_id: str, body: Dict[str, Any]) -> Dict[str, Any]:
    return {"id": new_id("batch_req", "_"), "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": new_id("req", "_"), "body": body},
            "error": None}


def write_atomic(path: str, lines: Iterable[Dict[str, Any]]) -> int:
    """Write JSON lines to a temp file beside `path`, fsync, rename over `path` (`AtomicFile`); returns the
    line count. On any failure the temp file is removed and `path` is untouched."""
    count = 0
    with AtomicFile(path) as temp, open(temp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
            count += 1
        f.flush()
        os.fsync(f.fileno())
    return count


@register_stage
class ChatResponses(Stage):
    """Offline only: the server shapes its answers from its events (appliance/serving), with the same
    protocol functions (appliance/protocol/openai_responses.py)."""

    name = "chat_responses"
    consumes = ("choices", "completion_prompt", "echo", "prompt_number", "prompt_count", "custom_id", "model_name",
                "output_path", "request_index", "request_count")
    produces = ("display", "response")
    online = False

    def __init__(self, options, cfg):
        super().__init__(options, cfg)
        self.decode = None  # token text, made on the first request that asks for logprobs

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        batches: Dict[str, List[Dict[str, Any]]] = {}
        created = int(time.time())
        prompts: List[Record] = []  # the records of the request being collected, one per prompt
        for record in records:
            prompts.append(record)
            if record["prompt_number"] < record["prompt_count"] - 1:
                continue
            body = self._completion(record, created) if record["completion_prompt"] is None \
                else self._text_completion(prompts, created)
            prompts = []
            path = record.get("output_path")
            if not path:
                answer = body["choices"][0]["message"]["content"]
                yield {"custom_id": record["custom_id"], "display": MarkdownText(answer.strip()), "response": body}
                continue
            lines = batches.setdefault(path, [])
            lines.append(batch_line(record["custom_id"], body))
            if len(lines) == record["request_count"]:
                count = write_atomic(path, batches.pop(path))
                yield {"output_path": path, "display": f"wrote {counted(count, 'answer')} to {path}"}
        if batches or prompts:  # the stream ended early (an upstream error): nothing is written
            raise RuntimeError(f"chat_responses: incomplete batches for {', '.join(batches) or 'a request'}")

    def _completion(self, record: Record, created: int) -> Dict[str, Any]:
        """The chat.completion of the record's answers: usage counts the prompt once, every answer's tokens."""
        outs = record["choices"]
        top_n = record.get("top_logprobs")
        choices = [Choice(index, out.text, out.finish_reason,
                          answer_logprobs(out.token_ids, out.logprobs, top_n, self._decode))
                   for index, out in enumerate(outs)]
        return chat_completion(new_id("chatcmpl"), record.get("model_name") or self.cfg.model.name, created, choices,
                               usage(len(outs[0].prompt_token_ids), sum(len(out.token_ids) for out in outs)))

    def _text_completion(self, prompts: List[Record], created: int) -> Dict[str, Any]:
        """The text_completion of a completion request's records (one per prompt, in order)."""
        first = prompts[0]
        top_n, choices = first["top_logprobs"], []
        for number, record in enumerate(prompts):
            outs = record["choices"]
            echo = echo_text(record["completion_prompt"], self._detokenize) if first["echo"] else None
            scored = outs[0].prompt_logprobs  # asked for with echo and logprobs, of the first answer only
            echo_logprobs = prompt_token_logprobs(outs[0].prompt_token_ids, scored, top_n, self._decode) \
                if scored is not None else None
            for answer, out in enumerate(outs):
                text, logprobs = out.text, answer_logprobs(out.token_ids, out.logprobs, top_n, self._decode)
                if echo is not None:
                    text, logprobs = with_echo(echo, echo_logprobs, text, logprobs)
                choices.append(Choice(number * first["n"] + answer, text, out.finish_reason, logprobs))
        prompt_tokens = sum(len(record["choices"][0].prompt_token_ids) for record in prompts)
        completion_tokens = sum(len(out.token_ids) for record in prompts for out in record["choices"])
        return text_completion(new_id("cmpl"), first.get("model_name") or self.cfg.model.name, created, choices,
                               usage(prompt_tokens, completion_tokens))

    def _detokenize(self, token_ids: Sequence[int]) -> str:
        return model_tokenizer(self).decode(token_ids, skip_special_tokens=True)

    def _decode(self, token_id: int) -> str:
        if self.decode is None:  # made on the first token asked for: a run without logprobs needs none
            self.decode = token_decoder(model_tokenizer(self))  # the engine's tokenizer
        return self.decode(token_id)
