"""The question of a single-prompt run: `prompt=TEXT` or `prompt_file=PATH`, and an optional `system=TEXT`.

Both texts arrive verbatim (appliance/config/free_text.py); a prompt file is read whole as UTF-8, so a
long or multi-line question needs no shell quoting at all.
"""
from typing import Any, Dict, List, Optional

from appliance.errors import InputError

QUESTION_KEYS = ("prompt", "prompt_file", "system")  # the run record's fields a question is made of
INPUT_FORMS = ('pass input=photo.png prompt="What is in the image?" (a question about an image), '
               'prompt="..." alone (text only), or input=requests.jsonl output=answers.jsonl (a batch file)')


def given(record: Dict[str, Any], key: str) -> bool:
    return record.get(key) is not None  # `prompt=` (empty) is given, and refused as empty


def question_keys(record: Dict[str, Any]) -> List[str]:
    """The question fields this run record sets."""
    return [key for key in QUESTION_KEYS if given(record, key)]


def read_prompt_file(path: str) -> str:
    """The file's text; InputError naming prompt_file when it cannot be read as UTF-8 text."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        raise InputError(f"prompt_file: {path} is not UTF-8 text; save the question as UTF-8",
                         param="prompt_file") from None
    except OSError as e:
        raise InputError(f"prompt_file: cannot read {path} ({e.strerror or e})", param="prompt_file") from None


def run_prompt(record: Dict[str, Any], image: bool) -> str:
    """The question text of a single-prompt run (`image`: the run has an image input)."""
    if given(record, "prompt") and given(record, "prompt_file"):
        raise InputError("prompt_file: given with prompt=; pass the question one way, not both",
                         param="prompt_file")
    prompt: Optional[str]
    if given(record, "prompt_file"):
        prompt = read_prompt_file(str(record["prompt_file"]))
        field, source = "prompt_file", f"prompt_file: {record['prompt_file']}"
    else:
        prompt, field, source = record.get("prompt"), "prompt", "prompt:"
    if prompt is None:
        if not image:
            raise InputError(f"input: missing; {INPUT_FORMS}", param="input")
        raise InputError('prompt: required with an image input; pass prompt="What is in the image?" or '
                         "prompt_file=question.txt", param="prompt")
    if not str(prompt).strip():
        raise InputError(f"{source} the question is empty; ask something", param=field)
    return str(prompt)


def system_message(record: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The system message `system=` asks for, or None."""
    if not record.get("system"):
        return None
    return {"role": "system", "content": str(record["system"])}
