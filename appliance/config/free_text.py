"""Free-text values on the command line: `prompt=What's this? (a=b, [c])` taken as the shell passed it.

Hydra's override grammar reads quotes, commas, brackets, parentheses and `=` as syntax, and OmegaConf
reads `${...}` as an interpolation, so a question typed the natural way fails or changes. The keys the
schema marks FREE_TEXT (`free_text_keys`) therefore never reach Hydra: `split_free_text` takes them out
of the overrides, and `apply_free_text` sets them on the composed config afterwards, escaped so that
OmegaConf gives the text back unchanged.
"""
import re
from typing import Dict, List, Sequence, Tuple

from omegaconf import DictConfig

from appliance.config.schema import free_text_keys
from appliance.errors import ConfigError

# `${` and the backslashes right before it: OmegaConf reads `\${` as a literal `${` and `\\` before an
# interpolation as one backslash; backslashes anywhere else are kept as they are.
_INTERPOLATION = re.compile(r"(\\*)\$\{")


def split_free_text(overrides: Sequence[str]) -> Tuple[List[str], Dict[str, str]]:
    """(the overrides for Hydra, {free-text key: its text}). A key given twice is refused: with a text
    that may hold anything, which one was meant cannot be guessed."""
    keys = set(free_text_keys())
    rest, texts = [], {}
    for line in overrides:
        key, equals, text = line.partition("=")
        if not equals or key not in keys:
            rest.append(line)
            continue
        if key in texts:
            raise ConfigError(f"{key}: given twice; pass it once")
        texts[key] = text
    return rest, texts


def literal(text: str) -> str:
    """`text` as an OmegaConf string value that reads back as `text` (no interpolation)."""
    return _INTERPOLATION.sub(lambda m: m.group(1) * 2 + "\\${", text)


def apply_free_text(cfg: DictConfig, texts: Dict[str, str]) -> None:
    """Set each free-text key of the validated config to its text, verbatim."""
    for key, text in texts.items():
        cfg[key] = literal(text)
