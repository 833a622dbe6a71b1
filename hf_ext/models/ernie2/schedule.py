"""The continual schedule of ERNIE 2.0 pre-training: stages in order, each naming the tasks it trains and each task's
optimizer steps (`ContinualSchedule`, read from YAML or JSON), and the paper's scheme (`PAPER_SCHEDULE`). Used by the
data builders and the training loop alike."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import HfExtError, quoted
from ...text_files import BoundedYamlLoader
from .configuration_ernie2 import PRETRAINING_TASKS


@dataclass(frozen=True)
class Stage:
    """One stage: `steps` maps each task it trains to its optimizer steps in the stage."""

    steps: dict
    name: str | None = None

    @property
    def total_steps(self) -> int:
        return sum(self.steps.values())


@dataclass(frozen=True)
class ContinualSchedule:
    """The stages of a continual pre-training run, in order. As a file (YAML or JSON):

    ```yaml
    stages:
      - name: knowledge masking          # optional
        steps: {knowledge_masking: 20000}
      - steps: {knowledge_masking: 10000, capitalization: 30000}
    ```
    The paper's continual scheme trains every earlier task again with the new one; nothing here enforces it, so
    the sequential (one task per stage) and plain multi-task (one stage) baselines are schedules too.
    """

    stages: tuple

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "schedule") -> "ContinualSchedule":
        if not isinstance(data, dict) or set(data) != {"stages"} or not isinstance(data["stages"], list) \
                or not data["stages"]:
            raise HfExtError(f"{where}: a schedule is a mapping with one key, `stages`: a non-empty list of stages")
        stages = []
        for number, stage in enumerate(data["stages"], 1):
            here = f"{where}, stage {number}"
            if not isinstance(stage, dict) or not isinstance(stage.get("steps"), dict) or not stage["steps"] \
                    or set(stage) - {"steps", "name"}:
                raise HfExtError(f"{here}: a stage is a mapping with `steps` ({{task: steps}}) and an optional `name`")
            unknown = sorted(set(stage["steps"]) - set(PRETRAINING_TASKS))
            if unknown:
                raise HfExtError(f"{here}: unknown task(s) {', '.join(map(str, unknown))} (known: "
                                 f"{', '.join(PRETRAINING_TASKS)})")
            for task, steps in stage["steps"].items():
                if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
                    raise HfExtError(f"{here}: the steps of {task} must be a positive integer, got {quoted(steps)}")
            name = stage.get("name")
            if name is not None and not isinstance(name, str):
                raise HfExtError(f"{here}: name must be a string")
            stages.append(Stage(dict(stage["steps"]), name))
        return cls(tuple(stages))

    @classmethod
    def from_file(cls, path: str | Path) -> "ContinualSchedule":
        """A schedule from a YAML or JSON file (JSON is YAML); an alias bomb is refused (`BoundedYamlLoader`)."""
        import yaml

        path = Path(path)
        if not path.is_file():
            raise HfExtError(f"schedule file {path} does not exist")
        try:
            data = yaml.load(path.read_text(encoding="utf-8"), Loader=BoundedYamlLoader)
        except (yaml.YAMLError, UnicodeDecodeError) as error:
            raise HfExtError(f"schedule file {path} is not YAML/JSON: {str(error).splitlines()[0]}") from None
        return cls.from_dict(data, str(path))

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        return {"stages": [{**({"name": stage.name} if stage.name else {}), "steps": dict(stage.steps)}
                           for stage in self.stages]}

    @property
    def tasks(self) -> list[str]:
        """Every task the schedule trains, in order of first appearance."""
        return list(dict.fromkeys(task for stage in self.stages for task in stage.steps))


# The paper's continual scheme as the reference doc gives it (each task 50k steps in all; approximate, from the
# paper's comparison of training schemes).
PAPER_SCHEDULE = ContinualSchedule.from_dict({"stages": [
    {"name": "stage 1", "steps": {"knowledge_masking": 20000}},
    {"name": "stage 2", "steps": {"knowledge_masking": 10000, "capitalization": 30000}},
    {"name": "stage 3", "steps": {"knowledge_masking": 10000, "capitalization": 10000,
                                  "token_document_relation": 40000}},
    {"name": "stage 4", "steps": {"knowledge_masking": 10000, "capitalization": 10000,
                                  "token_document_relation": 10000, "sentence_reordering": 50000}},
]})


__all__ = ["PAPER_SCHEDULE", "ContinualSchedule", "Stage"]
