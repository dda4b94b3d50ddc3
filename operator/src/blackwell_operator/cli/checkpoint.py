"""What `btj plan` reads of spec.model.weights where it is a folder on this machine: config.json and sizes."""

from __future__ import annotations

import json
from pathlib import Path

from blackwell_operator.errors import SpecError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner import CheckpointFacts
from blackwell_operator.planner.storage import WEIGHTS_FIELD
from blackwell_trainer.plan.config import HfConfigError, architecture_from_hf_config, export_dtype_name

CONFIG_FILE = "config.json"
HF_FOLDER = "a Hugging Face checkpoint folder (config.json and *.safetensors)"


def read_checkpoint(spec: BlackwellTrainingJobSpec) -> CheckpointFacts | None:
    """The architecture and size of the spec's weights when they are a folder readable here (a login node
    that mounts the same FSx path, say); None for S3 or a path this machine does not have.

    SpecError (spec.model.weights.uri) for a folder that is there but is no checkpoint the trainer can
    train: no or a broken config.json, another model family, no safetensors files.
    """
    weights = spec.model.weights
    if weights is None or weights.uri.startswith("s3://") or not Path(weights.uri).is_dir():
        return None
    folder = Path(weights.uri)
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except FileNotFoundError:
        raise SpecError(
            WEIGHTS_FIELD, f"{folder} holds no {CONFIG_FILE}", f"point it at {HF_FOLDER}"
        ) from None
    except (OSError, ValueError) as err:
        raise SpecError(
            WEIGHTS_FIELD,
            f"{folder / CONFIG_FILE} cannot be read as JSON ({err})",
            f"point it at {HF_FOLDER}",
        ) from None
    if not isinstance(config, dict):
        raise SpecError(
            WEIGHTS_FIELD, f"{folder / CONFIG_FILE} is not a JSON object", f"point it at {HF_FOLDER}"
        )
    try:
        architecture = architecture_from_hf_config(config, sequence_length=spec.training.sequence_length)
    except HfConfigError as err:
        raise SpecError(
            WEIGHTS_FIELD, f"{folder}: {err}", "use a Llama 3.x, Qwen2.5 or Mistral checkpoint"
        ) from None
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise SpecError(WEIGHTS_FIELD, f"{folder} holds no *.safetensors files", f"point it at {HF_FOLDER}")
    return CheckpointFacts(
        architecture=architecture,
        size_bytes=sum(f.stat().st_size for f in files),
        export_dtype=export_dtype_name(config),
    )
