"""What `kuberl validate --local` checks beyond the API's rules: a local model folder the engine could not train.

The ranks check the same when they build the model; said here, it is said before any rank starts.
"""

from __future__ import annotations

from pathlib import Path

from ..api import RLJob
from ..validation.problems import Problem


def local_model_problems(job: RLJob, source: str, base_dir: Path) -> list[Problem]:
    """The model folder's config.json against the engine's families and the job's layouts, where the folder is
    here to read (a missing one is the run's to name: `kuberl run` may be meant for another machine)."""
    from kuberl.engine.models.arch import UnsupportedModel  # no torch: the operator image can run this
    from kuberl.engine.models.support import check_model, read_model_config

    from ..control.planner import engine_config

    path = job.spec.model.path
    if path is None:
        return []
    folder = Path(path).expanduser()
    folder = folder if folder.is_absolute() else (base_dir / folder)
    config_file = folder / "config.json"
    if not config_file.is_file():
        return []
    where = "spec.model.path"
    try:
        check_model(read_model_config(config_file), engine_config(job))
    except UnsupportedModel as exc:
        return [Problem(source, where, f"{folder}: {exc}")]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        return [Problem(source, where, f"{config_file} cannot be read as a model's config: {type(exc).__name__}: {exc}")]
    return []
