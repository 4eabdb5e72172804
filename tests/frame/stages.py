"""Stages used only to test the frame: read numbers from a text file, scale them, sum them."""
from dataclasses import dataclass
from pathlib import Path

from appliance.errors import InputError
from appliance.pipeline import Stage, register_stage


@register_stage
class ReadNumbers(Stage):
    name = "read_numbers"
    consumes = ("input",)
    produces = ("number",)

    def process(self, records):
        for record in records:
            path = Path(record["input"])
            if not path.is_file():
                raise InputError(f"input: {path} does not exist")
            for line in path.read_text().split():
                yield {**record, "number": float(line)}


@register_stage
class Scale(Stage):
    name = "scale"
    consumes = ("number",)
    produces = ("number",)

    @dataclass
    class Options:
        factor: float = 1.0

    def map(self, record):
        return {**record, "number": record["number"] * self.options.factor}


@register_stage
class Total(Stage):
    """Fan-in: many records in, one out."""

    name = "total"
    consumes = ("number",)
    produces = ("display",)

    def process(self, records):
        total = sum(record["number"] for record in records)
        yield {"display": f"total {total:g}"}


@register_stage
class NeedsPixels(Stage):
    name = "needs_pixels"
    consumes = ("pixels",)
    produces = ("number",)
