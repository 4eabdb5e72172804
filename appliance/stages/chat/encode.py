"""`vision_encode`: images in, vision-tower features out (`pipeline=llava_encode`).

The tower can then run apart from the language model: a features file it writes, given as the image
of a `llava_chat` request with `model.vision_language.image_input_type=image_features`, gives the same
answer as the image itself. LLaVA-1.5 only (LLaVA-NeXT's feature count depends on each image).
Only the vision tower is built and only its tensors are read from the checkpoint (`LlavaVisionTower`):
the features are the tower's output, before the projector.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Tuple

import torch
from safetensors.torch import save_file

from appliance.errors import ConfigError, InputError
from appliance.output_files import AtomicFile
from appliance.pipeline import Record, Stage, register_stage
from appliance.stages.chat.images import ImageSide


@dataclass
class VisionEncodeOptions:
    suffix: str = ".features.safetensors"  # output name beside each input when `output` is not a file


@register_stage
class VisionEncode(Stage):
    name = "vision_encode"
    Options = VisionEncodeOptions
    consumes = ("input", "output", "overwrite")
    produces = ("display",)

    def setup(self) -> None:
        from transformers import AutoConfig

        from appliance.engine.loader import iter_weights
        from appliance.engine.models.llava import LlavaVisionTower

        self.side = ImageSide.from_config(self.cfg)
        if self.side.preprocess is None or self.side.anyres is not None:
            raise ConfigError("pipeline=llava_encode: needs a LLaVA-1.5 model with image_input_type=pixel_values")
        hf_config = AutoConfig.from_pretrained(self.cfg.model.path)
        with torch.device(torch.device(self.cfg.engine.device)):
            tower = LlavaVisionTower(hf_config)  # no projector, no language model
        tower.load_weights(iter_weights(self.cfg.model.path, keep=tower.needs))
        self.model = tower.eval()

    def process(self, records: Iterator[Record]) -> Iterator[Record]:
        for record in records:
            pairs = self._plan(record)
            for source, target in pairs:
                item = self.side.prepare(str(source), "input", media_dir=str(source.parent))
                with torch.inference_mode():
                    features = self.model.vision_features(item.pixel_values[None])[0].float().contiguous()
                _write_atomically(features, target)
            shape = list(features.shape)
            yield {**record, "display": f"wrote {len(pairs)} feature file(s), each {shape} (tokens, hidden): "
                                        f"{', '.join(str(t) for _, t in pairs)}"}

    def _plan(self, record: Record) -> List[Tuple[Path, Path]]:
        """(image, features file) pairs, all checked before any work."""
        inputs = record["input"] if isinstance(record["input"], (list, tuple)) else [record["input"]]
        if not inputs or inputs == [None]:
            raise InputError("input: give an image path (or a list of them)")
        output = Path(record["output"]) if record.get("output") else None
        single_file = output is not None and output.suffix == ".safetensors"
        if single_file and len(inputs) > 1:
            raise InputError(f"output: {output} is one file but {len(inputs)} images were given; give a directory")
        pairs = []
        for raw in inputs:
            source = Path(str(raw)).resolve()
            if not source.is_file():
                raise InputError(f"input: {source} is not a file")
            name = source.stem + self.options.suffix
            target = output if single_file else (output / name if output else source.with_name(name))
            if target.exists() and not record.get("overwrite"):
                raise InputError(f"output: {target} exists; pass overwrite=true to replace it")
            pairs.append((source, target))
        return pairs


def _write_atomically(features: torch.Tensor, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with AtomicFile(str(target)) as temp:
        save_file({"image_features": features}, temp)
