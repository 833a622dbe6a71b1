"""Training and evaluation on top of transformers' `Trainer`, `datasets`, `evaluate` and PEFT."""

from .optimus import (
    DECODER_LORA_TARGETS,
    ENCODER_LORA_TARGETS,
    LATENT_MODULES,
    BetaScheduleCallback,
    OptimusDataCollator,
    OptimusTrainer,
    finetune_optimus,
    frange_cycle_linear,
    frange_cycle_zero_linear,
    load_optimus_lora,
    load_text_dataset,
    optimus_core,
    optimus_lora,
)
from .trainer import StderrLogCallback, TermLoggingTrainer, TermMeans, send_logs_to_stderr
from .plots import (
    curves_from_log_history,
    plot_interpolation_table,
    plot_latent_space,
    plot_training_curves,
    project_to_plane,
    require_matplotlib,
)
from .mtdnn import (  # MT-DNN multi-task training; its names join __all__ below
    MTDNNCollator,
    MTDNNTrainer,
    MultiTaskBatchSampler,
    MultiTaskDataset,
    add_soft_labels,
    load_glue_tsv,
    load_mtdnn_json,
    load_mtdnn_lora,
    load_task_file,
    mtdnn_lora,
    teacher_soft_labels,
)
from ..metrics.optimus import evaluate_optimus_lm, optimus_lm_statistics

__all__ = ["BetaScheduleCallback", "DECODER_LORA_TARGETS", "ENCODER_LORA_TARGETS", "LATENT_MODULES",
           "OptimusDataCollator", "OptimusTrainer", "StderrLogCallback", "TermLoggingTrainer", "TermMeans",
           "send_logs_to_stderr",
           "curves_from_log_history",
           "evaluate_optimus_lm", "finetune_optimus", "frange_cycle_linear", "frange_cycle_zero_linear", "load_optimus_lora",
           "load_text_dataset", "optimus_core", "optimus_lm_statistics", "optimus_lora", "plot_interpolation_table",
           "plot_latent_space", "plot_training_curves", "project_to_plane", "require_matplotlib"]
__all__ += ["MTDNNCollator", "MTDNNTrainer", "MultiTaskBatchSampler", "MultiTaskDataset", "add_soft_labels",
            "load_glue_tsv", "load_mtdnn_json", "load_mtdnn_lora", "load_task_file", "mtdnn_lora", "teacher_soft_labels"]
from .universal_transformer import (  # noqa: E402  Universal Transformer algorithmic tasks, halting map, LoRA
    PositionOffsetCollator,
    UniversalTransformerTrainer,
    algorithmic_config,
    algorithmic_dataset,
    algorithmic_tokenizer,
    evaluate_algorithmic,
    halting_map,
    plot_halting_map,
    run_algorithmic,
    teacher_forced_accuracy,
    train_algorithmic,
    universal_transformer_lora,
    vanilla_transformer,
)
__all__ += ["PositionOffsetCollator", "UniversalTransformerTrainer", "algorithmic_config", "algorithmic_dataset",
            "algorithmic_tokenizer", "evaluate_algorithmic", "halting_map", "plot_halting_map", "run_algorithmic",
            "teacher_forced_accuracy", "train_algorithmic", "universal_transformer_lora", "vanilla_transformer"]
