"""A training run stopped like a crash, for the tests that resume one (streams, checkpoints)."""

from transformers import TrainerCallback


class StopAtStep(TrainerCallback):
    """Stops a run like a crash once `step` is done (after a checkpoint of that step was written)."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise KeyboardInterrupt
