"""`pipeline=llava_encode`: images in, vision-tower features out.

    vision_inputs -> engine (engine.kind=pool on the LLaVA checkpoint: its vision tower) -> features_write

The tower can then run apart from the language model: a features file written here, given as the image
of a `llava_chat` request with `model.vision_language.image_input_type=image_features`, gives the same
answer as the image itself. LLaVA-1.5 only (LLaVA-NeXT's feature count depends on each image).
The tower runs in the engine like every model (its device, dtype and batching): in pool mode a LLaVA
checkpoint is `LlavaVisionEncoder`, which builds only the tower and reads only its tensors; the features
are the tower's output, before the projector.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Tuple

import torch
from safetensors.torch import save_file

from appliance.errors import ConfigError, InputError
from appliance.output_files import AtomicFile
from appliance.pipeline import Record, Stage, register_stage
from appliance.stages.chat.images import ImageReading, ImageSide


@dataclass
class VisionInputsOptions:
    suffix: str = ".features.safetensors"  # output name beside each input when `output` is not a file


@register_stage
class VisionInputs(Stage):
    """The run record's images (all checked first) -> one record per image: its preprocessed pixels
    and the features file it will be written to."""

    name = "vision_inputs"
    Options = VisionInputsOptions
    consumes = ("input", "output", "overwrite")
    produces = ("pixel_values", "features_path", "image_index", "image_count")
    online = False  # the offline verb's source: files named on the command line

    def setup(self) -> None:
        self.side = ImageSide.from_config(self.cfg)
        if self.side.preprocess is None or self.side.anyres is not None:
            raise ConfigError("pipeline=llava_encode: needs a LLaVA-1.5 model with image_input_type=pixel_values")

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        for record in records:
            pairs = self._plan(record)
            for index, (source, target) in enumerate(pairs):
                item = self.side.prepare(str(source), "input", media_dir=str(source.parent))
                yield {**record, "pixel_values": item.pixel_values, "features_path": str(target),
                       "image_index": index, "image_count": len(pairs)}

    def preflight(self, records: List[Record]) -> None:
        """Every image and features file checked (`_plan`) and every image read and decoded as
        `ImageSide.prepare` reads it; preprocessing takes the checkpoint's processor: the preflight ends here."""
        reading = ImageReading.from_server_config(self.cfg.server)
        for record in records:
            for source, _ in self._plan(record):
                reading.load(str(source), "input", str(source.parent))
        return None

    def _plan(self, record: Record) -> List[Tuple[Path, Path]]:
        """(image, features file) pairs, all checked before any work."""
        inputs = record["input"] if isinstance(record["input"], (list, tuple)) else [record["input"]]
        if not inputs or inputs == [None]:
            raise InputError("input: give an image path (or a list of them)", param="input")
        output = Path(record["output"]) if record.get("output") else None
        single_file = output if output is not None and output.suffix == ".safetensors" else None
        if single_file and len(inputs) > 1:
            raise InputError(f"output: {output} is one file but {len(inputs)} images were given; give a directory",
                             param="output")
        pairs = []
        for raw in inputs:
            source = Path(str(raw)).resolve()
            if not source.is_file():
                raise InputError(f"input: {source} is not a file", param="input")
            name = source.stem + self.options.suffix
            target = single_file or (output / name if output else source.with_name(name))
            if target.exists() and not record.get("overwrite"):
                raise InputError(f"output: {target} exists; pass overwrite=true to replace it", param="output")
            pairs.append((source, target))
        return pairs


@register_stage
class FeaturesWrite(Stage):
    """Each image's features -> its .safetensors file (written to a temp file, then renamed); after a
    run record's last image, one record with the line `appliance run` prints."""

    name = "features_write"
    consumes = ("features", "features_path", "image_index", "image_count")
    produces = ("display",)
    online = False  # the offline verb's sink: files on the command line's paths

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        written: List[str] = []
        for record in records:  # in input order: the engine stage keeps it
            features = record["features"].float().contiguous()
            _write_atomically(features, Path(record["features_path"]))
            written.append(record["features_path"])
            if record["image_index"] == record["image_count"] - 1:
                rest = {k: v for k, v in record.items() if k not in self.consumes}
                files = "feature file" if len(written) == 1 else "feature files"
                yield {**rest, "display": f"wrote {len(written)} {files}, each {list(features.shape)} "
                                          f"(tokens, hidden): {', '.join(written)}"}
                written = []


def _write_atomically(features: torch.Tensor, target: Path) -> None:
    with AtomicFile(str(target)) as temp:
        save_file({"image_features": features}, temp)
