"""The corpus of real metric names as a parametrised test: one case per key, each key published as
its trainer logs it (``tests/name_corpus.py``). The share read right is the benchmark's figure
(``bench/bench_names.py``, recorded in bench/RESULTS_NAMES.md); here every key must be read as
its code computes it, except the misses listed below, each with why (strict: a miss that starts
reading right must leave the list). A key marked ambiguous in the corpus (the same name means
different things in different codebases) must be read right, or as no phase, or with the read's
certainty lowered."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from tests.name_corpus import CORPUS, PARTS, PHASE_LABELS, Got, Row, load, read, right

WEIGHT_PUSH = "a weight push to the rollout engine, read as communication as the earlier parts label it"
ENCODER = ("a frozen encoder's forward, unread: an encode is host preparation in four other parts "
           "(encode_text, vae_encode)")
SUB_UPDATE = "one network's update of a two-network step named its step, read as the step"
MAE_CT = "a rank and a logging interval after the name (data_time/0/epoch): read as an epoch's"
METER_VAL = ("an AverageMeter's current value (_val), read as validation; the same code's "
             "diagnostics/train_time_val is an epoch's")
EPOCH_SUM = "printed; a phase summed over an epoch under the phase's name"
EPOCH_SUM_LOGGED = "a phase summed over an epoch, logged once an epoch, under the phase's name"
RL_UPDATE = "an RL learner's whole update (minibatches' forwards, backwards and one optimizer step)"
MODULE = "a trainable module's forward named by the module, no phase word"
LOSS_TERM = ("a loss term's computation labelled the forward, no phase word (a loss's time is no phase in "
             "six other keys)")
KNOWN_MISSES: dict[tuple[str, str], str] = {
    # printed only, a bare word beside others in a log line: no tap sees it, the name alone says no duration
    ("alex-petrenko/sample-factory", "calculate_losses"): "printed; no duration word",
    ("facebookresearch/dino", "data"): "printed MetricLogger meter; a bare 'data' is no duration",
    ("facebookresearch/mae", "data"): "printed MetricLogger meter; a bare 'data' is no duration",
    ("huggingface/pytorch-image-models", "Data"): "printed AverageMeter; a bare 'Data' is no duration",
    ("pytorch/examples", "Data"): "printed AverageMeter; a bare 'Data' is no duration",
    ("KellerJordan/modded-nanogpt", "train_time"): "printed; mmengine's preset reads train_time as the step",
    ("KellerJordan/modded-nanogpt", "step_avg"): "printed; no duration word",
    ("microsoft/DeepSpeed", "bwd_allreduce_microstep"): "printed in a 'time (ms)' line; no duration word",
    ("microsoft/DeepSpeed", "fwd_microstep"): "printed in a 'time (ms)' line; no duration word",
    ("microsoft/DeepSpeed", "pipe_send_output"): "printed in a 'time (ms)' line; no duration word",
    ("microsoft/DeepSpeed", "pipe_recv_grad"): "printed in a 'time (ms)' line; no duration word",
    ("microsoft/DeepSpeed", "batch_input"): "printed in a 'time (ms)' line; no duration word",
    ("NVIDIA/Megatron-LM", "forward-backward"): "printed by timers.log; no duration word (its TB name is read)",
    ("karpathy/llm.c", "total average iteration time"): "printed; an average over the run reads as a statistic",
    ("facebookresearch/torchbeast", "dequeue"): "printed; no duration word",
    # published
    ("Denys88/rl_games", "performance/step_time"): "environment steps summed over a rollout; step_time is the "
                                                   "training step almost everywhere else",
    ("google-research/big_vision", "z/secs/update0"): "the first step only; 'update0' reads as no phase",
    ("pytorch/torchtitan", "time_metrics/data_loading(%)"): "a share of the step, read (rightly) as data_wait's share",
    ("VLR-CVC/vlm-training", "perf/data_time_pct"): "a share of the wall time, read (rightly) as data_wait's share",
    ("volcengine/verl", "timing_s/old_log_prob"): "labelled another part here; the same words are a forward elsewhere",
    ("facebookresearch/habitat-lab", "perf/ppo.eval_actions"): "a forward inside the update named 'eval'",
    ("inclusionAI/AReaL", "timeperf/train_step"): "a PPO update (fwd+bwd+opt over minibatches) named train_step",
    ("inclusionAI/AReaL", "timeperf/critic_train_step"): "a critic's whole update named train_step",
    ("inclusionAI/AReaL", "timeperf/critic_values"): "a critic's forward: 'values' names no phase",
    ("inclusionAI/AReaL", "timeperf/load_bcast"): "ambiguous: a load and a broadcast in one timer",
    ("NVIDIA-NeMo/RL", "timing/train/prepare_for_generation/transfer_and_update_weights"):
        "'generation' in the namespace puts it outside the step",
    ("NVIDIA/NeMo-Aligner", "timers/init_logprobs"): "'init' reads as start-up",
    ("PrimeIntellect-ai/prime-rl", "time/forward_backward"): "ambiguous: spans the optimizer too",
    ("pytorch/rl", "time/optim"): "ambiguous: the whole optimisation loop named optim",
    ("pytorch/rl", "time/train/sample"): "a replay buffer's sample: 'sample' alone names no phase",
    ("tinygrad/tinygrad", "train/train_step_time"): "ambiguous: a step time without its data wait",
    ("vwxyzjn/cleanba", "stats/params_queue_get_time"): "ambiguous: an actor's wait for weights",
    ("vwxyzjn/cleanba", "stats/rollout_queue_get_time"): "a queue's get reads as the DFlash queue's wait",
    # the fourth held-out part, scored once; these two left after its other misses taught the vocabulary
    ("huggingface/nanoVLM", "training_stats/max_data_load_time"): "a max over ranks reads as a statistic",
    ("huggingface/nanoVLM", "training_stats/max_fw_bw_time"): "a max over ranks reads as a statistic",
    # the fifth held-out part (33 new repositories), scored once before any of its misses were looked at;
    # these left after its other misses taught the vocabulary (v6: etime, a device's time, a timer's diff,
    # gradients applied and computed)
    ("facebookresearch/jepa", "wall-time(ms)"): "a CSV column; 'wall time' is seconds since the start in "
                                                "fairseq and fairseq2: the name alone cannot say per step",
    ("THUDM/GLM", "Train/elapsed_time"): "a bare elapsed_time is seconds since the start in three other "
                                         "corpus trainers; the interval's here",
    ("dmlc/dgl", "sample+data_copy"): "printed; no duration word",
    ("dmlc/dgl", "forward"): "printed; no duration word",
    ("dmlc/dgl", "backward"): "printed; no duration word",
    ("awslabs/dgl-ke", "forward"): "printed; no duration word",
    ("awslabs/dgl-ke", "backward"): "printed; no duration word",
    ("PaddlePaddle/PaddleNLP", "read-data"): "printed by a timer's log line; no duration word",
    ("PaddlePaddle/PaddleNLP", "forward-backward"): "printed by a timer's log line; no duration word",
    ("PaddlePaddle/PaddleNLP", "all-reduce"): "printed by a timer's log line; no duration word",
    ("PaddlePaddle/PaddleNLP", "optimizer-step"): "printed by a timer's log line; no duration word",
    ("THUDM/GLM", "backward"): "printed by timers.log; no duration word",
    ("THUDM/GLM", "allreduce"): "printed by timers.log; no duration word",
    ("THUDM/GLM", "optimizer"): "printed by timers.log; no duration word",
    ("THUDM/GLM", "batch generator"): "printed by timers.log; no duration word",
    ("THUDM/GLM", "data loader"): "printed by timers.log; no duration word",
    ("facebookresearch/maskrcnn-benchmark", "data"): "printed MetricLogger meter; a bare 'data' is no duration",
    ("pytorch/vision", "data"): "printed MetricLogger meter; a bare 'data' is no duration",
    ("facebookresearch/moco", "Data"): "printed AverageMeter; a bare 'Data' is no duration",
    ("jik876/hifi-gan", "s/b"): "printed; seconds per batch in a log line, no phase word",
    ("PixArt-alpha/PixArt-alpha", "time_all"): "printed; 'all' names no phase",
    # the sixth held-out part (34 new repositories), scored once with the v6 reader before any of its
    # misses were looked at (3/5 published phase timings, 1/101 non-phase read as a phase); these left after
    # v7 took its general lessons (an uncertain step beside an episode, a phase word glued to 'time',
    # what a duration spans after 'including')
    ("borisdayma/dalle-mini", "time/train_per_log"): "a sum of one log interval's steps: a per-log total is "
                                                     "a statistic of many steps, 'log' rightly no phase",
    ("PaddlePaddle/PARL", "learn_time_s"): "the learner's update on one batch (fwd+bwd+optimizer), but RLlib's "
                                           "timers/learn_time_ms spans all SGD epochs of a train batch and "
                                           "PufferLib's learn_time is cumulative: 'learn' is no phase word",
    ("open-mmlab/OpenPCDet", "Forward time"): "printed; its timer runs to the optimizer step: the name says forward",
    ("open-mmlab/OpenPCDet", "d_time"): "printed tqdm postfix; a one-letter 'd' (a GAN's discriminator as often)",
    ("open-mmlab/OpenPCDet", "b_time"): "printed tqdm postfix; a one-letter 'b' abbreviation",
    ("FoundationVision/VAR", "data"): "printed MetricLogger meter; a bare 'data' is no duration",
    ("MCG-NJU/VideoMAE", "data"): "printed MetricLogger meter; a bare 'data' is no duration",
    ("facebookresearch/simsiam", "Data"): "printed AverageMeter; a bare 'Data' is no duration",
    ("Pointcept/Pointcept", "Data"): "printed timer; a bare 'Data' is no duration",
    ("Pointcept/Pointcept", "Batch"): "printed timer; a bare 'Batch' is no duration",
    ("ostris/ai-toolkit", "get_batch"): "printed by a timer's log line; no duration word",
    ("ostris/ai-toolkit", "train_loop"): "printed by a timer's log line; no duration word",
    ("ostris/ai-toolkit", "predict_unet"): "printed by a timer's log line; no duration word",
    ("ostris/ai-toolkit", "calculate_loss"): "printed by a timer's log line; no duration word",
    ("ostris/ai-toolkit", "backward"): "printed by a timer's log line; no duration word",
    ("ostris/ai-toolkit", "optimizer_step"): "printed by a timer's log line; no duration word",
    ("Tencent/PatrickStar", "FWD"): "printed by a profiler's table; no duration word (a bare phase word is "
                                    "as often a count or a flag)",
    ("Tencent/PatrickStar", "BWD"): "printed by a profiler's table; no duration word",
    ("Tencent/PatrickStar", "ADAM"): "printed by a profiler's table; no duration word",
    ("Tencent/PatrickStar", "HOOK_torch_allreduce"): "printed by a profiler's table; no duration word",
    ("Tencent/PatrickStar", "CLIENT_fetch_remote_chunks"): "printed by a profiler's table; no duration word",
    ("Tencent/PatrickStar", "elaspe"): "printed; a misspelt 'elapse'",
    ("NVIDIA/BigVGAN", "s/b"): "printed; seconds per batch in a log line, no phase word",
    ("NVlabs/imaginaire", "Generator LOS time"): "printed; 'LOS' (loss) abbreviated",
    ("NVlabs/imaginaire", "Generator BCK time"): "printed; 'BCK' (backward) abbreviated: no trainers' word "
                                                 "(a backup or a background elsewhere)",
    ("NVlabs/imaginaire", "Generator STP time"): "printed; 'STP' (here the optimizer step) abbreviated",
    ("NVlabs/imaginaire", "Discriminator BCK time"): "printed; 'BCK' (backward) abbreviated",
    ("NVlabs/imaginaire", "Discriminator STP time"): "printed; 'STP' (here the optimizer step) abbreviated",
    # the seventh held-out part (25 new repositories, mostly published timings), scored once with the v7
    # reader before any of its misses were looked at (25/33 published phase timings, 1/154 non-phase read
    # as a phase); left after v8
    ("KaiyangZhou/deep-person-reid", "Train/data"): "a meter's bare 'data' under Train/: no duration word",
    ("modelscope/FunASR", "stats_rank0_data_load/train"): "'data_load' with no duration word; the unit is "
                                                           "only in the code",
    ("jasonppy/VoiceCraft", "train/train_time"): "a duration of no phase word: 'train time' "
                                                 "is since the start in other trainers",
    ("alibaba/ChatLearn", "engine/timer_summary/episode"): "an RL episode (generation, training, sync) is "
                                                           "this trainer's step; 'episode' is outside it elsewhere",
    ("saforem2/ezpz", "train/dtf"): "'dtf': a letter glued to 'dt' (forward) is no word",
    ("saforem2/ezpz", "dtf"): "'dtf': a letter glued to 'dt' (forward) is no word",
    ("facebookresearch/SLIP", "Data"): "printed AverageMeter; a bare 'Data' is no duration",
    # the eighth held-out part (22 new repositories), scored once with the v7 reader before any of its
    # misses were looked at (4/9 published phase timings, 1/86 non-phase read as a phase); left after v8
    ("Deci-AI/super-gradients", "timer/train_batch_gradient_time"): "the optimizer's gradient step read as "
                                                                    "the backward: a gradient alone is",
    ("ContinualAI/avalanche", "Time_MB/train_phase/train_stream/Task000"): "'MB' (minibatch) abbreviated in "
                                                                           "the namespace: no phase word",
    ("ContinualAI/avalanche", "RunningTime_Epoch/train_phase/train_stream/Task000"): "a running mean of the "
                                                                                     "iterations named by its "
                                                                                     "epoch: no phase word",
    ("haosulab/ManiSkill", "time/step"): "an env step count under time/ read as the step's duration (the "
                                         "non-phase read as a phase)",
    ("salesforce/warp-drive", "Mean training time per iter (ms)"): "printed; the learner's update per "
                                                                   "iteration read as the iteration",
    ("salesforce/warp-drive", "Mean total time per iter (ms)"): "printed; 'total' read as a statistic",
    # the ninth held-out part (32 new repositories), scored once with the v8 reader before any of its misses
    # were looked at (28/42 published phase timings, 5/137 non-phase read as a phase); left after v9 took its
    # general lessons (a / inside brackets, a time per step written as a ratio, the time between steps)
    ("PKU-Alignment/omnisafe", "Time/Epoch"): "an RL epoch is this trainer's iteration; an epoch is outside "
                                              "the step everywhere else",
    ("tianweiy/CenterPoint", "forward_time/train"): "ambiguous: a running offset from the last iteration's "
                                                    "end, no forward's own time",
    ("DeepVAC/deepvac", "TRAIN/AverageBatchTrainTime(secs/epoch)"): "a batch's mean over the epoch, read as a "
                                                                    "time per epoch",
    ("DeepVAC/deepvac", "TRAIN/AverageBatchLoadDataTime(secs/epoch)"): "a batch's mean over the epoch, read as "
                                                                       "a time per epoch",
    ("LBANN/lbann", "model0/layer1/fp_time"): "one layer's forward: a component's part is no phase of the "
                                              "step (and 'fp' no trainers' word)",
    ("LBANN/lbann", "model0/layer1/bp_time"): "one layer's backward: a component's part",
    ("LBANN/lbann", "model0/layer1/opt_time"): "one layer's optimizer step: a component's part",
    ("LBANN/lbann", "model0/objective_evaluation_time"): "the loss's forward named 'evaluation': read as an "
                                                         "evaluation, outside the step",
    ("LBANN/lbann", "model0/objective_differentiation_time"): "'differentiation' (the backward) is no "
                                                              "trainers' word",
    ("microsoft/msrflute", "communicationCostsMean"): "a federated client's round trip, read as the step's "
                                                      "communication: the non-phase read as a phase",
    ("apple/pfl-research", "duration of iteration (s)"): "a federated round of many clients' training named "
                                                         "an iteration: the non-phase read as a phase",
    ("apple/pfl-research", "overall average duration of iteration (s)"): "a federated round's mean since the "
                                                                         "start, read as the step",
    ("NVIDIA/bionemo-framework", "timing_train/seconds_from_batch_start_to_before_optimizer_step_step"):
        "an interval from one point to another ('from batch start to before optimizer step'): no phase word",
    ("NVIDIA/bionemo-framework", "timing_train/seconds_from_batch_start_to_before_optimizer_step_epoch"):
        "the same interval's epoch mean",
    ("m2lines/Samudra", "train/batch/data_load_time"): "an asynchronous loader's own time, no wait of the loop: "
                                                       "the non-phase read as a phase",
    ("erfanzar/EasyDeL", "train/execution_time"): "'execution' names no phase",
    ("erfanzar/EasyDeL", "train-mlperf/execution_time"): "'execution' names no phase",
    ("aidecentralized/sonar", "train_time"): "a round's local training of many batches, read as the step "
                                             "(uncertain): the non-phase read as a phase",
    ("NVlabs/neuralangelo", "Model BCK time"): "printed; 'BCK' (backward) abbreviated",
    ("NVlabs/neuralangelo", "Model STP time"): "printed; 'STP' (the optimizer step) abbreviated",
    # the tenth held-out part (28 new repositories, chosen for distributed-training timings), scored once with
    # the v9 reader before any of its misses were looked at (54/68 published phase timings, 1/78 non-phase read
    # as a phase); left after v10 took its general lesson (a mean of a bare time)
    ("a-r-r-o-w/finetrainers", "timing/batch_preparation"): "a batch's host-side preparation, labelled the data "
                                                             "wait here: the reader keeps host preparation apart",
    ("dptech-corp/Uni-Core", "train_inner_train_wall"): "fairseq's wall-clock words: 'wall' is since the start "
                                                        "elsewhere",
    ("alibaba-damo-academy/FunCodec", "metrics/iter_time"): "ESPnet's iter_time, the data wait: read as the "
                                                            "step with its certainty lowered (ambiguous)",
    ("alibaba-damo-academy/FunCodec", "train/train_time"): "a duration of no phase word: 'train time' is since "
                                                           "the start in other trainers",
    ("google-research/vmoe", "train/step_seconds_per_device"): "ambiguous: a compiler's cost estimate, no measured "
                                                               "time: the non-phase read as a phase",
    ("microsoft/Megatron-DeepSpeed", "optimizer-clip-main-grad-time"): "clipping inside the optimizer step, "
                                                                       "read (like Megatron-LM's) as a part "
                                                                       "of no phase",
    ("exalsius/diloco-training", "timing/forward_pass_total"): "a running total keeps the forward's label here; "
                                                               "a part's total is a statistic to the reader",
    ("exalsius/diloco-training", "timing/batch_preparation_avg"): "a host-to-device copy labelled the data wait",
    ("exalsius/diloco-training", "performance/time_per_sample"): "a forward's time per sample: a cost per item",
    ("exalsius/diloco-training", "timing/outer_sync_avg"): "a bare 'sync' (an outer optimizer's all-reduce "
                                                           "here, a device synchronize elsewhere) names no phase",
    ("exalsius/diloco-training", "training/sync_time"): "a bare 'sync' names no phase",
    ("mbanani/lgssl", "time/data_transfer"): "a host-to-device copy labelled the data wait",
    ("yyyang404/DCTransformer-JPEG-Artifact-Removal", "perf/transfer_time"): "a host-to-device copy labelled the "
                                                                             "data wait",
    ("yyyang404/DCTransformer-JPEG-Artifact-Removal", "perf/step_time"): "ambiguous: clipping and optimizer.step() "
                                                                         "named step_time, read as the step",
    ("openai/phasic-policy-gradient", "del_time"): "printed; 'del' (a time difference) abbreviated",
    ("instadeepai/jumanji", "train//time"): "a bare time under train/ read as the step (uncertain; its numbers, "
                                            "since the start, settle it in a running daemon)",
    # the eleventh held-out part (34 new repositories, many of them forks of known trainers), scored once with
    # the final reader (v10 and the review's fixes) before any of its misses were looked at (49/52 published
    # phase timings, 1/179 non-phase read as a phase); left after v11 (a loss scaler's unscale is no phase)
    ("poodarchu/Det3D", "forward_time/train"): "ambiguous: a running offset from the last iteration's end, no "
                                               "forward's own time",
    ("microsoft/GLIP", "data"): "printed MetricLogger meter; a bare 'data' is no duration",
    ("GATECH-EIC/BNS-GCN", "Reduce(s)"): "printed; a bare 'reduce' (of what?) names no collective",
    ("thuml/iTransformer", "speed"): "printed; seconds per iteration named 'speed'",
    ("PixArt-alpha/PixArt-sigma", "time_all"): "printed; 'all' names no phase",
    ("flashlight/flashlight", "bch(ms)"): "printed; 'bch' (batch) abbreviated",
    ("flashlight/flashlight", "smp(ms)"): "printed; 'smp' (sample) abbreviated",
    ("flashlight/flashlight", "crit-fwd(ms)"): "printed; the criterion's forward, read as the forward",
    ("starVLA/starVLA", "timing/model"): "'model' names no phase (the step's compute here)",
    ("thinking-machines-lab/tinker-cookbook", "time_total"): "a bare total reads as a statistic of many steps",
    ("thinking-machines-lab/tinker-cookbook", "time/total"): "a bare total under time/ reads as a statistic",
    # the twelfth held-out part (31 new repositories, timers the trainers named themselves, no framework's
    # names), scored once with v11 before any of its misses were looked at (13/29 published phase timings,
    # 5/91 non-phase read as a phase); left after v12 (runtime/ holds durations, seconds per step under a
    # throughput namespace, what runs after a step, a rate in square brackets)
    ("microsoft/Semi-supervised-learning", "train/run_time"): "'run time' is a run's whole time elsewhere "
                                                              "(train_runtime)",
    ("daveredrum/ScanRefer", "mean_fetch_time"): "printed; a fetch that includes a host-side copy, read as the "
                                                 "data wait",
    ("young-geng/CQL", "train_time"): "an epoch of many gradient steps and an evaluation, read as the step "
                                      "(uncertain): the non-phase read as a phase",
    ("PrimeIntellect-ai/OpenDiloco", "time_taken"): "'taken' names no phase",
    ("facebookresearch/atlas", "runtime/model_update"): "a model's update is the learner's whole update to the "
                                                        "reader; the optimizer step here",
    ("ServiceNow/PipelineRL", "throughput/sec_per_pass"): "'pass' alone names no phase",
    ("ServiceNow/PipelineRL", "stats/time_waiting_for_data"): "a trainer's wait for generated rollouts, read as "
                                                              "the data wait: the non-phase read as a phase",
    ("google/nerfies", "time/total"): "a bare total under time/ reads as a statistic (the step's whole here, "
                                      "the run's in other trainers)",
    ("zju3dv/EasyVolcap", "TRAIN/batch"): "a bare 'batch' with no duration word",
    ("hysts/pytorch_image_classification", "Train/Time"): "an epoch's time, read as the step (uncertain): the "
                                                          "non-phase read as a phase",
    ("davidcpage/cifar10-fast", "train time"): "printed; an epoch's time, read as the step (uncertain)",
    ("NVIDIA/retinanet-examples", "fw"): "printed; a bare 'fw' with no duration word",
    ("xingyizhou/CenterNet", "train_time"): "an epoch's time, read as the step (uncertain): the non-phase read "
                                            "as a phase",
    ("xingyizhou/CenterNet", "Data"): "printed; a bare 'Data' is no duration",
    ("xingyizhou/CenterNet", "Net"): "printed; a bare 'Net' is no duration",
    ("IntelLabs/distiller", "Performance/Training/Time"): "'training time' is since the start in other trainers",
    ("SurrealAI/surreal", ".core/learn_time_s"): "'learn' names no phase (see PARL's learn_time_s)",
    ("SurrealAI/surreal", ".core/publish_time_s"): "'publish' (of weights to a parameter server) names no "
                                                   "collective",
    ("SurrealAI/surreal", "performance/total_learn_time"): "a total of 'learn' reads as a statistic",
    ("HorizonRobotics/alf", "time/replay"): "a bare 'replay' (a replay buffer's sample) names no phase",
    # the thirteenth and fourteenth held-out parts (41 and 27 new repositories, timers the trainers named
    # themselves: vision/NLP/diffusion/3D, and RL/speech/graph/science), scored once with v12 before any of
    # their misses were looked at (published: 1/3 and 4/8 phase timings, 0/66 and 1/68 non-phase read as a
    # phase); left after v13 (a misspelt phase word is read as meant)
    ("microsoft/VQ-Diffusion", "fbward_time"): "printed; 'fbward' (forward and backward) abbreviated",
    ("shunsukesaito/PIFu", "dataT"): "printed; 'T' for time abbreviated",
    ("shunsukesaito/PIFu", "netT"): "printed; 'T' for time abbreviated",
    ("junyanz/pytorch-CycleGAN-and-pix2pix", "data"): "printed; a bare 'data' is no duration",
    ("mkocabas/VIBE", "data"): "printed; a bare 'data' is no duration",
    ("mkocabas/VIBE", "forward"): "printed in a timing line; no duration word",
    ("mkocabas/VIBE", "backward"): "printed in a timing line; no duration word",
    ("mkocabas/VIBE", "batch"): "printed in a timing line; no duration word",
    ("HobbitLong/SupContrast", "BT"): "printed; 'BT' (batch time) abbreviated",
    ("HobbitLong/SupContrast", "DT"): "printed; 'DT' (data time) read as a bare dt, the step (uncertain)",
    ("LeeDoYup/FixMatch-pytorch", "train/run_time"): "a run's time: no phase word (see Semi-supervised-learning)",
    ("ruotianluo/self-critical.pytorch", "Read data"): "printed; no duration word",
    ("amdegroot/ssd.pytorch", "timer"): "printed; a bare 'timer' names no phase",
    ("hszhao/semseg", "Data"): "printed AverageMeter; a bare 'Data' is no duration",
    ("hszhao/semseg", "Batch"): "printed AverageMeter; a bare 'Batch' is no duration",
    ("CSAILVision/semantic-segmentation-pytorch", "Data"): "printed; a bare 'Data' is no duration",
    ("yassouali/pytorch-segmentation", "B"): "printed; 'B' (batch time) abbreviated",
    ("yassouali/pytorch-segmentation", "D"): "printed; 'D' (data time) abbreviated",
    ("bearpaw/pytorch-classification", "Data"): "printed; a bare 'Data' is no duration",
    ("bearpaw/pytorch-classification", "Batch"): "printed; a bare 'Batch' is no duration",
    ("NVlabs/MUNIT", "Elapsed time in update"): "printed; a GAN's update reads as a learner's update, no phase",
    ("KellerJordan/cifar10-airbench", "time_seconds"): "printed; a running sum over the run read as a bare "
                                                       "duration, the step (uncertain)",
    ("HRNet/deep-high-resolution-net.pytorch", "Data"): "printed AverageMeter; a bare 'Data' is no duration",
    ("hengyuan-hu/bottom-up-attention-vqa", "time"): "printed; an epoch's time read as a bare time (uncertain)",
    ("facebookresearch/VideoPose3D", "time"): "printed; an epoch's time read as a bare time (uncertain)",
    ("txie-93/cgcnn", "Data"): "printed AverageMeter; a bare 'Data' is no duration",
    ("YuanGongND/ast", "Per Sample Total Time"): "printed; a time per sample is a cost per item",
    ("YuanGongND/ast", "Per Sample Data Time"): "printed; a time per sample is a cost per item",
    ("YuanGongND/ast", "Per Sample DNN Time"): "printed; a time per sample is a cost per item",
    ("automl/PFNs", "time"): "printed; an epoch's time read as a bare time (uncertain)",
    ("rail-berkeley/bridge_data_v2", "timer/total"): "a bare total under timer/ reads as a statistic (octo's "
                                                     "timer, as there)",
    ("rail-berkeley/bridge_data_v2", "timer/train"): "a bare 'train' under timer/ names no phase (octo's timer; "
                                                     "the learner's update in serl's)",
    ("seohongpark/ogbench", "time/epoch_time"): "a step's mean over the log interval named 'epoch_time'",
    ("SeanNaren/deepspeech.pytorch", "Data"): "printed AverageMeter; a bare 'Data' is no duration",
    ("eloialonso/iris", "duration"): "an epoch's time (in hours) read as a bare duration, the step "
                                     "(uncertain; its numbers, many steps' time, settle it in a daemon)",
    ("atomicarchitects/equiformer", "Time"): "printed; an epoch's time read as a bare time (uncertain)",
    ("maziarraissi/PINNs", "Time"): "printed; ten steps' sum read as a bare time (uncertain)",
    ("PredictiveIntelligenceLab/jaxpi", "Time"): "printed; a log interval's sum read as a bare time (uncertain)",
    ("clvrai/spirl", "compute"): "printed; no duration word",
    ("clvrai/spirl", "total"): "printed; no duration word",
    ("haosulab/ManiSkill2-Learn", "train/episode_time"): "an RL iteration named an episode: outside the step",
    ("Tencent-Hunyuan/Prism", "Time/data_time"): "input preparation inside the step named data_time (beside the "
                                                 "loader's own Time/dataloader_time): read as the data wait",
    ("NVlabs/Mosaic3D", "time/training"): "a forward and its loss named 'training': no phase word",
    ("NVlabs/Mosaic3D", "train/time/training"): "a forward and its loss named 'training': no phase word",
    ("cvkdnk/polar_fusion", "time/backward"): "the loss computation named backward",
    ("ADIOCLASSMATE/DiRL", "time/step"): "a count of steps under time/, read as the step by its name (in a daemon "
                                         "its numbers settle it: a running total)",
    ("ADIOCLASSMATE/DiRL", "time/optimizer_step"): "a count of optimizer steps under time/, read as the optimizer "
                                                   "(in a daemon its numbers settle it: a running total)",
    ("unilabsim/UniLab", "timing/learner_weight_sync_ms"): "the learner's push of its weights to the collector, "
                                                           "read as communication as the earlier parts label "
                                                           "a weight push (labelled no phase here)",
    ("stepjam/YARR", "monitoring/sample_time_per_item"): "a replay sample's time per item is a cost per item",
    ("stepjam/YARR", "monitoring/train_time_per_item"): "a step's time per item is a cost per item",
    # the seventeenth and eighteenth parts, scored once with v14; what is left after v15 (a compute time,
    # housekeeping)
    ("mkrum/stonefish", "timing/total_ms"): "a bare total reads as a statistic of many steps",
    ("Arora-group-codebase/klib", "time/dataloader"): "a loader's running total (KDataLoader.total_load_time) "
                                                      "under a phase's name (in a daemon its numbers settle it)",
    **{("ComeRochas/sEMGencoderJEPA", key): EPOCH_SUM_LOGGED
       for key in ("time/data", "time/fwd", "time/bwd", "time/opt", "time/data_emg", "time/fwd_audio", "time/bwd_emg")},
    **{("FlorentTariolle/sls-wm", key): EPOCH_SUM_LOGGED for key in ("time/data", "time/fwd", "time/bwd", "time/opt")},
    ("technicolor-research/sodeep", "Data"): "printed AverageMeter; a bare 'Data' is no duration",
    ("MarcoDotIO/mighty-giant", "fwd"): "printed; no duration word",
    ("MarcoDotIO/mighty-giant", "total"): "printed; no duration word",
    ("RobbenRibery/curious", "perf/clip_grad_seconds"): "gradient clipping alone names no phase (the optimizer's "
                                                        "part in Megatron, no phase in the earlier parts' labels)",
    ("RobbenRibery/curious", "perf/sglang_weight_sync_seconds"): "a weight push to the rollout engine, read as "
                                                                 "communication as the earlier parts label it",
    ("rllm-org/rllm", "time/weight_sync"): "a weight push to the rollout engine, read as communication as the "
                                           "earlier parts label it",
    ("vivekvkashyap/history-of-rlvr", "train/step_time_s"): "a weight sync, forward and backward named the step",
    ("vivekvkashyap/history-of-rlvr", "train/train_s"): "a forward and backward named 'train': no phase word",
    ("alpha-unito/xffl", "time/Aggregation"): "a federated aggregation of models: no phase word",
    ("dzorlu/distributed-training", "sec_per_step"): "a forward and backward named the step (its optimizer "
                                                     "outside)",
    # the nineteenth and twentieth parts, scored once with v15
    ("dilawarm/assignment1-basics", "batch_time"): "get_batch's time named batch_time, the whole step in PyTorch's "
                                                   "ImageNet example and the AverageMeter trainers",
    ("dilawarm/assignment1-basics", "min_step_time"): "the least of the last 100 steps: a statistic of many steps",
    ("dilawarm/assignment1-basics", "max_step_time"): "the most of the last 100 steps: a statistic of many steps",
    ("Nishant-aiml/IVERI-HYBRID-SLM-MODEL", "timing/dataloader_seconds"): "the batch's unpacking and copy named the "
                                                                          "loader (its timer starts after the loader)",
    ("jiayiliu12/speedy-splat_forked", "time/total_iteration [ms]"): "render, loss and backward named the iteration",
    ("jiayiliu12/speedy-splat_forked", "benchmark/iter_mean_ms"): "a mean of render, loss and backward named the "
                                                                  "iteration",
    ("jiayiliu12/LiteGS_forked", "time/render/Binning [ms]"): "a part of the render, its forward: no phase word",
    ("jiayiliu12/LiteGS_forked", "time/render/CreateCov2dDirectly [ms]"): "a part of the render, its forward: no "
                                                                          "phase word",
    ("jiayiliu12/LiteGS_forked", "time/render_preprocess(cluster culling) [ms]"): "the render's culling, its forward: "
                                                                                  "no phase word",
    # the twenty-first part, scored once with v16
    ("asdfo123/ForgeWM", "timing/data_load_ms"): "the batch's copy to the device named a data load (the loader's wait "
                                                 "in project-ochre's same name)",
    ("PRIV-Creation/UniDiffusion", "time/unet"): "the UNet's forward named by the network: no phase word",
    ("PRIV-Creation/UniDiffusion", "time/update"): "the backward and the optimizer named an update: a learner's update "
                                                   "elsewhere",
    ("HansPolo113/FAIL", "time/total"): "a bare total reads as a statistic of many steps",
    ("peanutChowder/project-ochre", "timing/idm_ms"): "an inverse-dynamics head's forward named by its acronym",
    # the twenty-second part, scored once with v16
    **{("mikasenghaas/diloco-swarm", key): "a timer's current value under a bare time: no phase word"
       for key in ("train/local/time/current", "train/local/micro_time/current", "train/global/time/current",
                   "train/global/micro_time/current")},
    ("JayDS22/Multi-GPU-Distributed-Training-Framework", "Performance/ComputeTime"): "a forward and backward named "
                                                                                     "the compute: the step, uncertain",
    ("JayDS22/Multi-GPU-Distributed-Training-Framework", "Performance/CommunicationTime"): "the optimizer step named "
                                                                                           "communication",
    ("JayDS22/Multi-GPU-Distributed-Training-Framework", "Training/comm_time"): "the optimizer step named "
                                                                                "communication",
    **{("QErywan/RobustDiLoCo", f"timing/window_total/{stat}"): "a DiLoCo window (its outer step) named a total: "
       "a statistic of many steps" for stat in ("total", "mean", "max")},
    ("QErywan/RobustDiLoCo", "timing/reduce_metrics/total"): "an all-reduce of metrics named a reduce of metrics "
                                                             "(reduce names communication of gradients only)",
    ("PolymathicAI/multiple_physics_pretraining", "time/train_data_time"): "the data wait summed over an epoch, "
                                                                           "under the phase's name",
    ("Arpit-Rajvanshi/FEDNE", "Time/Communication"): "a federated round's broadcast and upload, read as the step's "
                                                     "communication",
    ("PolymathicAI/multiple_physics_pretraining", "Forward"): "printed; no duration word",
    ("PolymathicAI/multiple_physics_pretraining", "Backward"): "printed; no duration word",
    ("PolymathicAI/multiple_physics_pretraining", "Optimizer"): "printed; no duration word",
    ("PolymathicAI/the_well", "total_time"): "printed; a bare total reads as a statistic of many steps",
    ("PolymathicAI/the_well", "batch time"): "printed; the loader's wait named batch time (the whole step in "
                                             "PyTorch's ImageNet example)",
    ("PolymathicAI/the_well", "backward time"): "printed; the backward and the optimizer named the backward",
    # the twenty-third and twenty-fourth parts, scored once with v19
    ("LINYUNLinYun/cs336-assignment5-alignment", "time/weight_sync_seconds"): WEIGHT_PUSH,
    ("songmzhang/KDFlow", "train/weight_update_time"): WEIGHT_PUSH,
    ("shougangu/balance-budget", "timing/weight_sync_seconds"): WEIGHT_PUSH,
    ("siyanabandrova-dotcom/ES", "time/broadcast"): WEIGHT_PUSH,
    ("shougangu/balance-budget", "timing/rollout_logps_seconds"): "the rollouts' log-probs, a forward, refused for "
                                                                 "its 'rollout'",
    ("antoinenguyen27/RETRO-GRPO", "time/optimizer_step_s"): "the whole step named the optimizer step",
    ("siyanabandrova-dotcom/ES", "time/update"): "an evolution strategy's update of the weights named an update",
    ("proesn/Self-Distillation", "time/loss"): "two forwards and the loss named the loss",
    ("gmlwns2000/ocr", "time/cycle"): "a GAN's update loop named a cycle, read as the step",
    ("gmlwns2000/ocr", "time/all"): "the previous iteration's whole beside a step read already (time/cycle)",
    # the twenty-fifth and twenty-sixth parts, scored once with v20
    ("bjing2016/alphaflow", "iter_dur"): "dur is no duration word: in speech code an utterance's length or a "
                                         "duration predictor's loss (tr/dur)",
    ("Nuclear-Physics-with-Machine-Learning/JAX_QMC_Public", "time/jacobian"): "a Jacobian of the parameters; "
                                                                              "elsewhere a solver's (no backward)",
    ("acadev/DiffuseBioMol", "timing/load_prepare_s"): "a load and a preparation in one timer: a part of no phase "
                                                       "(a start-up's load_and_tokenize as often)",
    ("bjing2016/alphaflow", "train_dur"): "the step's duration under train_: dur is no duration word",
    ("bjing2016/alphaflow", "iter_time"): "a flow-matching noise level t, no duration (uncertain step)",
    ("Nuclear-Physics-with-Machine-Learning/JAX_QMC_Public", "time/observables"): "a wavefunction's forward named "
                                                                                 "its observables",
    ("Nuclear-Physics-with-Machine-Learning/JAX_QMC_Public", "time/normalization"): "an MPI all-reduce named a "
                                                                                   "normalization",
    ("brunompacheco/pideq", "train_time_loss"): "a physics loss's forward: a loss beside no phase word",
    ("zengfeilong/ServoVLA", "perf/encoder_time"): ENCODER,
    ("zengfeilong/ServoVLA", "perf/vision_encoder_time"): ENCODER,
    ("zengfeilong/ServoVLA", "perf/vlm_encoder_time"): ENCODER,
    ("zengfeilong/ServoVLA", "perf/avg_vlm_encoder_time"): ENCODER,
    ("zengfeilong/ServoVLA", "perf/avg_wall_time"): "the wall time since the last log per step: a wall time of no "
                                                    "step word reads as since the start",
    ("VincentWangzt/optical-adaptor", "system/seconds_per_update"): "the whole step named an update (a part of no "
                                                                    "phase)",
    ("VincentWangzt/optical-adaptor", "timing/vision_adapter"): ENCODER,
    ("NsurrenderX/lola_lerobot", "timing/fwd_device_s"): "a host-to-device copy inside the forward, read as the "
                                                         "forward",
    ("NsurrenderX/lola_lerobot", "timing/fwd_preprocess_s"): "preprocessing inside the forward, read as the forward",
    ("wikiahuang/floverse", "time/planner_step"): SUB_UPDATE,
    ("wikiahuang/floverse", "time/refiner_step"): SUB_UPDATE,
    ("yxanul/testing_dense", "train/micro_step_time"): "a micro-batch's forward and backward, read as the step (a "
                                                       "micro-batch's time is the step in two other parts)",
    ("rcloyd/torchft", "timing/step_ms"): "the inner optimizer step named the step",
    ("rcloyd/torchft", "timing/boundary_step_ms"): "a DiLoCo outer sync named a boundary step",
    ("rcloyd/torchft", "timing/outer_step_ms"): "a DiLoCo outer step of many inner steps, read as the step",
    # the twenty-seventh and twenty-eighth parts, scored once with v21
    ("duoan/TinySigLIP", "train/step_time_ms"): "the backward and the optimizer named the step",
    ("ml-jku/MAE-CT", "profiling/trainer/data_time/0/epoch"): MAE_CT,
    ("ml-jku/MAE-CT", "profiling/trainer/update_time/0/epoch"): MAE_CT,
    ("ml-jku/MAE-CT", "profiling/trainer/iter_time/0"): "the loader's start, once, named iter_time",
    ("allenai/hidden-networks", "train/Time_val"): METER_VAL,
    ("allenai/hidden-networks", "train/Data_val"): METER_VAL,
    ("allenai/hidden-networks", "train/Data_avg"): "a meter's mean of the loader's wait: a bare 'Data' is no duration",
    ("Ledzy/BAdam", "train/step_time"): "the optimizer step alone named the step",
    ("ZO-Bench/ZO-LLM", "step_consumption"): "the step's time named its consumption (memory's as often)",
    ("Cherry-love-math/FedDHP", "time/train_wall_excl_eval_sec"): "a federated round named a train wall time",
    ("timinar/iceaggr", "timing/data_load_sec"): "a host-to-device copy named the data load",
    ("megvii-research/mdistiller", "Time(data)"): "printed; a tuple unpack named the data time",
    # a deliberate disagreement: RLlib's preset reads a synchronous sampler as the learner's input
    ("ray-project/ray", "timers/sample_time_ms"): "the preset reads the learner's wait for its synchronous "
                                                  "rollouts as its data wait (as wait_rollouts_time is read); "
                                                  "this part labels rollout collection outside the step",
    # the twenty-ninth and thirtieth parts, scored once with v21
    ("MinghanWu039/graph-tokenization-benchmark", "val/time_iter"): "the training step's time logged again under "
                                                                     "val/, read as a validation's",
    ("atomicarchitects/nequix", "train/batch_time"): "the loader's wait named the batch time (the step's in most "
                                                     "parts)",
    ("atomicarchitects/nequix", "train/train_time"): "a step's dispatch named train_time (an epoch's in other parts)",
    ("Juelin-Liu/pebble", "load_time"): EPOCH_SUM,
    ("Juelin-Liu/pebble", "forward_time"): EPOCH_SUM,
    ("Juelin-Liu/pebble", "backward_time"): EPOCH_SUM,
    ("NVIDIA/recsys-examples", "dyn_train_ms"): "printed; a forward and backward named train",
    ("NVIDIA/recsys-examples", "trc_train_ms"): "printed; a forward and backward named train",
    ("tinaudio/synth-setter", "train/time/step"): "a feedback forward named the step",
    ("tinaudio/synth-setter", "train/time/control"): MODULE,
    ("tinaudio/synth-setter", "train/time_control_enc"): MODULE,
    ("tinaudio/synth-setter", "train/time_control_field"): MODULE,
    ("OpsiClear/gsplat", "time/tracking_ms"): LOSS_TERM,
    ("OpsiClear/gsplat", "time/reg_ms"): LOSS_TERM,
    ("OpsiClear/gsplat", "time/photo_loss_ms"): LOSS_TERM,
    ("URRealHero/3DGenMemorization", "train/cond_time"): ENCODER,
    ("URRealHero/3DGenMemorization", "train/encode_time"): ENCODER,
    ("URRealHero/3DGenMemorization", "train/opt_time"): "the whole step inside Lightning's optimizer_step, named opt",
    ("anchpop/lexide", "perf/ms_per_batch_forced_align"): "a forced alignment's time a batch, read as the "
                                                          "step (a rule for the words after per was withdrawn)",
    ("hmchuong/MaGGIe", "train/batch_time"): "an AverageMeter from the loader to the forward named batch_time (the "
                                             "step's in most parts)",
    # the thirty-first part, scored once with v21 (and the collectives declared once)
    ("alexeipc/Tree_Of_Entropy", "time/optimizer_seconds"): RL_UPDATE + ", named the optimizer",
    ("BY571/DistRL-LLM", "timing/update_duration"): RL_UPDATE + ", named an update (a weights' update is no phase)",
    **{("voice-bench-submission/voxclinbench", key): EPOCH_SUM_LOGGED
       for key in ("timing/data_wait_sec", "timing/forward_sec", "timing/backward_optim_sec")},
    **{("Marshall-mk/synthSR", key): EPOCH_SUM_LOGGED
       for key in ("timing/data_loading_time", "timing/forward_backward_time")},
    # the thirty-second part, scored once with v21 (and comm_overlap)
    ("aharley/simple_bev", "pooled/time_per_el"): "the step's time over its batch: a cost per item, no phase",
    ("aharley/simple_bev", "rtime"): "printed; 'r' for read, no phase word",
    ("aharley/simple_bev", "itime"): "printed; 'i' for iteration, no phase word",
    ("Pratik-Doshi-99/time-series-fms", "time/loss_computation"): LOSS_TERM,
    ("Pratik-Doshi-99/time-series-fms", "time/grad_sync"): "named a gradient sync, times the backward call and a "
                                                            "synchronize",
    ("soda-inria/tabicl", "prior_time"): "the next batch of a synthetic-data prior: 'prior' names no phase",
    ("automl/nanoTabPFN", "time"): "printed; a running sum of step times under a bare 'time'",
}
"""(repo, key) -> why the daemon does not read it as its code computes it."""


@cache
def _corpus(name: str) -> tuple[list[Row], dict[tuple[str, str], Got]]:
    rows = load(CORPUS / name)
    return rows, read(rows)


def _cases() -> list[object]:
    cases = []
    for name in PARTS:
        for row in load(CORPUS / name):
            marks = [pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[row.repo, row.key])] \
                if (row.repo, row.key) in KNOWN_MISSES else []
            cases.append(pytest.param(name, row, marks=marks, id=f"{Path(name).stem}:{row.repo}:{row.key}"))
    return cases


@pytest.mark.parametrize(("name", "row"), _cases())
def test_each_key_reads_as_its_code_computes(name: str, row: Row) -> None:
    got = _corpus(name)[1][row.repo, row.key]
    if row.ambiguous:
        assert right(row, got.meaning) or got.meaning not in PHASE_LABELS or got.certainty < 1.0, (row, got)
    else:
        assert right(row, got.meaning), (row, got)


def test_the_corpus_is_real_and_big_enough() -> None:
    rows = [r for name in PARTS for r in _corpus(name)[0]]
    assert len(rows) >= 150 and len({r.repo for r in rows}) >= 40
    assert all(r.repo.count("/") == 1 and r.path and r.note for r in rows)
    assert {r.label for r in rows} <= PHASE_LABELS | {"other_phase", "none"}
    assert len({(r.repo, r.key) for r in rows}) == len(rows)
    assert not {r.repo for r in _corpus(PARTS[0])[0]} & {r.repo for n in PARTS[1:] for r in _corpus(n)[0]}


def test_the_docs_vocabulary_table_is_the_readers() -> None:
    from sidecar.processing.reader import doc_table

    text = (CORPUS.parent.parent.parent / "docs" / "METRICS.md").read_text().splitlines()
    begin = next(i for i, line in enumerate(text) if "generated from sidecar.processing.reader" in line)
    end = text.index("<!-- END generated from reader -->", begin)
    assert text[begin + 1:end] == doc_table()
