"""The estimator against published runs, cross-validated (tests/estimate_reference.toml; every row's error is in
docs/estimate.md, "Validation").

Goal (issue 24): on the leave-one-source-out errors, tokens/s (and TFLOPS, decode tokens/s, CPU step time) within
15 %, memory within 10 %, GPU-hours within 25 % on every row, and a median absolute error of at most 5 %. A figure
that stays outside is marked xfail(strict=True) with its reason, so the suite turns red the day it starts passing.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

from conftest import ROOT
from torchtitan.estimate import validation
from torchtitan.estimate.accuracy import held_out_coverage
from torchtitan.estimate.validation import (
    cross_validated,
    load_reference,
    median_abs_error,
    table,
    training_estimate,
)

REF = load_reference()
CV = cross_validated(REF)

_MI300X = (
    "MI300X (+40..+44 %, the same for bf16, tensorwise and rowwise: float8's extra work is priced right, the"
    " gap is common to all three): flash attention at CK FA2's published MI300X plateaus (an upper bound for"
    " SDPA's AOTriton), float8 at hipBLASLt's published 8192^3 rate, RCCL rings at the measured 8-GPU bus"
    " bandwidth, but the bf16 GEMM rate is the MAMF measured with PYTORCH_TUNABLEOP_ENABLED=1 (668 TFLOPS) and the"
    " torchtitan run did not tune; no untuned MI300X figure at these shapes is published (on the MI325X an untuned"
    " torch.matmul at 8192^3, HipKittens f09e968 under ROCm 7.0's preview, 785.3 TFLOPS, equals its TunableOp MAMF,"
    " 784.9: tuning is not plainly what is missing). AMD's own characterization of"
    " this workload (Llama 3 8B, FSDP, 8 x MI300X; Kurzynski, Aga, Wu, arXiv 2512.08242) names clock frequency"
    " (DVFS) as the largest loss against theoretical throughput; its figures were not readable here. A lead (session"
    " 29): the run's torch 2.9.0.dev of 2025-08 had AOTriton 0.10b, whose SDPA backward is Triton kernels that"
    " AOTriton's tuning database times at ~75-115 TFLOPS on gfx942 (small grids) against CK FA2's 194; a what-if"
    " with them gives +5 .. +26 %, not applied (docs/estimate_log.md, 'A lead for the MI300X rows'). Session 30's"
    " nineteenth pass supports it: AMD's Llama 3.1 8B runs on 8 MI300X with CK's FlashAttention-2 (the kernel these"
    " rates come from; FSDP1, no AC, compiled, 2025-02) are estimated -7.8 / +0.8 %"
)
_GPT_FAST_70B_TP2 = (
    "gpt-fast Llama-3.1-70B bf16 on 2 A100 (out of sample +31.9 %; +31.9 % cross-validated, the per-layer overhead"
    " fitted without gpt-fast's TP rows, 55 us; +30.7 % at 60 us, before the twenty-second pass's rows joined that"
    " fit): the published 16.03 tokens/s is 25 % below the same table's Llama-2-70B on 2 GPUs (21.32) at nearly the"
    " same weight bytes per GPU (~70 of 80 GB), and its reported bandwidth (1,131 GB/s) is below every other bf16 row"
    " of the table (1,182-1,482); the 2-GPU Llama-2-70B, the 4- and 8-GPU Llama-3.1-70B rows fit (+0.1 %, +0.1 %,"
    " +4.0 % cross-validated): not explained"
)
_GPT_FAST_405B = (
    "gpt-fast Llama-3.1-405B int8 on 8 A100 (out of sample +34.2 %; +45.5 % since decode_hbm_int8 is the int8 GEMV's"
    " measured bandwidth, 0.72, in place of the 0.65 set on gpt-fast's rows; +45.5 % cross-validated, +43.4 % at 60"
    " us): the published 15.60 tokens/s implies 816 GB/s of weights read per GPU against 1,187 in the estimate; the"
    " 8-GPU int8 70B rows of the same table fit (+4.3 %, +10.4 % cross-validated); what costs the 405B run more per"
    " byte (its 16384-wide int8 matrices, the 126-layer graph) is not published: not explained"
)
_B200 = (
    "torchao's B200 table (8 x B200 at 750 W, Llama 3 8B, FSDP 8, torchtitan 6fc499f on torch 2.9 nightly of"
    " 2025-08-15; out of sample: tokens/s bf16 +67.3 %, float8 tensorwise +88.0 %, rowwise +103.6 % since"
    " Blackwell's attention is priced at its sustained rate (session 50; +73.8 / +98.5 / +113.6 % with the B200's"
    " attention at its kernels' burst rates, +71.9 / +95.4 / +110.6 % with its benchmark's host time, until"
    " 2026-12-03), the B200's 7,672 GB/s of memory bandwidth (pytorch/ao#4002; +72.6 / +96.9 / +112.8 % at the datasheet's 8,000);"
    " +75.4 / +100.5 / +117.3 % before NVLink 5's measured NCCL channels and bus bandwidth, +88.9 / +114.1 /"
    " +130.7 % with the H100's power exponent, +79.1 / +120.7 / +137.3 % before it was solved from two sustained"
    " rates): the"
    " estimate now prices the B200's bf16 GEMMs by torch.mm measured at 8192^3 (1,420 TFLOPS, pytorch/ao#2427;"
    " MAMF 1,745), attention by torch's cuDNN SDPA measured on a B200 (NVIDIA/cudnn-frontend f937055: 1,297 / 1,005"
    " TFLOPS forward / backward at 8K without the host's dispatch, causal, head dim 128), both x (750/1000)**0.97 (Blackwell's exponent, from"
    " cuBLAS measured on a B200 capped at 750 W: 1,073 TFLOPS at 8192^3), and the attention recompute of"
    " torchtitan's save list of then (no cuDNN SDPA op in it); float8 GEMMs at the GB200's sustained 2,877 TFLOPS"
    " (Azure; the MAMF's 3,432.5 until session 27: tensorwise +131.2 -> +114.1 %, rowwise +147.4 -> +130.7 %)."
    " Published step times exceed the estimates by 0.419 s (bf16), 0.390 s (tensorwise) and 0.504 s (rowwise) of"
    " 0.79-0.99 s: the bf16 - tensorwise difference is about predicted (0.200 s published, 0.171 s estimated) but"
    " a near-constant ~0.4 s per step is in neither the kernel rates found nor the model (FSDP's whole traffic at"
    " NVLink 5 is ~0.08 s); what it is (host overhead, NCCL of then on B200, clocks below those of Meta's later"
    " capped runs) is not published: not explained"
)
_TORCHAO_H100_DECODE = (
    "torchao's decode table on 'a single NVIDIA-H100 GPU' (Llama-3.1-8B, batch 1; out of sample: bf16 -15.7 %,"
    " int8 weight-only -24.0 %, -18.1 % since decode_hbm_int8 is the int8 GEMV's measured bandwidth; cross-validated"
    " -17.1 / -20.2 %, the per-layer overhead fitted without torchao's rows; the same table's four A100 rows fit,"
    " -3.6 .. -9.8 %): the H100 variant is not stated and the rows take the Meta 96 GB"
    " part (2.4 TB/s, 500 W) as torchao's training rows do; on the 80 GB SXM part (3.35 TB/s, 700 W) the estimates"
    " would be +9.5 % and +2.6 % (computed after the rows were recorded; the mapping was not changed). The published"
    " bf16 rate implies 1,905 GB/s of weights read per second, 79 % of 2.4 TB/s, where the A100 rows imply 70 % of"
    " 2.04 TB/s"
)
_PR191_H100_DECODE = (
    "gpt-fast#191's H100 table (Llama-2-7B at batch 1, bf16 / int8 / int4 G=32; out of sample, twenty-second pass:"
    " -20.9 / -26.2 / -17.6 %, the H100 taken as Meta's 96 GB part at 2.4 TB/s and 500 W, as for the torchao_decode"
    " H100 rows of the same group, which are -17.1 / -20.2 %): the published bf16 rate reads 1,938 GB/s, 81 % of 2.4"
    " TB/s, where the estimate reads the weights at 0.83 of it and adds 55-60 us a layer, 8.6 ms a token against the"
    " published 6.8. On the 80 GB SXM part (3.35 TB/s) the same figure would read 58 % of the bandwidth, on a PCIe"
    " part 97 %: the variant is not stated. PyTorch's A100-40GB CI targets (400 W) are low too (-12.1 / -10.4 %) where"
    " gpt-fast's A100-80GB rows at 330 W fit: the time a decode step spends beyond its weights' bytes is not one"
    " constant across parts and power limits, and the estimator has no measurement of it on either part: not explained"
)
_GPT_FAST_INT4_CV = (
    "gpt-fast's Llama-2-7B int4 (G=32) on one A100 at 330 W: in sample +4.8 %, cross-validated +16.4 % since the"
    " twenty-second pass (+12.3 % before): the per-layer overhead fitted without gpt-fast's single-GPU rows fell from"
    " 45 to 40 us when the H100 and A100-40GB decode rows, which spend far less time a layer beyond their weights'"
    " bytes than gpt-fast's 330 W A100s, joined the other sources. One overhead for every part is what those rows"
    " contradict (_PR191_H100_DECODE): not explained"
)
_AWS_MEM = (
    "AWS's torchtitan test case (Llama 3 8B, local batch 1, FSDP 32 on 4 x p5.48xlarge; out of sample: memory"
    " -42.4 % eager, -42.7 % compiled, while its tokens/s fit, +2.0 / +1.9 %; +7.0 / +7.7 % before the"
    " persistent-GEMM rule): the logged max reserved at step 1990 (68.57 / 63.48 GiB) is 21 GiB above torchao's"
    " 8-GPU batch-1 run of the same weeks (47.65 GiB, estimated within 2 %) although 32-way sharding keeps a quarter of the states per GPU; torchtitan's own table puts batch"
    " 2 on 128 GPUs at 67.0 GiB. The README states the default llama3_8b.toml (batch 1); what else the run held"
    " (a changed batch, allocator growth over 2,000 steps) is not stated: not explained"
)
_B200_MEM = (
    "torchao's B200 table (Llama 3 8B, FSDP 8, batch 1 x 8192, per-op SAC, compiled; +11.1 / +10.7 / +10.9 % since the allocator's fixed part is its libraries' 0.083 GiB"
    " (session 50; +12.3 / +12.4 / +12.5 % at 0.5 GiB), +0.6"
    " .. +0.9 % before the sharded gradients were priced in FSDP2's reduce-scatter stream pool, 3.74 GiB per GPU"
    " here): that pool, read from torch's FSDP2 source, brought the same script's MI300X rows of the same weeks"
    " (torchtitan 2c8b594 against 6fc499f, one week apart) from -7.9 .. -8.7 % to +1.3 .. +2.2 %, torchao's six"
    " H100 rows from -7.2 .. -8.1 % to +0.1 .. +1.1 % and torchtitan's FSDP 8 rows to -1.2 .. -0.1 %. The B200"
    " figures are 5.4 GiB below the MI300X's for the same configuration; the estimate explains 2.0 GiB of it"
    " (attention recomputed on the B200, not saved). What else the B200 run (torch 2.9.0.dev20250815+cu128) held"
    " less of is not published: not explained"
)
_LINGUA = (
    "Meta lingua's issue #56 baseline (Llama 7B shape, vocab 128,256, 2 x 4096 per GPU, FSDP 8 with blocks kept"
    " gathered, compile, no AC, one node of H100 80GB at 700 W; out of sample, fourth pass: +37.6 %; +28.8 % since"
    " the persistent-GEMM rule prices FSDP's overlap): the estimate's step is 0.700 s (57 % MFU by this framework's"
    " FLOPs) where the log's step is 0.9013 s (9,080 wps, 44 %); the closest row in the file, fms-fsdp's compiled 7B"
    " without AC on H100 80GB (batch 2 x 4096), fits (-2.3 %). The figure is one logged step (step 10) of one"
    " user's run whose torch is not stated: not explained"
)
_PR165_2D_MEM = (
    "torchtitan#165's 2D runs (2-way SP x 4-way FSDP, 16 x 2048 per TP group, eager, 2024-03; out of sample,"
    " seventh pass): the published peak reserved (60.97 % / 90.14 % of 95.04 GiB) is 1.9x / 1.4x the 1D runs' at"
    " the same tokens per GPU (32.64 % / 62.51 %), while the estimate keeps them alike (31.5 vs 32.1 GiB full AC;"
    " 71.0 vs 59.4 GiB SAC). torchtitan#191, filed a week later (2024-04-04), reports the same code's FSDP2 + TP"
    " using 16 GB more than FSDP1 + TP on 13B, with full AC as well. Cause on record: ProcessGroupNCCL's record_stream"
    " on TP's async collectives held their freed buffers while the host ran ahead (torchtitan#735/#737);"
    " torchtitan set TORCH_NCCL_AVOID_RECORD_STREAMS=1 on 2024-04-10 (#195), after these runs. How much is held"
    " depends on the host's lead over the GPU, which the estimator does not model: not priced"
)
_PR355 = (
    "torchtitan#355's Llama 3 8B on 8 A100 80GB DevGPUs (1 x 8192, per-op SAC, eager, 2024-06; out of sample,"
    " seventh pass): tokens/s +20.8 % (foreach) / +18.4 % (fused), the estimate at 58.9 % MFU against the logged"
    " 48.8 %. The power limit is not stated and was taken at the A100's 400 W default; gpt-fast's README runs its"
    " A100-80GB at 330 W (another PyTorch-team machine), where the estimate is 2,865 / 2,900 (+9.1 / +6.7 %), a"
    " candidate, not applied: two more Meta sources run their A100s at 330 W (pytorch/tutorials' torchao GPU"
    " quantization tutorial, 'A100-PG509-200 power limited to 330.00 W'; TritonBench's lock-down sets 'NVIDIA"
    " PG509-210' to 330 W and does not reset it), none states it for this run. Not explained"
)
_PR355_MEM = (
    "torchtitan#355's Llama 3 8B on 8 A100 80GB (2024-06; -13.8 %, both optimizers): the run logged 59.48 GiB;"
    " the same llama3_8b.toml configuration (1 x 8192, per-op SAC, eager, FSDP 8) logged 49.59 GiB on 8 H100s in"
    " 2025-02 (torchtitan#822, +3.4 % here) and 49.58 GiB in 2025-03 (torchtitan#996). The estimate (51.3 GiB) is"
    " the same for both parts; what the software of 2024-06 kept beyond it (~10 GiB) is not known: not explained"
)
_PR642_MEM = (
    "torchtitan#642's Llama 3 8B on 8 H100 as FSDP 4 x TP 2 (1 x 8192 per TP group, per-op SAC taken from the toml,"
    " compiled blocks and loss, 2024-10; out of sample, eighth pass; -34.2 %): the run logged 44.53 GiB, 93 % of the"
    " compiled FSDP 8 peak of the same configuration (torchao's 2025-02 bf16 row, 47.65 GiB) at half the tokens per"
    " GPU; the estimate keeps 29.3 GiB (activations 8.6 GiB). torchtitan#165's 2D rows of 2024-03 show the same"
    " direction (-45.6 / -17.1 %) while torchtitan's 70B TP 8 rows of 2024-12 fit (-5.2 / +0.8 %). The command is not"
    " shown (AC taken from the toml): not explained"
)
_ISSUE929 = (
    "torchtitan#929's control run: Llama 3 8B on 8 A100 80GB (read from the log: 79.15 GiB, MFU against 312"
    " TFLOPS), 1 x 8192, FSDP 8, per-op SAC, compiled blocks, fused AdamW, 2025-03; out of sample, eleventh pass;"
    " +22.4 %): the estimate's step is 2.28 s (66.6 % MFU) where the log's is 2.80 s (54.4 %). The same direction"
    " and size as torchtitan#355's eager A100 rows (+20.8 / +18.4 %, the same DevGPU reading, the power limit not"
    " stated and taken at the 400 W default); at gpt-fast's 330 W the estimate would be 3,196 (+9.0 %), a what-if,"
    " not applied (Meta's tutorials and TritonBench run their A100s at 330 W too; no source states it for this run:"
    " docs/estimate_log.md, 'Meta's A100 DevGPUs at 330 W'). Memory fits (+1.1 %). Three log rows of one 100-step"
    " run: not explained"
)
_CRUSOE = (
    "Crusoe Cloud's torchtitan table (twelfth pass, out of sample): Llama 3.1 8B, seq 8192, per-op SAC,"
    " eager, FSDP over every GPU, one step-100 log row per run, torch nightlies of 2026-01..03 on the table's"
    " driver/CUDA (570 / CUDA 12.8 for these rows: the cu128 wheel, whose PyPI twin torch 2.10.0 pins cuDNN"
    " 9.10.2). As estimated, every row of the table was too fast: B200 +9.7 / +11.1 %, H200 +11.8 / +15.0 /"
    " +14.9 %, H100 +30.0 / +24.4 % (570 / CUDA 12.8) and +8.7 % (580 / CUDA 13.0); since the persistent-GEMM"
    " rule prices FSDP's overlap (adopted after this pass) the Hopper rows are +8.6 / +11.9 / +12.0 % (H200)"
    " and +23.6 / +20.3 / +5.4 % (H100), the B200 rows unchanged; +8.0 / +11.3 / +11.4 % and +22.8 / +19.5 /"
    " +4.6 % since torch's eager RMSNorm is priced at its measured rate (session 43). The H100 rows differ"
    " from each other by 15 % (7,169-7,582 vs 8,714 tokens/s) for one configuration on two wheels; the"
    " estimate is the same for all three. A what-if after the errors were known, not applied: with"
    " FlashAttention-2 priced instead of cuDNN attention (the estimator's cuDNN rates are cuDNN 9.19's) the"
    " 570 rows would be lower by ~14 points, but with the oldest Hopper cuDNN curve found (cuDNN 9.1, 2024,"
    " which bounds 9.10's) by 2: the wheel's cuDNN does not explain them. Memory fits on every row"
    " (+0.4..+5.9 %). The B200 rows are +6.4 / +4.8 % since Blackwell's attention is priced at its sustained"
    " rate (session 50). Assumed, not read: the per-row toml (the series' one published config with the table's"
    " batch) and the parts' power limits"
)
_KEMPNER_TP = (
    "KempnerForge's MFU report (Llama-3 7B / 13B / 70B shapes, seq 4096, full AC, compiled, fused AdamW, bf16"
    " parameters; 1-8 nodes of 4 H200, code 01b461a, 2026-04; out of sample, twelfth pass), the one-node TP 2 row of"
    " the 7B shape: +15.6 % (TP 4 +13.1 % and TP 2 x FSDP 2 +7.5 %, within), published 2.49 s a step. Priced on the"
    " way: the framework's TP without loss parallel (this trainer's own plan), the 4-GPU board as a mesh (session"
    " 47: a pair of its GPUs has a third of the node's NVLink; +36.6 % before), the full-AC recompute stopping"
    " before w2 (session 44), since session 49 its loss on the bf16 logits (--estimate.eager_loss=bf16), its bf16"
    " model (--estimate.model_dtype=bfloat16) and its replicated embedding (--estimate.tp_embedding=replicated),"
    " and since session 61 its TP plan's per-linear inputs (--estimate.tp_inputs=linear: q, k, v and gate, up each"
    " redistribute their input, so the compiled backward reduce-scatters 5 input gradients a block, not 2, as counted"
    " on this project's CPU; +22.7 / +20.5 % before). Not priced: FSDP2 over a size-1 mesh under pure TP."
    " 20-step runs, the last 5 averaged: not explained"
)
_YAFSDP = (
    "YaFSDP README's FSDP1 baselines (Hugging Face Llama, FSDP1 bf16 / fp32 reduce, batch 1, no AC, eager, on 64-256"
    " A100 80GB of Yandex's HDR InfiniBand clusters, torch of 2023-11; +54.9 .. +67.8 % at seq 2048, +24.8 % for Llama"
    " 3 8B at 4096; out of sample, fourteenth pass): the time the estimate lacks grows with the parameters, about"
    " 0.05 s per billion (7B +0.32 s, 13B +0.69, 34B +1.61, Llama 3 8B +0.43 at seq 2048), about what each step's"
    " collectives take (2 + 2 + 4 bytes per parameter) at the assumed 200 Gb/s per GPU, where the estimate hides all"
    " but 0.08-0.35 s of them. The network is not published (one HDR NIC per GPU is an assumption); at 64 Gb/s per"
    " GPU (a what-if, not applied) the 12 rows are -12.1 .. +7.1 %. YaFSDP's own times in the table are also far"
    " above the estimate at seq 2048 (7B 0.81 s against 0.58 s), so not only FSDP1's overlap: not explained"
)
_PR467_MEM = (
    "torchtitan#467's baseline (Llama 3 8B, FSDP 8 on 8 H100 96GB, batch 1 x 8192, no AC, eager, foreach AdamW,"
    " 2024-07; +10.9 %, +11.5 % before the allocator's fixed part was its libraries' 0.083 GiB, session 50; out of"
    " sample, fifteenth pass): 78.38 GiB reserved, estimated 86.96 (activations 52.22 GiB, eager no-AC's 176 KB per"
    " token and block; logits and loss 11.74; parameters, gradients and AdamW 14.96; FSDP buffers 3.82; overhead"
    " 4.22). The same run's tokens/s is within goal (-4.6 %), and the only other eager no-AC"
    " memory row, the float8nocompile table's 8B at 1 x 4096 on 8 H100s (2025-01), is +1.3 % (53.12 GiB): the"
    " estimate adds 33.6 GiB from 4096 to 8192 tokens where the two sources differ by 25.3 GiB (different software,"
    " six months apart): not explained"
)
_ULTRASCALE_ANOMALY = (
    "The Ultra-Scale Playbook's nanotron sweep, 1B DDP on 8 nodes at micro-batch 2 x 2 (twenty-third pass):"
    " 16,056.64 tokens/s per GPU published, 35,554 estimated (+121.4 %), where the same node count at 1 x 4 published"
    " 31,112.23 (estimated +8.6 %) and the estimate makes the two alike. A figure of one step (the third) on a shared"
    " cluster, half its neighbour's: what slowed that run is not published: not explained"
)
_SHEARED = (
    "Sheared-LLaMA's continued pre-training (README 'Throughput': Composer v0.16.3 FSDP1 FULL_SHARD, bf16 reduce,"
    " full AC per block, micro batch 16 x 4096, eager torch 2.0.1, flash-attn 1.0.3, 16 A100 80GB assumed 8 nodes"
    " x 2; out of sample, fifteenth pass): 2.7B published 4,957 tokens/s, estimated 7,509 (+51.5 %); 1.3B published"
    " 8,684, estimated 13,949 (+60.6 %). The published steps (13.2 s, 7.5 s) are 31 % and 28 % MFU, the estimate's"
    " 47.5 % and 45.1 %; the missing time (4.5 s, 2.9 s) scales with layers x width (1.58 against 1.67), not with"
    " the parameters' collectives (0.08 / 0.04 s exposed; 6.25 GB/s per GPU, a what-if, adds 0.24 / 0.12 s)."
    " Candidates, none priced: FlashAttention-1 (priced as FA2's A100 rate; attention is 10-12 % of the FLOPs, so"
    " even half FA2's rate explains a fraction), flash_attn's unpad / pad copies of q, k, v and the output, the eager"
    " rotate_half rotary, a 300 W PCIe part (a what-if, not applied: +30.0 % / +38.6 %): not explained"
)
_CPU_DEPTHS = (
    "this machine's CPU rows, measured again in session 23 (2026-11-25; runs and calibration back to back), whose"
    " step time is the trainer's own step timed by the calibration's probe at one and three blocks per stage and"
    " carried along their line (steptime.measured_step): 26 of 28 CPU step times within goal, 15 within 5 %"
    " (docs/estimate_log.md, 'The CPU step measured at two depths')"
)
_CPU_DEEP_PROBE = _CPU_DEPTHS + (
    ": the probe's deeper depth is one timed run, and a slow period of the host during it is carried to every block"
    " beyond it"
)
_CPU_LARGE_TP2 = _CPU_DEEP_PROBE + (
    ": debugmodel_large on TP 2 at 4 x 256, 0.707 s measured, 0.872 estimated (+23.5 %): the probe stepped 0.147 s"
    " with 1 block and 0.355 s with 3 (0.104 s a block) where the trainer's 8-block runs imply 0.080 s a block; the"
    " model alone -12.2 %: not fixed (measured again in session 29 on a host of the same GEMM peak: -6.8 %)"
)
_CPU_PP_GPIPE = _CPU_DEEP_PROBE + (
    ": the debug model with 8 layers on PP 2 with GPipe, 0.477 s measured, 0.643 estimated (+34.8 %): the probe"
    " stepped 0.163 s with 2 blocks and 0.483 s with 6, as long as the trainer's own 8-layer runs, where the same"
    " configuration's probe gave 0.381 s with 6 blocks an hour earlier (estimate then -2.6 %); the model alone"
    " +20.6 %: not fixed (measured again in session 29 on a host of the same GEMM peak: +3.9 %)"
)
_CPU_HELDOUT2_MEM = _CPU_DEPTHS + (
    ": debugmodel_large's peak RSS, -13.0 % on FSDP 2 + full AC at 4 x 256 and -10.8 % replicated at 2 x 256"
    " (-12.6 / -11.1 % as first measured in session 22), where the debug model's 2-process rows are within 0.4-7.1"
    " %; the heap retention is measured on one block per stage and the tensors beyond it take the 0.19 ratio. Their"
    " calibrations predate the probe's peaks at two depths (memory.measured_rss): measured again in session 29 with"
    " them, +0.2 / +3.1 %, and -10.4 / -11.8 % by the same calibrations without them, as these rows"
)
_CPU_HELDOUT4_MEM = (
    "debugmodel_large on FSDP 2 at 1 x 1024, measured in session 24 on a Zen 3 VM without bf16 instructions"
    " (ours_cpu_heldout4; its step time -4.9 %): peak RSS 1.229 GiB measured, 1.064 estimated (-13.4 %), the third"
    " debugmodel_large peak outside; its calibration predates the probe's peaks at two depths (memory.measured_rss),"
    " whose line gives 1.120 (-8.9 %): the heap keeps growing after the probe's 12 steps (a trainer run: 1.09-1.14"
    " GiB over steps 1-12, up to 1.21 over steps 13-30; docs/estimate_log.md, 'CPU peak memory measured at two"
    " depths'); measured again in session 29 on the Zen 5 host with the peaks at two depths: -5.6 %"
)
_CPU_HELDOUT5_STEP = (
    "debugmodel_large replicated 2 + full AC at 4 x 256, measured in session 24 on a Zen 3 VM without bf16"
    " instructions (ours_cpu_heldout5): 5.06 s measured (runs 5.21, 4.89, 5.06), 4.22 estimated (-16.6 %) by the"
    " line through the mean of the probe's two runs at each depth (steptime.measured_step); those runs spread 0.73 /"
    " 0.77 s at 1 block and 1.94 / 1.54 s at 3 in that hour; through their fastest runs, as first estimated, -29.4 %"
    " (docs/estimate_log.md, 'CPU peak memory measured at two depths: the held-out results'); measured again in"
    " session 29 on the Zen 5 host: -5.3 %"
)
_CPU_HELDOUT11_STEP = (
    "the debug model widened to dim 2048 with 2 layers, fp32, one process at 1 x 128 (ours_cpu_heldout11, session 41,"
    " an AMD EPYC host without bf16 instructions): 1.94 s measured (runs 1.93, 1.94, 2.45), 2.43 estimated (+25.6 %),"
    " the line through the calibration's probe at one and two blocks (steptime.measured_step). The model has two"
    " blocks, so the probe's two-block runs are this configuration itself: they timed 2.50 and 2.36 s"
    " minutes after the trainer's runs, as slow as the third run. A fourth trainer run after the estimate (not a row)"
    " gave 2.17 s, its steps 1.93-3.05 s: the host's speed, not the line through the depths, set the difference"
)
_MI355X_CVS = (
    "ROCm/cvs's torchtitan Llama 3.3 70B on 8 MI355X, TP 4 x FSDP 2, 16 micro-steps of 1 x 8192, every second block"
    " checkpointed, eager (seventeenth pass, out of sample: +28.6 % as it came; +28.2 % since the MI355X's attention"
    " is torch's SDPA as measured, which brought the same source's 8B row from +55.8 to +11.5 % (+10.1 % now); +27.6 % since the"
    " TP embedding's gradient reduce-scatter, session 52; +21.8 % since FSDP2's copies were priced as measured,"
    " session 58; +24.7 % since its bf16 parameters (torchtitan's training.dtype bfloat16) are priced, session 59):"
    " published step 39.1 s against 31.4 s estimated, of"
    " which TP's and FSDP's collectives over the mesh (two FSDP ranks on one"
    " 76.8 GB/s link, by the MI300X's measured 2-GPU rule; TP 4 on three of the seven links) are as much as the"
    " compute. No RCCL figure of an MI355X node was found to check the mesh's rates; the threshold's 'actual' value"
    " comes from a 10-step run whose logged step is not stated: not explained"
)

_PR887 = (
    "torchtitan#887's SDPA baseline (Llama 3 8B, 1 x 8192, per-op SAC, eager, fused AdamW, 2025-03-20; an A100 80GB by"
    " its 79.15 GiB and 312 TFLOPS peak, 8 GPUs taken from run_train.sh's default; out of sample, nineteenth pass):"
    " tokens/s 2,546 published, 3,218 estimated (+26.4 %), the third Meta A100 run estimated about 20 % high with"
    " torchtitan#355's (+20.8 / +18.4 %) and #929's (+22.4 %): at gpt-fast's and TritonBench's 330 W (a what-if,"
    " not applied: no source states it for these runs) +13.9 %. Memory 36.06 GiB published, 51.27 estimated (+42.2 %):"
    " 13.5 GiB below #929's run of the same configuration two weeks earlier (47.61 GiB, compiled blocks), and below"
    " the estimate even at 32 GPUs (39.5); the GPU count is not stated and the run is the PR branch's"
    " (FlexAttention's enablement): not explained"
)
_PR1881_64 = (
    "torchtitan#1881's FSDP2 row on 8 nodes of 8 H100 (Llama 3 8B, FSDP 64, batch 1 x 8192, eager, per-op SAC, cuDNN"
    " attention, 2025-10; out of sample, nineteenth pass): 5,097 tokens/s published, 6,379 estimated (+25.1 %), and"
    " 31.41 GiB against 35.20 (+12.1 %). The same table's 8-GPU row is estimated too slow (-12.4 %) and its FSDP 4 x"
    " TP 2 row fits (+2.0 %): from 8 to 64 GPUs the published step grows from 1.11 to 1.61 s where the estimate's"
    " grows by 0.015 s (FSDP's rings over 8 nodes at the part's 400 Gb/s per GPU, hidden under 1.1 s of compute but"
    " 0.105 s); the estimate reaches the published figure with about 9 GB/s (75 Gb/s) per GPU between nodes, a fifth"
    " of the part's (a what-if, not applied: 12.5 GB/s gives 5,509, 6.25 gives 4,535). The nodes' network and which"
    " step the TPS is are not stated: not explained"
)
_AO1718 = (
    "pytorch/ao#1718's bf16 + compile + TP 2 baseline (Llama 3 8B on 8 H100 as FSDP 4 x TP 2, torchtitan of"
    " 2025-02-13, 2025-02-14; out of sample, nineteenth pass): 1,669 tokens/s published (mfu 9.77 %), 5,728 estimated"
    " (+243 %): the logged step, 2.45 s for 4,096 tokens a GPU, is 3.5x torchtitan#1881's eager run of the same"
    " layout eight months later (0.69 s, estimated +2.6 %); its memory fits (-6.1 %). The PR fixes TP with float8"
    " rowwise; its thread says nothing of the baseline's speed, and this trainer itself could not run TP with compiled"
    " blocks on a CPU (docs/parallelism.md): not explained"
)

_AO2304_MEM = (
    "pytorch/ao#2304's float8 tutorial runs (torchtitan's llama3_8b.toml of 2025-06-04 on 8 H100, FSDP 8, batch 1 x"
    " 8192, per-op SAC, blocks and loss compiled; out of sample, twentieth pass): 30.89 / 30.99 / 30.91 GiB reserved"
    " (bf16 / rowwise / tensorwise), estimated 39.93 / 39.87 / 39.87 (+29.3 / +28.6 / +29.0 %; their tokens/s fit,"
    " +3.2 / -4.1 / +1.9 %). The same toml's compiled runs of 2025-07 (ao#2594 / #2595, 36.68 / 37.19 GiB) are"
    " estimated +7.5 / +7.2 %, and of 2025-02 with the loss eager (torchao_h100, 47.65 GiB) +1.1 %: the published"
    " figures fall by 17 GiB from 2025-02 to 2025-06 where the estimate falls by 8 (the compiled loss's logits). Seen"
    " before the estimate (written in the row); what the tutorial's nightly held less of is not published: not"
    " explained"
)

_CUDNN_FE_B200 = (
    "NVIDIA cudnn-frontend's Llama-3.2-1B training benchmark on one B200 (out of sample, session 48: Hugging Face"
    " LlamaForCausalLM in bf16, eager, SGD; torch 2.7.0a0 nv25.04, cuDNN 9.9; the README's clock lock at 1665 MHz"
    " refused in the run's own log, so the free clock at 1000 W): cuDNN attention +21.7 .. +25.9 % (+27.2 .. +32.0 %"
    " until session 60 priced the composite norms' and the loss's bf16 -> fp32 upcasts per SM and clock), flat in the"
    " sequence since Blackwell's cuDNN takes the head dim (session 54: head dim 64 at 0.686 of 128, a Blackwell"
    " cuDNN pair of flash-attention#2605; +30.7 .. +46.7 %, rising with the sequence, before it),"
    " FlashAttention-2 +17.8 / +19.1 % at 768 / 1024 and within the goal from 2K (+14.8 / +8.8 / +0.0 / -8.6 %;"
    " +19.3 .. +24.4 % up to 2K until session 60), since"
    " Blackwell's attention is priced at its sustained rate (session 50; before it +31.9 .. +56.5 % and"
    " +6.5 .. +28.2 %, +12.6 .. +29.7 % until FlashAttention-2's rate took the run's head dim, as on Hopper), where"
    " the same script's H200 rows (clock locked at 1500 MHz, as its README says) are within -13.2 .. -1.6 %. Two"
    " parts: (1) at 24 x 768, where attention is 4 % of the estimate, +18 .. +22 %: the non-attention step (GEMMs"
    " at M = 18,432, K = 2,048, 1,364-1,420 TFLOPS here; eager elementwise at 0.8 of 7,672 GB/s; the bf16 loss) is"
    " about 1.3 x the estimate, the level of the other Blackwell sources at their top (Crusoe's B200 rows +9.7 /"
    " +11.1 % as first estimated, Baisya's GB200 +10 .. +14 % in one dimension) and of every cuDNN row here;"
    " (2) FlashAttention-2's rows fall with the sequence: its B200 rate is the H100's curve (the same mma.sync"
    " kernels), where the same B200 measured torch's FlashAttention-2 at 1.06-1.18 x it (cudnn-frontend f937055,"
    " head dim 128, host time removed); priced so (a what-if, not applied) they would still fall, +24.7 .. +2.3 %,"
    " and two more rows would leave the goal. Not explained"
)

_BAISYA_3D = (
    "Baisya's torchtitan sweep on 8 GB200 (Llama 3.1 8B; out of sample, twenty-first pass), the FSDP 2 x TP 2"
    " x PP 2 rows (local batch 32-512, one sequence a micro-batch, 1F1B, compiled, per-op SAC assumed): +32.0"
    " % at 32 x 4096, +25.1 % at 32 x 8192, +20.0 .. +23.8 % at 64-512 x 16384 since Blackwell's attention is"
    " priced at its sustained rate (session 50; +34.1 / +28.7 / +25.9 .. +29.9 % before it, +41.8 / +32.3 / +27.6"
    " .. +31.6 % until FSDP's accumulation of unsharded gradients under PP was priced, session 49). The same"
    " table's PP 4 x FSDP 2 rows are estimated +3.3 .. +7.5 % and its TP 2 x FSDP 4 row +10.2 %, the level of the"
    " other Blackwell sources at their parts' default power: each dimension alone is priced, their combination is"
    " not (TP 2 x CP 2 too, +15.7 .. +16.8 %). The published 3D steps (12,331-12,854 tokens/s at 16,384) are"
    " no faster than PP 4's (12,755-13,520) where the estimate makes them 7-15 % faster; the time the"
    " estimate lacks grows with the tokens (about 24 ms a 4,096-token micro-batch, 80 ms a 16,384-token one,"
    " over 16 blocks forward and backward), so it is a rate, not a per-micro-batch cost. Which torch ran is"
    " not stated: not explained"
)
_KEMPNER_NO_SYNC = (
    "KempnerForge's 70B TP 4 x FSDP rows across nodes (MFU report, weak-scaling campaign; 4-GPU H200 nodes, NDR"
    " InfiniBand, gradient accumulation 4 or 8 under FSDP2's set_requires_gradient_sync(False)). Since session 49 the"
    " accumulation is priced as it ran (--estimate.dp_grad_sync=step: one reduce-scatter a step and the unsharded"
    " fp32 gradients added each micro-step, where every micro-step's reduce-scatter had been priced) and the loss on"
    " bf16 logits, bf16 model and replicated TP embedding as they ran: 70B TP 4 x FSDP 8 / 16 / 24 / 32 / 40 +11.5 /"
    " +6.2 / +8.6 / +6.8 / +7.7 -> +25.6 / +21.1 / +24.1 / +22.1 / +23.4 %; since session 61, its TP plan's"
    " per-linear inputs (5 backward reduce-scatters a block, --estimate.tp_inputs=linear), +21.9 / +17.4 / +20.2 /"
    " +18.8 / +20.2 %, where the 7B rows of the same layouts came inside (TP 4 x FSDP 2 / 3 / 4 / 8 +9.7 / +9.8 /"
    " +11.1 / +12.9 %) and the 13B rows stay within (-2.9 .. +5.9 %); the 175B row, at accumulation 1, is -17.7 %"
    " (_KEMPNER_175B). The fit before session 49 rested on reduce-scatters that did not run; the row's own memory"
    " says no_sync ran (70B TP 4 x FSDP 8: 93.2 GB of torch's allocated: 93.2 GiB estimated with the unsharded fp32"
    " gradients held, 29.5 without, before the replicated embedding was mapped; 96.9 with it), and the framework's"
    " memory figures outside pipeline parallelism are within 10 %, but one (the 175B's). The NICs per node are not"
    " stated (400 Gb/s per GPU assumed; at 200 the 175B row would be about -30 %): not explained"
)
_KEMPNER_175B = (
    "KempnerForge's 175B run (360 H200 in 4-GPU nodes, TP 4 x FSDP 90, batch 8 x 4096, no accumulation, full AC,"
    " compile, 2026-07; out of sample, thirteenth pass): -19.2 % as first estimated, within the goal since"
    " (-14.6 %), -15.2 % since session 49 maps the framework's replicated TP embedding (the 1.58B-parameter table"
    " gathered whole over 90 nodes on every TP rank), its bf16 model and loss: estimated step 22.5 s against the"
    " published 19.09 s, FSDP's exposure 4.05 s of it; -17.7 % since session 61 maps its TP plan's per-linear"
    " inputs (--estimate.tp_inputs=linear: 3 more backward reduce-scatters a block). Each FSDP ring has one rank on each of 90 nodes, as under TP"
    " 8 in torchtitan's 405B rows, which are also estimated slow; the same framework's accumulating TP 4 x FSDP"
    " rows are estimated fast (+16 .. +26 % for 7B and 70B): the network per node is the unstated assumption"
    " (400 Gb/s per GPU): not explained"
)
_KEMPNER_175B_MEM = (
    "KempnerForge's 175B run's peak (torch's max allocated, the largest over 2,000 steps: 53.8 GiB; mapped in session"
    " 49 after the framework's replicated TP embedding, held out from that mapping, as were the weak-scaling"
    " campaign's seven peaks, all within 5.3 %): estimated 59.9 GiB allocated, +11.4 %, of which activations under"
    " full AC at 8 x 4096 (26.1) and the loss on bf16 logits of the whole vocabulary on every TP rank (23.5) are"
    " most; the states are 3.7. Not explained"
)
_KEMPNER_TP_PP = (
    "KempnerForge's config validation report (code 601aba9, 2026-04; out of sample, twenty-fifth pass): the"
    " three pipeline rows, PP x FSDP x TP 4 on 8 nodes of 4 H200, 1F1B with 4 / 8 / 4 micro-batches, eager"
    " (compile off), full AC, FSDP resharding after every micro-batch's forward: 13B PP 2 +26.8 %, 29B PP 2"
    " +54.9 %, 70B PP 4 +39.5 % (+71.1 / +98.5 / +82.0 % as first estimated; +71.5 / +93.2 / +76.0 % after FSDP's"
    " accumulation of unsharded gradients, the loss on bf16 logits, bf16 model and replicated TP embedding were"
    " mapped; since session 61 the framework's TP on a pipeline stage as its code runs it: without sequence"
    " parallelism (+46.7 / +74.4 / +58.5 % by itself), with its per-linear inputs (5 backward all-reduces a block"
    " where this trainer's plan has 2; +37.8 / +65.4 / +51.2 % with both) and its output head unsharded, the whole"
    " vocabulary's projection on every TP rank of the last stage), published steps 4.99 / 5.78 / 4.29 s against"
    " about 3.9 / 3.7 / 3.1 estimated. The same report's FSDP 4 and FSDP 32 rows fit (+9.0 / +3.7 %); Baisya's"
    " GB200 sweep has PP 4 x FSDP 2 within the goal and FSDP 2 x TP 2 x PP 2 at +20 .. +32 %: pipeline parallelism"
    " and TP are each priced, their combination is not: not explained"
)
_ULTRASCALE_TP = (
    "The Ultra-Scale Playbook's nanotron sweep, its 8B MHA shape at TP 8 on one node of 8 H100s (out of sample,"
    " thirty-third pass; 256 x 4096 tokens a step, no AC, eager, one step's wall time): micro-batch 1 x 256"
    " micro-steps +15.8 %, micro-batch 8 x 32 -17.7 % (the TP 4 x DP 2 row, micro-batch 1, +13.3 %, within):"
    " published 3,616 / 5,909 tokens/s, the larger micro-batch 1.63x faster where the estimate makes it 1.16x."
    " Mapped with nanotron's TP as vanilla sequence-parallel TP, fully exposed (estimated 8.3 / 5.8 s of a 31.3 /"
    " 27.0 s step): its hand-written overlap (tp_linear_async_communication: the forward all-gather beside the local"
    " shard's GEMM, the backward reduce-scatter beside the weight gradient's) and its backward re-gather"
    " (tp_recompute_allgather) are not priced; nor is the host's launch rate, which a micro-batch of one sequence"
    " over 8 ranks (21.8 % MFU published) may be bound by. A what-if after the errors were known, not applied:"
    " nanotron keeps bf16 parameters (no autocast casts in each of the 256 / 32 micro-steps), which neither this"
    " source's mapping nor the DDP rows' expresses; with --estimate.model_dtype=bfloat16 the two rows would be +47.2 /"
    " +2.7 %: not explained"
)
_KEMPNER_PP_MEM = (
    "KempnerForge's config validation report (code 601aba9; out of sample, twenty-fifth pass), rank 0's peak (torch's"
    " max allocated, the first stage) of the 13B PP 2 and 70B PP 4 rows (PP x FSDP x TP 4, 1F1B, full AC, eager):"
    " 24.0 / 51.0 GiB published, +15.1 / +10.4 % estimated since session 61 maps the framework's TP on a pipeline"
    " stage without sequence parallelism (its plan's seq_parallel = not is_pp_stage), which puts each block's saved"
    " input and the recompute's norms at the whole sequence on every TP rank (-9.8 / +1.9 % with sequence"
    " parallelism, as mapped before; the 29B row +7.1 %, -0.5 % before). Under full AC a stage keeps its blocks'"
    " inputs for the micro-batches in flight (on rank 0, 2 of the PP 2 row's 4 micro-batches, all 4 of the PP 4"
    " row's): the memory sits between the two mappings: not explained"
)
_BAISYA_CP = (
    "Baisya's torchtitan sweep on 8 GB200 (out of sample, twenty-first pass), FSDP 2 x TP 2 x CP 2 at 32 x"
    " 2048, 32 x 4096 and 64 x 2048, compiled (allgather and per-op SAC assumed): 15,735 / 15,557 / 15,892"
    " tokens/s published, estimated +15.0 / +15.3 / +16.3 % since session 59 priced FSDP2's gather copy-in on its own"
    " stream, beside the compute (+14.2 / +14.9 / +15.9 %, the first two inside, since session 58 priced FSDP2's own"
    " copies as measured; +15.7 / +15.6 / +16.7 % before; +15.8 / +15.7 / +16.8 % before the TP embedding's"
    " gradient reduce-scatter was priced, session 52; +17.6 / +18.1 / +18.6 % until Blackwell's attention"
    " was priced at its sustained rate, session 50), with the FSDP 2 x TP 2 x PP 2 rows (+20.0 .. +32.0 %) above"
    " the level of the same table's one-dimension rows (+3.3 .. +12.0 %). The three were"
    " all within the goal (-10.7 / +3.5 / -10.3 %) only while the B200 attention curve kept its benchmark's host"
    " time per call, which priced their per-rank calls of 1,024-2,048 tokens at a quarter to a half of the"
    " kernel's rate (docs/estimate_log.md, 2026-12-03). Published, TP 2 x CP 2 runs 14 % below the TP 2 x"
    " FSDP 4 row (18,258) per GPU, estimated 9 %: not explained"
)
_BAISYA_CP_MEM = (
    "Baisya's torchtitan sweep on 8 GB200 (out of sample, twenty-first pass), FSDP 2 x TP 2 x CP 2 (allgather"
    " and per-op SAC assumed): published 50 % / 97 % / 97 % of the device (92.0 / 178.5 / 178.5 GiB) at 32 x"
    " 2048, 32 x 4096 and 64 x 2048, estimated 62.1 / 106.4 / 106.4 GiB (-32.5 / -40.4 / -40.4 %); their"
    " tokens/s are estimated +14.2 / +14.9 / +15.9 % (the last outside, _BAISYA_CP). At 32 x 4096 each rank holds the"
    " tokens of the TP 2 x FSDP 4 row at 32 x 2048 (65,536), whose published 123.3 GiB the estimate puts at"
    " 106.4 too (-13.7 %): CP adds 55 GiB in the run and nothing in the estimate. The K and V that CP's"
    " all-gather rotation gathers to the whole sequence (16 heads a TP rank after torchtitan's repeat_kv: about"
    " 34 GB over 32 blocks at 32 x 4096) would be of that size if kept for backward; they are not (read in"
    " session 54, torch 2.13's _context_parallel/_attention.py: the ring runs inside the SDPA op's own"
    " forward, whose autograd node saves the op's local query, key, value, output and logsumexp; the gathered"
    " buffer lives in the rotater for that call, and the backward op gathers K and V again). Two of the three"
    " rows are at 97 %, where the caching allocator's reserve is bounded by the device: not explained"
)
_BAISYA_TP_MEM = (
    "Baisya's torchtitan sweep on 8 GB200 (out of sample, twenty-first pass), TP 2 x FSDP 4 at 32 x 2048,"
    " compiled, per-op SAC assumed: published 67 % of the device (123.3 GiB), estimated 106.8 (-13.4 %); its"
    " tokens/s are estimated +11.7 %. The same table's FSDP 8 and HSDP rows are estimated high (+2.9 .. +10.8"
    " %); what TP 2 holds more of than the estimate (sequence-parallel norms' and the loss-parallel logits'"
    " buffers are priced) is not published: not explained"
)
_BAISYA_HSDP_MEM = (
    "Baisya's torchtitan sweep on 8 GB200 (out of sample, twenty-first pass), HSDP 4 x 2 at 32 x 2048, compiled,"
    " per-op SAC assumed: published 95 % of the device (174.8 GiB), estimated 193.6 (+10.8 %), so the estimate says"
    " it does not fit where it ran. The same table's other FSDP 8 and HSDP rows are estimated +2.9 .. +9.7 %, all"
    " high, the compiled ones +7.5 .. +7.8 %: the estimate's activations of compiled per-op SAC at 2,048 tokens a"
    " sequence are high for this run by about as much as the goal's margin; at 95 % the reserve may also be what the"
    " allocator could take, not what the run needed: not explained"
)

_PR275 = (
    "pytorch-labs/float8_experimental#275 (torchtitan of 2024-06-12: Llama 3 8B, FSDP 2 x TP 4 on 8 H100, batch 1 x"
    " 8192 and per-op SAC assumed, Float8DynamicLinear with the float8 sequence-parallel inputs; out of sample,"
    " twenty-first pass): the compiled run 6,592 wps published, estimated -17.0 %, the eager run 3,900, estimated"
    " +19.0 %: published compile / eager 1.69x, estimated 1.18x. Since session 58 FSDP2's own copies are priced as"
    " measured on an H200 (the gather copy-in at 0.30 of the bandwidth, the reduce copy-in at 0.41), which at FSDP"
    " 2 puts half of each unit through the gather copy-in: -14.1 / +23.8 % before; -21.5 / +14.6 % while the gather"
    " copy-in was priced on the compute stream (session 59 moved it to its own stream, as torch runs it, and priced"
    " the eager run's RoPE upcasts at their measured rate). What the"
    " compiled run of 2024 did not do that the estimate prices (torch's FSDP2 of then, its copies, the float8"
    " sequence-parallel casts under compile) is not published: not explained"
)
_TITAN_405B_FLOAT8 = (
    "torchtitan's 405B table (FSDP 16 x TP 8 on 128 H100 96GB at 500 W, seq 8192, batch 2, full AC): the float8"
    " rows (compiled, float8 all-gather with precomputed scales; without / with async TP) 177 / 185 tokens/s"
    " published, estimated -16.0 / -15.8 %, the bf16 eager row -9.2 %, all low (session 59's changes to FSDP2's copy-in, the rings' bandwidth share and eager RoPE moved them by 0.2 points or less). Since session 58 FSDP2's own"
    " copies are priced as measured on an H200 (-14.8 / -14.6 / -8.3 % before): each unit's gather copy-in and the"
    " reduce copy-in of its fp32 gradients add about 1 point. The table's float8 speed-up over eager bf16 (1.62x"
    " published, 1.51x estimated) is what the estimate misses: not explained"
)
_SAC_OP_EAGER_8K = (
    "torchtitan's 8B on 8 H100 at batch 1 x 8192, per-op SAC, eager (torchtitan#1625's run with fused AdamW,"
    " 2025-08; #1881's, 2025-10, at 7,380 is inside since session 60, -14.6 %): 7,031 tokens/s published, estimated"
    " -15.7 %, too slow where"
    " the float8nocompile table's 8B at 4,096 on the same layout is estimated +2.2 .. +5.7 % too fast. Since session"
    " 58 FSDP2's own copies are priced as measured on an H200 (-13.8 / -12.4 % before; -17.0 / -15.9 % in session 58;"
    " in session 59 -15.6 / -14.5 % with the gather copy-in on its own stream, beside the compute, then these with"
    " eager RoPE's upcasts at their measured rate, -16.5 / -15.4 %, until session 60 priced the upcasts per SM and"
    " clock, faster on an H100 than the H200's fraction of its bandwidth); the step of per-op SAC"
    " at 8,192 tokens (its saved matmul outputs, the recomputed elementwise ops) is priced high by about 0.1 s"
    " here, not measured on a GPU: not explained"
)

_BAISYA_PP_EAGER_MEM = (
    "Baisya's torchtitan sweep on 8 GB200 (out of sample, twenty-first pass), PP 4 x FSDP 2 at 8 x 8192, eager:"
    " published 89 % of the device (163.8 GiB, rank 0's log line assumed), estimated 50.8 GiB for the first stage"
    " (-69.0 %). Its compiled twin at the same batch is published at 27 % (49.7 GiB) and estimated -3.6 %, and the"
    " table's other nine pipeline peaks are estimated -5.6 .. +0.6 %; the blog itself reports the pair as compile's"
    " '-70% mem!'. Eager per-op SAC keeps no more than compiled SAC here in the estimate (50.8 against 47.9 GiB); what"
    " the eager run held (another configuration, or a peak the allocator kept from elsewhere in the run) is not"
    " published: not explained"
)

_THUNDER1156 = (
    "lightning-thunder#1156's PyTorch baseline (Llama-3-8B under FSDP2 with torch.compile, batch 1 x 8192, no AC, the"
    " model cast to bf16, zero2 / zero3, 2024-09; out of sample, thirtieth pass): 11,596.72 / 11,206.86 tokens/s/GPU"
    " published, estimated -21.3 / -20.1 % (-21.6 / -20.6 % until session 59 moved FSDP2's gather copy-in to its own stream) on the assumed 8 H100 SXM at 700 W (the description names no GPU; the"
    " same author's PRs of 2024-08 .. 12 ran 8 H100); their allocated memory fits (+3.7 / +4.3 %). The published"
    " steps, 0.71 / 0.73 s for 8,192 tokens, are not much longer than the estimate's matmul and attention alone"
    " (0.50 + 0.22 s at the H100 SXM's measured GEMM and FlashAttention-2 rates): 68 / 66 % MFU by torchtitan's formula,"
    " where torchtitan's and Accelerate's runs of this configuration published 7,264 and 8,000 (estimated +9.0 /"
    " +9.9 %); the same script's float8 row three months later (#1528, 12,414) is only 1.07x faster. Another part,"
    " or a figure counted otherwise, would explain it; neither is stated: not explained"
)

OUTSIDE: dict[tuple[str, str], str] = {
    (
        "h100_8b_cp4_128k",
        "tokens/s/device",
    ): "CP 4 at 128K (+24.1 %): from CP 2 to CP 4 the published throughput per FLOP drops ~28 % (368 -> 266"
    " TFLOPS per GPU) at the same per-rank sequence (32K); torch's ring attention (round-robin load balance) runs"
    " 1 causal and cp - 1 unmasked kernels per pass, which the estimator now prices as such (faster than all"
    " causal: CP 2 -11.5 -> -8.1 %, CP 4 +16.5 -> +24.1 %), its K/V all-gather overlaps the first step and is"
    " priced as exposed; the fp32 merge of the ring steps and torchtitan's repeated K/V (repeat_kv, 2 %) do not"
    " explain the drop (CP 1 and 2 fit)",
    ("h100_8b_cp8_256k", "tokens/s/device"): "CP 8 at 256K (+30.3 %): same as CP 4",
    **{
        (f"mi300x_8b_fsdp8_b1_{r}_torchao", "tokens/s/device"): _MI300X
        for r in ("bf16", "tensorwise", "rowwise")
    },
    ("mi300x_8b_fsdp8_b1_sac_op_eager_gpuaidev", "tokens/s/device"): "AMD's AI Developer Hub torchtitan run"
    " (+45.0 %, out of sample, session 55): the same model, layout, batch and AC as torchao's MI300X rows, eager, on"
    " torch 2.7.0.dev of 2025-03 (AOTriton's SDPA), estimated as far above its figure as they are; "
    + _MI300X,
    ("a100x2_llama31_70b_bf16_tp2", "decode tokens/s"): _GPT_FAST_70B_TP2,
    ("a100x8_llama31_405b_int8_tp8", "decode tokens/s"): _GPT_FAST_405B,
    **{
        (f"b200_8b_fsdp8_b1_{r}_torchao", "tokens/s/device"): _B200 for r in ("bf16", "tensorwise", "rowwise")
    },
    **{(f"b200_8b_fsdp8_b1_{r}_torchao", "memory GiB"): _B200_MEM for r in ("bf16", "tensorwise", "rowwise")},
    **{
        (f"b200_hf_llama32_1b_{shape}_sgd_bf16", "tokens/s/device"): _CUDNN_FE_B200
        for shape in (
            *(
                f"{bs}_cudnn"
                for bs in ("b24_s768", "b12_s1024", "b6_s2048", "b3_s4096", "b2_s8192", "b1_s16384")
            ),
            *(f"{bs}_flash" for bs in ("b24_s768", "b12_s1024")),
        )
    },
    ("h100_llama31_8b_bf16_torchao", "decode tokens/s"): _TORCHAO_H100_DECODE,
    ("h100_llama31_8b_int8_torchao", "decode tokens/s"): _TORCHAO_H100_DECODE,
    **{
        (f"h100_llama2_7b_{w}_gpt_fast_pr191", "decode tokens/s"): _PR191_H100_DECODE
        for w in ("bf16", "int8", "int4")
    },
    ("a100_llama2_7b_int4", "decode tokens/s"): _GPT_FAST_INT4_CV,
    ("aws_h100_8b_fsdp32_eager", "memory GiB"): _AWS_MEM,
    ("aws_h100_8b_fsdp32_compile", "memory GiB"): _AWS_MEM,
    ("lingua_h100_7b_fsdp8_compile_no_ac", "tokens/s/device"): _LINGUA,
    ("h100_llama2_7b_fsdp4_tp2_b16_full_eager_pr165", "memory GiB"): _PR165_2D_MEM,
    ("h100_llama2_7b_fsdp4_tp2_b16_sac_op_eager_pr165", "memory GiB"): _PR165_2D_MEM,
    **{(f"a100_8b_fsdp8_b1_sac_op_eager_{o}_pr355", "tokens/s/device"): _PR355 for o in ("foreach", "fused")},
    **{(f"a100_8b_fsdp8_b1_sac_op_eager_{o}_pr355", "memory GiB"): _PR355_MEM for o in ("foreach", "fused")},
    ("h100_8b_fsdp4_tp2_b1_sac_op_compile_pr642", "memory GiB"): _PR642_MEM,
    ("a100_8b_fsdp8_b1_sac_op_compile_fused_issue929", "tokens/s/device"): _ISSUE929,
    **{
        (f"{r}_sac_op_eager_crusoe", "tokens/s/device"): _CRUSOE
        for r in ("h100_8b_fsdp128_b2", "h100_8b_fsdp32_b2")
    },
    ("h200x4_7b_tp2_kempnerforge", "tokens/s/device"): _KEMPNER_TP,
    **{
        (f"h200x4_{m}", "tokens/s/device"): _KEMPNER_NO_SYNC
        for m in (
            "70b_tp4_fsdp8_kempnerforge",
            *(f"70b_tp4_fsdp{n}_kempnerforge_weak" for n in (16, 24, 32, 40)),
        )
    },
    ("h200x4_175b_tp4_fsdp90_kempnerforge", "tokens/s/device"): _KEMPNER_175B,
    ("h200x4_175b_tp4_fsdp90_kempnerforge", "memory GiB"): _KEMPNER_175B_MEM,
    **{
        (f"h200x4_{m}_kempnerforge_cv", "tokens/s/device"): _KEMPNER_TP_PP
        for m in ("13b_pp2_fsdp4_tp4", "29b_pp2_fsdp4_tp4", "70b_pp4_fsdp2_tp4")
    },
    **{
        (f"h200x4_{m}_kempnerforge_cv", "memory GiB"): _KEMPNER_PP_MEM
        for m in ("13b_pp2_fsdp4_tp4", "70b_pp4_fsdp2_tp4")
    },
    **{
        (f"h100_ultrascale_8b_mha_dp1_tp8_{m}_none_eager", "tokens/s/device"): _ULTRASCALE_TP
        for m in ("b1_ga256", "b8_ga32")
    },
    **{
        (f"a100_{r}_b1_none_eager_yafsdp", "tokens/s/device"): _YAFSDP
        for r in (
            "l2_7b_fsdp64_s2048",
            "l2_7b_fsdp128_s2048",
            "l2_13b_fsdp128_s2048",
            "l2_34b_fsdp128_s2048",
            "l2_34b_fsdp256_s2048",
            "l3_8b_fsdp64_s2048",
            "l3_8b_fsdp64_s4096",
        )
    },
    ("h100_8b_fsdp8_b1_no_ac_eager_pr467", "memory GiB"): _PR467_MEM,
    ("cpu_large_2proc_tp2_b4_1125", "step time s"): _CPU_LARGE_TP2,
    ("cpu_debug8l_2proc_pp2_gpipe_s22", "step time s"): _CPU_PP_GPIPE,
    ("cpu_large_2proc_ddp_b2_s22", "max RSS GiB"): _CPU_HELDOUT2_MEM,
    ("cpu_large_2proc_fsdp_full_ac_b4_s22", "max RSS GiB"): _CPU_HELDOUT2_MEM,
    ("cpu_large_2proc_fsdp_b1_s1024_s24", "max RSS GiB"): _CPU_HELDOUT4_MEM,
    ("cpu_large_2proc_ddp_full_ac_b4_s24", "step time s"): _CPU_HELDOUT5_STEP,
    ("cpu_w2048l2_1proc_fp32_b1_s128_s41", "step time s"): _CPU_HELDOUT11_STEP,
    **{
        (f"a100_sheared_llama_{m}_fsdp16_b16_s4096_full_eager", "tokens/s/device"): _SHEARED
        for m in ("2p7b", "1p3b")
    },
    ("mi355x_70b_tp4_fsdp2_b1_ga16_sac2_eager_cvs", "tokens/s/device"): _MI355X_CVS,
    ("a100_8b_fsdp8_b1_sac_op_eager_fused_pr887", "tokens/s/device"): _PR887,
    ("a100_8b_fsdp8_b1_sac_op_eager_fused_pr887", "memory GiB"): _PR887,
    ("h100_8b_fsdp64_b1_sac_op_eager_pr1881", "tokens/s/device"): _PR1881_64,
    ("h100_8b_fsdp64_b1_sac_op_eager_pr1881", "memory GiB"): _PR1881_64,
    ("h100_8b_fsdp4_tp2_b1_sac_op_compile_foreach_ao1718", "tokens/s/device"): _AO1718,
    **{
        (f"h100_8b_fsdp8_b1_sac_op_compile_{r}_ao2304", "memory GiB"): _AO2304_MEM
        for r in ("bf16", "rowwise", "tensorwise")
    },
    **{
        (f"gb200_8b_fsdp2_tp2_pp2_b{b}_s{s}_sac_op_compile_baisya", "tokens/s/device"): _BAISYA_3D
        for b, s in ((32, 4096), (32, 8192), (64, 16384), (128, 16384), (256, 16384), (512, 16384))
    },
    **{
        (f"gb200_8b_fsdp2_tp2_cp2_b{b}_s{s}_sac_op_compile_baisya", "tokens/s/device"): _BAISYA_CP
        for b, s in ((32, 2048), (32, 4096), (64, 2048))
    },
    **{
        (f"gb200_8b_fsdp2_tp2_cp2_b{b}_s{s}_sac_op_compile_baisya", "memory GiB"): _BAISYA_CP_MEM
        for b, s in ((32, 2048), (32, 4096), (64, 2048))
    },
    ("gb200_8b_fsdp4_tp2_b32_s2048_sac_op_compile_baisya", "memory GiB"): _BAISYA_TP_MEM,
    ("gb200_8b_hsdp2x4_b32_s2048_sac_op_compile_baisya", "memory GiB"): _BAISYA_HSDP_MEM,
    **{
        (f"h100_8b_fsdp2_tp4_b1_sac_op_{c}_float8_sp_pr275", "tokens/s/device"): _PR275
        for c in ("compile", "eager")
    },
    **{(f"h100_405b_fsdp16_tp8_float8{a}", "tokens/s/device"): _TITAN_405B_FLOAT8 for a in ("", "_async_tp")},
    ("h100_8b_fsdp8_b1_sac_op_eager_fused_pr1625", "tokens/s/device"): _SAC_OP_EAGER_8K,
    **{
        (f"h100sxm_8b_fsdp8_b1_no_ac_{z}_compile_bf16model_thunder1156", "tokens/s/device"): _THUNDER1156
        for z in ("zero2", "zero3")
    },
    ("gb200_8b_fsdp2_pp4_b8_s8192_sac_op_eager_baisya", "memory GiB"): _BAISYA_PP_EAGER_MEM,
    ("h100_ultrascale_1b_mha_ddp64_b2_ga2_none_eager", "tokens/s/device"): _ULTRASCALE_ANOMALY,
    ("h100_d256l6_mha_fsdp8_b8_s2048_sac2_eager_issue1293", "tokens/s/device"): (
        "torchtitan#1293's debug model on FSDP 8 H100s (dim 256, 6 layers: 5.7 M parameters; twenty-ninth pass):"
        " 517,539 tokens/s published, 1,282,209 estimated (+147.8 %). The estimate prices the step's GPU work,"
        " 12.8 ms for 8 x 2048 tokens; the published step is 31.7 ms. At this size the eager host issues kernels"
        " slower than the GPU runs them, and the estimator has no host term (session 55's what-if, 8.1 us an"
        " operator measured on this project's H200, found no other row host-bound). The same issue's dim-4096"
        " model on the same run fits (+9.0 %): not priced"
    ),
}


def _params():
    out = []
    for x in CV:
        key = (x["id"], x["what"])
        marks = [pytest.mark.xfail(strict=True, reason=OUTSIDE[key])] if key in OUTSIDE else []
        out.append(pytest.param(x, id=f"{x['id']}-{x['what'].replace(' ', '_')}", marks=marks))
    return out


@pytest.mark.parametrize("row", _params())
def test_cross_validated_row_within_goal(row):
    assert abs(row["error"]) <= row["goal"], (
        f"{row['id']} {row['what']}: estimated {row['estimated']:,.4g} vs published {row['published']:,.4g}"
        f" ({row['error']:+.1%}, goal ±{row['goal']:.0%})"
    )


def test_outside_list_names_real_rows():
    keys = {(x["id"], x["what"]) for x in CV}
    assert set(OUTSIDE) <= keys, set(OUTSIDE) - keys


def test_cross_validated_median_error():
    """The goal's median (<= 5 %), over every figure, cross-validated: met from session 23 (4.73 % over 359
    figures; 4.56 % over 392 in session 24), where the CPU step times became the trainer's own steps measured at two
    depths, to session 47 (4.99 % over 555); not met in sessions 48-49 (5.16 % over 579 and 609, when
    cudnn-frontend's Llama-3.2-1B rows came in, its B200 rows 20.5-56.5 % too fast); met again since session 50
    (4.95 % over 609), when Blackwell's attention was priced at its sustained rate. The tokens/s and TFLOPS figures
    alone are at 7.9 % (docs/estimate.md, 'Where the goal stands')."""
    assert median_abs_error(CV) <= 0.05, f"{median_abs_error(CV):.1%}"


def test_only_the_fitted_quantities_differ_from_in_sample_and_the_shipped_values_are_the_fit():
    """FITTED holds the decode step's per-layer overhead (no source for it): the shipped value is its fit on every
    source, each source with decode rows is estimated with the value fitted without it, and every other source's
    held-out errors are its in-sample errors (nothing else is fitted)."""
    assert set(validation.FITTED) == {"decode_layer_overhead_us"}
    cache: dict = {}
    everywhere = validation.fit(REF, None, cache=cache)
    for name in validation.FITTED:
        assert getattr(validation.DEFAULT, name) == getattr(everywhere, name), name
    moved = set().union(*(f.quantities for f in validation.FITTED.values()))
    ins = {(x["id"], x["what"]): x["estimated"] for x in table(REF)}
    held_out = {
        s: validation.fit(REF, s, cache=cache) for s in {x["source"] for x in CV if x["what"] in moved}
    }
    for x in CV:
        if x["what"] not in moved:
            assert x["estimated"] == ins[(x["id"], x["what"])], x["id"]
        else:
            assert x["fitted"] == {k: getattr(held_out[x["source"]], k) for k in validation.FITTED}, x["id"]


def test_a_fitted_constant_moves_only_the_quantities_it_is_chosen_on():
    """Each Fit names the quantities whose rows it is chosen on; the constant must move no row of another."""
    for name, f in validation.FITTED.items():
        lo, hi = (dataclasses.replace(validation.DEFAULT, **{name: v}) for v in (f.grid[0], f.grid[-1]))
        a, b = table(REF, lo), table(REF, hi)
        moved = {x["what"] for x, y in zip(a, b) if x["estimated"] != y["estimated"]}
        assert moved == set(f.quantities), (name, moved)


def test_cross_validation_never_sees_the_held_out_source(monkeypatch):
    """With a constant to fit, each source's constants are chosen on the other sources' rows of the fitted
    quantities only, and the held-out source's rows are then estimated with them."""
    keep = {"titan_h200", "ours_cpu"}
    ref = dict(
        REF, inference=[], **{k: [r for r in REF[k] if r["source"] in keep] for k in ("training", "cpu")}
    )
    fitted = {"hbm": validation.Fit(("tokens/s/device", "step time s"), (0.5, 0.8))}
    asked: list[tuple[frozenset, tuple]] = []
    real_table = validation.table

    def spy(r, eff=validation.DEFAULT, sources=None, quantities=None):
        asked.append((frozenset(sources or ()), quantities))
        return real_table(r, eff, sources, quantities)

    monkeypatch.setattr(validation, "table", spy)
    for held_out in keep:
        asked.clear()
        eff = validation.fit(ref, held_out, fitted)
        assert len(asked) == 2, asked
        assert all(held_out not in s and s and q == fitted["hbm"].quantities for s, q in asked), asked
        assert eff.hbm in (0.5, 0.8)
    rows = validation.cross_validated(ref, fitted=fitted)
    assert {x["source"] for x in rows} == keep
    assert all(x["fitted"]["hbm"] in (0.5, 0.8) for x in rows)


def test_power_limit_slows_compute_only():
    row = next(r for r in REF["training"] if r["id"] == "h100_8b_fsdp8_compile")
    at_500 = training_estimate(REF, row)
    ref_700 = dict(REF)
    ref_700["parts"] = {
        "h100_96gb_500w": {k: v for k, v in REF["parts"]["h100_96gb_500w"].items() if k != "power_limit_w"}
    }
    at_700 = training_estimate(ref_700, row)
    assert at_700["tokens_per_sec_per_device"] > 1.15 * at_500["tokens_per_sec_per_device"]
    assert at_700["memory_gib"] == at_500["memory_gib"]


# Orderings the estimate reverses, each with its reason.
ORDERINGS_OUTSIDE: dict[str, str] = {
    "float8_recipes_tp8_70b": (
        "torchtitan's async-TP table (2025-06), Llama 3 70B on 64 H100, FSDP 8 x TP 8, full AC, compiled: float8"
        " rowwise 599.6 tokens/s against bf16 597.3 published (0.4 % apart); estimated 593.4 against 593.7 (0.04 %"
        " apart, reversed) since the full-AC recompute stops before w2 (session 44: each recipe loses one w2"
        " forward, at its own rate); reversed before session 19 too, held by 563.1 vs 559.2 from the persistent-GEMM"
        " rule until now: a tie within the estimate's resolution, the order not explained"
    ),
}


def test_composite_rms_norm_slows_eager_only():
    """torch before 2.9 ran RMSNorm outside compile as separate kernels (--estimate.eager_rms_norm=composite)."""
    eager = next(r for r in REF["training"] if r["id"] == "h100_8b_fsdp8_eager")
    compiled = next(r for r in REF["training"] if r["id"] == "h100_8b_fsdp8_compile")
    for row, slower in ((eager, True), (compiled, False)):
        fused = dict(
            row, estimate_args=[a for a in row.get("estimate_args", []) if "eager_rms_norm" not in a]
        )
        composite = dict(row, estimate_args=[*fused["estimate_args"], "--estimate.eager_rms_norm=composite"])
        t_fused = training_estimate(REF, fused)["step_time_s"]
        t_composite = training_estimate(REF, composite)["step_time_s"]
        assert (t_composite > 1.02 * t_fused) if slower else (t_composite == t_fused), row["id"]


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=[pytest.mark.xfail(strict=True, reason=ORDERINGS_OUTSIDE[n])])
        if n in ORDERINGS_OUTSIDE
        else n
        for n in REF["orderings"]
    ],
)
def test_orderings(name):
    ids = REF["orderings"][name]
    published = [next(r for r in REF["training"] if r["id"] == i)["tokens_per_sec"] for i in ids]
    assert published == sorted(published, reverse=True)  # the data file lists them fastest first
    est = [next(x for x in CV if x["id"] == i and x["what"] == "tokens/s/device")["estimated"] for i in ids]
    assert est == sorted(est, reverse=True), dict(zip(ids, est))


# The dev-discuss post "[Distributed w/ TorchTitan] Introducing Async Tensor Parallelism in PyTorch" (2024-09),
# Figure 9, 64 H100 (FSDP 8 x TP 8, seq 8192, compiled, bf16): (flavor, local batch, forward duration ms without /
# with async TP, peak tokens/s per GPU without / with). 70B with full AC, 8B with per-op SAC (the post's text).
_ASYNC_TP_FIG9 = (
    ("70B", 12, 5629, 4724, 608, 659),
    ("70B", 8, 3765, 3124, 600, 653),
    ("70B", 4, 1937, 1610, 579, 627),
    ("8B", 12, 880, 678, 4494, 4854),
    ("8B", 8, 597, 464, 4401, 4725),
)


def _fig9_row(flavor: str, batch: int) -> dict:
    ac = ["full"] if flavor == "70B" else ["selective", "op"]
    args = [f"--model.flavor={flavor}", "--training.seq_len=8192", f"--training.local_batch_size={batch}",
            "--parallelism.tensor_parallel_degree=8", f"--activation_checkpoint.mode={ac[0]}",
            *([f"--activation_checkpoint.selective_ac_option={ac[1]}"] if len(ac) > 1 else []),
            "--compile.enable=true", "--compile.components=model", "--optimizer.implementation=foreach"]  # fmt: skip
    return dict(id=f"fig9_{flavor}_{batch}", source="async_tp_post", part="h100_96gb_500w", num_devices=64,
                args=args, estimate_args=["--estimate.attention_backend=flash"])  # fmt: skip


def _fig9_derivation():
    """efficiency.async_tp_exposed / async_tp_backward_exposed_full / async_tp_backward_exposed derived from Figure
    9: the time async TP saved (forward: the forward duration; the rest of the step: the step time from tokens/s
    per GPU, local batch x 1024 tokens per GPU, less the forward's saving, net of the change the shorter compute
    makes to FSDP's exposure) minus the sequence-parallel layout copies the estimator removes under async TP, over
    the collectives it fuses there (this estimator's ring times). Returns the hidden fractions (forward; backward by
    AC mode) and, per row, the estimator's end-to-end gain beside the published one."""
    from torchtitan.estimate import steptime as st
    from torchtitan.estimate.plan import build_plan

    fwd, bwd, gains = [], {"full": [], "op": []}, []
    for flavor, batch, f_van, f_async, tps_van, tps_async in _ASYNC_TP_FIG9:
        row = _fig9_row(flavor, batch)
        arow = dict(row, estimate_args=[*row["estimate_args"], "--estimate.async_tp=true"])
        van = build_plan(validation.training_cfg(REF, row))
        asy = build_plan(validation.training_cfg(REF, arow))
        r, tokens, mode = st.Rates(asy), asy.tokens_per_pass, "full" if flavor == "70B" else "op"
        n, has_emb, has_head = asy.rank_layers()[0]
        c_fwd, c_rec, c_bwd = st.tp_block_comm(asy, r, tokens, mode)
        fused_fwd = n * c_fwd + st._tp_edges(asy, r, tokens, has_emb, has_head) / 2
        fused_bwd = n * (c_rec + c_bwd - st.async_tp_unfused(asy, r, tokens, [mode]))
        cv, ca = st.sp_layout_copy_bytes(van, mode), st.sp_layout_copy_bytes(asy, mode)
        copies_fwd = n * (cv[0] - ca[0]) * tokens / r.hbm
        copies_bwd = n * (cv[1] + cv[2] - ca[1] - ca[2]) * tokens / r.hbm
        saved_fwd = (f_van - f_async) / 1e3
        est_van, est_async = training_estimate(REF, row), training_estimate(REF, arow)
        # the published saving also holds what the shorter compute changed in FSDP's overlap (fewer GEMMs beside
        # the rings, collectives.overlap_extension): the estimator's own change of that cost is added back, on the
        # rest of the step (the reduce-scatters and re-gathers run under the backward)
        fsdp_change = (
            est_async["step_time_breakdown_s"]["fsdp_comm_exposed"]
            - est_van["step_time_breakdown_s"]["fsdp_comm_exposed"]
        )
        saved_rest = batch * 1024 / tps_van - batch * 1024 / tps_async - saved_fwd + fsdp_change
        fwd.append((saved_fwd - copies_fwd) / fused_fwd)
        bwd[mode].append((saved_rest - copies_bwd) / fused_bwd)
        gain = est_async["tokens_per_sec_per_device"] / est_van["tokens_per_sec_per_device"]
        gains.append((gain, tps_async / tps_van, flavor, batch))
    return fwd, bwd, gains


def test_async_tp_exposure_is_what_the_posts_figure_9_measured():
    """The three async-TP exposures are the means of Figure 9's derived fractions, and with them the estimator
    reproduces the figure's end-to-end gains."""
    import statistics

    fwd, bwd, gains = _fig9_derivation()
    e = validation.DEFAULT
    for gain, published, flavor, batch in gains:
        assert gain == pytest.approx(published, abs=0.01), (flavor, batch)
    assert e.async_tp_exposed == pytest.approx(1 - statistics.mean(fwd), abs=0.01)
    assert e.async_tp_backward_exposed_full == pytest.approx(1 - statistics.mean(bwd["full"]), abs=0.01)
    assert e.async_tp_backward_exposed == pytest.approx(1 - statistics.mean(bwd["op"]), abs=0.01)


@pytest.mark.xfail(
    strict=True,
    reason="Figure 9's backward fraction under full AC spreads 0.095 across the 70B batches (0.011 / 0.078 /"
    " -0.017 at 12 / 8 / 4), more than the 0.05 this check allows: 0.029 before the persistent-GEMM rule"
    " (collectives.overlap_extension) priced FSDP's overlap, 0.078 from then until the full-AC recompute stopped"
    " before w2's reduce-scatter (session 44). The figure's tokens/s are 3-digit integers, worth +-0.017 of this"
    " fraction per row: not explained",
)
def test_async_tp_derivation_is_consistent_across_batches():
    fwd, bwd, _ = _fig9_derivation()
    assert max(fwd) - min(fwd) < 0.1
    assert max(bwd["full"]) - min(bwd["full"]) < 0.05


# Runs that ran (a published or measured peak) which the estimate says do not fit, with the reason.
FITS_OUTSIDE = {"gb200_8b_hsdp2x4_b32_s2048_sac_op_compile_baisya": _BAISYA_HSDP_MEM}


@pytest.mark.parametrize(
    "row",
    [
        pytest.param(
            row,
            id=row["id"],
            marks=[pytest.mark.xfail(strict=True, reason=FITS_OUTSIDE[row["id"]])]
            if row["id"] in FITS_OUTSIDE
            else [],
        )
        for row in REF["training"]
        if "memory_gib" in row
    ],
)
def test_every_measured_run_fits(row):
    assert training_estimate(REF, row)["fits"], row["id"]


def test_fits_outside_names_measured_rows():
    assert set(FITS_OUTSIDE) <= {row["id"] for row in REF["training"] if "memory_gib" in row}


# Published out-of-memory facts (the reference file's [[oom]] rows) the estimate still says fit, with the reason.
OOM_OUTSIDE = {
    "h100_gpt2shape_fsdp4_b6_no_ac_compile_pr533_oom": (
        "torchtitan#533's compiled GPT-2-sized run on 4 H100 96GB: 'the max local batch size is 5'. Batch 6 is"
        " estimated at 90.76 GiB, 3.5 % below the 94.04 the device leaves beside the CUDA context; batch 5's published"
        " 81.67 GiB is estimated 75.95 (-7.0 %, within the memory goal), and batch 5's figure plus the estimate's 14.8"
        " GiB per sequence is 96.5: the boundary sits inside the memory goal of the capacity. The report says so"
        " (accuracy.py: 4 of 58 comparable peaks were estimated low by more than the headroom). Anchored on batch 5"
        " (--estimate.anchor; tests/test_estimate_anchor.py), batch 6 does not fit"
    ),
}


@pytest.mark.parametrize(
    "row",
    [
        pytest.param(r, id=r["id"], marks=[pytest.mark.xfail(strict=True, reason=OOM_OUTSIDE[r["id"]])])
        if r["id"] in OOM_OUTSIDE
        else pytest.param(r, id=r["id"])
        for r in REF["oom"]
    ],
)
def test_every_published_out_of_memory_run_does_not_fit(row):
    assert row["source"] in REF["sources"] and row["table"]
    assert not training_estimate(REF, row)["fits"]


_TUNING_FLAGS = ("--activation_checkpoint.", "--training.local_batch_size=")


def test_a_tuned_row_is_the_fastest_fitting_plan_over_ac_and_batch():
    """A source that chose AC and the batch for speed (`tuned = true`) is estimated as the fastest fitting plan over the
    search's AC modes and local batches: checked against every candidate estimated on its own."""
    base = next(r for r in REF["training"] if r["id"] == "h100_8b_fsdp8_compile")
    row = dict(base, args=[a for a in base["args"] if not a.startswith(_TUNING_FLAGS)], tuned=True)
    best = training_estimate(REF, row)
    fitting = []
    for mode in ("none", "selective", "full"):
        for batch in (1, 2, 4, 8, 16, 32):
            knobs = [f"--activation_checkpoint.mode={mode}", "--activation_checkpoint.selective_ac_option=op",
                     f"--training.local_batch_size={batch}"]  # fmt: skip
            e = training_estimate(REF, dict(row, args=[*row["args"], *knobs], tuned=False))
            if e["fits"]:
                fitting.append(e)
    assert len(fitting) > 1  # the choice is a real one here
    top = max(fitting, key=lambda e: e["tokens_per_sec_per_device"])
    assert best["tokens_per_sec_per_device"] == top["tokens_per_sec_per_device"]
    assert (best["layout"]["ac_mode"], best["layout"]["local_batch_size"]) == (
        top["layout"]["ac_mode"],
        top["layout"]["local_batch_size"],
    )


def test_tuned_rows_leave_the_tuned_knobs_to_the_estimate():
    tuned = [r for r in REF["training"] if r.get("tuned")]
    assert tuned
    for r in tuned:
        assert not [a for a in r["args"] if a.startswith(_TUNING_FLAGS)], r["id"]
        assert "memory_gib" not in r, r["id"]  # the peak of a configuration the source does not state


def test_efficiency_fields_are_not_rates():
    """Compute rates live in rates.py with their sources; Efficiency keeps bandwidth fractions and structure."""
    names = {f.name for f in dataclasses.fields(validation.DEFAULT)}
    assert not names & {"matmul_bf16", "matmul_fp8", "attention_fwd", "attention_bwd"}


def test_device_rates_reproduce_their_measurements():
    """Each per-device rate, asked at the shape its source measured, returns the source's figure: the H100 at 500 W
    (FBGEMM's 585.23 TFLOPS bf16 at 8192^3), MI300X float8 (hipBLASLt's 907 TFLOPS at 8192^3) and MI300X flash
    attention (CK FA2's 353.22 forward / 194.43 backward TFLOPS, non-causal, 16K)."""
    from torchtitan.estimate import rates

    h100 = (
        989.0
        * rates.gemm_efficiency("H100 SXM", "bf16", 8192, 8192, 8192)
        * rates.power_factor("H100 SXM", 500.0)
    )
    assert h100 == pytest.approx(rates.H100_500W_BF16_8192, rel=1e-6)
    mi_fp8 = 2615.0 * rates.gemm_efficiency("MI300X", "fp8", 8192, 8192, 8192)
    assert mi_fp8 == pytest.approx(rates.MI300X_FP8_8192, rel=1e-6)
    fwd = 1307.0 * rates.attention_fraction("MI300X", 16384, backward=False, causal=False)
    bwd = 1307.0 * rates.attention_fraction("MI300X", 16384, backward=True, causal=False)
    assert fwd == pytest.approx(rates.FA2_MI300X_FWD_16K, rel=1e-6)
    assert bwd == pytest.approx(rates.FA2_MI300X_BWD_16K, rel=1e-6)
    # the H100 curve is untouched by the MI300X figures
    h100_fa2 = 989.0 * rates.attention_fraction(
        "H100 SXM", 16384, backward=False, causal=False, backend="flash"
    )
    assert h100_fa2 == pytest.approx(370.0)


def test_a100_attention_reproduces_flashattention2s_a100_benchmark():
    """The A100 flash-attention rates are FlashAttention-2's published A100 forward + backward figure (head dim 128,
    causal: 99..189 TFLOPS at 512..16K) at every length; the non-causal panel of the same figure (187, 196, 201,
    203 at 2K..16K), which set nothing, is reproduced within 3 %, and the forward / backward plateaus agree with the
    paper's "up to 73 %" / "up to 63 %" of 312 TFLOPS."""
    from torchtitan.estimate import rates

    def causal(seq, backward):
        return 312.0 * rates.attention_fraction("A100", seq, backward)

    def noncausal(seq, backward):
        return 312.0 * rates.attention_fraction("A100", seq, backward, causal=False)

    for seq, published in zip(rates.FA_SEQ, rates.FA2_A100_FWDBWD_CAUSAL):
        assert rates.fwd_bwd_tflops(causal, seq) == pytest.approx(published, rel=1e-9)
    for seq, published in zip(rates.FA_SEQ[2:], (187.0, 196.0, 201.0, 203.0)):
        assert rates.fwd_bwd_tflops(noncausal, seq) == pytest.approx(published, rel=0.03)
    assert noncausal(16384, False) / 312.0 == pytest.approx(0.73, abs=0.015)
    assert noncausal(16384, True) / 312.0 == pytest.approx(0.63, abs=0.015)


def test_a100_gemm_reproduces_its_8192_measurement():
    """The A100's bf16 GEMM at 8192^3 is torch.mm's measured 257 TFLOPS with randn inputs (thonking.ai, 2024), below
    its MAMF (271.2 at a shape search's best); the 40 GB part shares it; a shape the tiling model puts below the
    MAMF's best keeps its relative factor."""
    from torchtitan.estimate import rates

    for part in ("A100", "A100 40GB"):
        assert 312.0 * rates.gemm_efficiency(part, "bf16", 8192, 8192, 8192) == pytest.approx(257.0, rel=1e-6)
    src, _ = rates.gemm_source("A100")
    small = rates.shape_factor(4096, 1024, 8192, 108) / rates.shape_factor(*src.best_shape, 108)
    assert small < 1
    assert 312.0 * rates.gemm_efficiency("A100", "bf16", 4096, 1024, 8192) == pytest.approx(257.0 * small)


def test_hopper_700w_gemms_at_their_sustained_rate():
    """The 700 W Hopper SXM parts sustain mamf-finder's MSMF measured on an H200 node (bf16 755 TFLOPS at
    1536x2816x6144, float8 1330 at 1536x2816x10240), below the burst MAMF (794.5); smaller shapes keep their relative
    tiling factor; the 500 W H100 keeps FBGEMM's 585.23 at 8192^3 (the power exponent is solved from the two sustained
    points), and its attention keeps the factor it had before (burst-to-sustained x the power factor = 585.23 over
    the burst rate at 8192^3)."""
    from torchtitan.estimate import rates

    for part in ("H100 SXM", "H200"):
        assert 989.0 * rates.gemm_efficiency(part, "bf16", 1536, 2816, 6144) == pytest.approx(755.0, rel=1e-9)
        assert 1978.0 * rates.gemm_efficiency(part, "fp8", 1536, 2816, 10240) == pytest.approx(
            1330.0, rel=1e-9
        )
        at_8192 = 989.0 * rates.gemm_efficiency(part, "bf16", 8192, 8192, 8192)
        assert at_8192 < 755.0
        assert at_8192 == pytest.approx(
            755.0 * rates.shape_factor(8192, 8192, 8192, 132) / rates.shape_factor(1536, 2816, 6144, 132)
        )
    burst_8192 = (
        794.5 * rates.shape_factor(8192, 8192, 8192, 132) / rates.shape_factor(2048, 2048, 13312, 132)
    )
    assert rates.attention_sustained_factor("H200") == pytest.approx(at_8192 / burst_8192)
    assert rates.attention_sustained_factor("A100") == 1.0
    assert rates.attention_sustained_factor("H100 SXM") * rates.power_factor(
        "H100 SXM", 500.0
    ) == pytest.approx(rates.H100_500W_BF16_8192 / burst_8192)


def test_b200_rates_reproduce_their_measurements():
    """The B200's bf16 GEMM at 8192^3 is torchao's torch.mm measurement (pytorch/ao#2427: 1,420 TFLOPS), below the
    MAMF's best shape; its float8 GEMM is the GB200's sustained measurement (the same die at a higher power limit),
    about what the B200's own bf16 sustained / MAMF ratio makes of its FP8 MAMF; its attention is torch's cuDNN SDPA
    as cudnn-frontend measured it (causal, head dim 128) less the benchmark's host time per call, at the measured
    lengths and log2-linear between them."""
    from torchtitan.estimate import rates

    assert 2250.0 * rates.gemm_efficiency("B200", "bf16", 8192, 8192, 8192) == pytest.approx(1420.0, rel=1e-6)
    # at a 750 W cap: the mean of Meta's two cuBLAS runs (facebookexperimental/triton #814, #854), through Blackwell's
    # own power exponent; the H100's keeps FBGEMM's 500 W point (test_device_rates_reproduce_their_measurements)
    capped = 1420.0 * rates.power_factor("B200", 750.0)
    assert capped == pytest.approx((1059.0 + 1087.7) / 2, rel=1e-9)
    for part in ("B200", "GB200", "B300", "GB300", "H100 SXM", "A100"):
        blackwell = part in ("B200", "GB200", "B300", "GB300")
        assert rates.power_exponent(part) == (
            rates.BLACKWELL_POWER_EXPONENT if blackwell else rates.POWER_EXPONENT
        )
    assert rates.BLACKWELL_POWER_EXPONENT == pytest.approx(0.97, abs=0.005)
    assert rates.POWER_EXPONENT == pytest.approx(0.68, abs=0.005)
    for shape in ((8192, 8192, 8192), (15360, 4096, 3072)):  # 8192^3 and the FP8 MAMF's shape
        assert 4500.0 * rates.gemm_efficiency("B200", "fp8", *shape) == pytest.approx(2876.6, rel=1e-6)
    assert 2876.6 == pytest.approx(3432.5 * 1420.0 / 1745.0, rel=0.035)
    # the benchmark's calls (batch 1, 128 heads of 128) at 512 / 1024 tokens forward, 1024 / 2048 backward: the host
    # floor that leaves one kernel rate for both lengths of a pair
    heads = 128 * 128
    fwd_ms = [2 * heads * s * s / (t * 1e9) for s, t in ((512, 66.28), (1024, 216.11))]
    bwd_ms = [5 * heads * s * s / (t * 1e9) for s, t in ((1024, 178.132), (2048, 383.705))]
    assert (fwd_ms[0], fwd_ms[1], bwd_ms[0], bwd_ms[1]) == pytest.approx(
        (0.130, 0.159, 0.482, 0.895), abs=6e-4
    )
    assert rates.B200_HOST_FWD_S * 1e3 == pytest.approx((4 * fwd_ms[0] - fwd_ms[1]) / 3, rel=1e-9)
    assert rates.B200_HOST_BWD_S * 1e3 == pytest.approx((4 * bwd_ms[0] - bwd_ms[1]) / 3, rel=1e-9)
    assert (rates.B200_HOST_FWD_S, rates.B200_HOST_BWD_S) == pytest.approx((0.120e-3, 0.344e-3), abs=1e-6)
    measured = dict(
        zip(rates.B200_ATTN_SEQ, zip(rates.B200_CUDNN_FWD_MEASURED, rates.B200_CUDNN_BWD_MEASURED))
    )
    for seq in rates.B200_KERNEL_SEQ:
        fwd = 2250.0 * rates.attention_fraction("B200", seq, backward=False)
        bwd = 2250.0 * rates.attention_fraction("B200", seq, backward=True)
        for rate, host, mult, published in ((fwd, rates.B200_HOST_FWD_S, 2, measured[seq][0]),
                                            (bwd, rates.B200_HOST_BWD_S, 5, measured[seq][1])):  # fmt: skip
            work = mult * heads * seq * seq
            assert work / (rate * 1e12) + host == pytest.approx(work / (published * 1e12), rel=1e-9)
            if seq >= 16384:  # long calls: the host's share is under 2 %
                assert rate == pytest.approx(published, rel=0.02)
    at_1024 = 2250.0 * rates.attention_fraction("B200", 1024, backward=True)
    assert at_1024 == pytest.approx(2250.0 * rates.attention_fraction("B200", 2048, backward=True), rel=1e-9)
    # below the first kernel point, proportional to the length; between points log2-linear
    assert rates.attention_fraction("B200", 512, backward=False) == pytest.approx(
        rates.attention_fraction("B200", 1024, backward=False) / 2, rel=1e-9
    )
    mid = 2250.0 * rates.attention_fraction("B200", 8192 * 2**0.5, backward=False)
    assert mid == pytest.approx((rates.B200_CUDNN_FWD[3] + rates.B200_CUDNN_FWD[4]) / 2, rel=1e-6)
    assert (rates.B200_CUDNN_FWD[3], rates.B200_CUDNN_BWD[3]) == pytest.approx((1296.7, 1005.0), abs=0.1)
    # other devices keep their own curves
    h100_fa2 = 989.0 * rates.attention_fraction(
        "H100 SXM", 16384, backward=False, causal=False, backend="flash"
    )
    assert h100_fa2 == pytest.approx(370.0)


def test_blackwell_cudnn_attention_at_head_dim_64_is_the_measured_blackwell_ratio():
    """A cuDNN call on a Blackwell part at head dim 64 runs at 979 / 1,428 of the head-dim-128 curve (the cuDNN pair
    of flash-attention PR #2605, forward, one Blackwell part and table), at every length, forward and backward,
    causal or not, log2-interpolated up to 128; 128 and above unchanged. FlashAttention-4's pairs in the same thread
    (0.59-0.72) and cuDNN's on Hopper (0.72) bracket it. FlashAttention-2 on Blackwell keeps the H100's head-dim curves."""
    from torchtitan.estimate import rates

    ratio = 979.0 / 1428.0
    assert rates.BLACKWELL_CUDNN_D64_RATIO == pytest.approx(ratio, rel=1e-12)
    fa4_pairs = [
        (776, 1145),
        (982, 1382),
        (1112, 1559),
        (1179, 1646),
        (1218, 1745),
        (460, 785),
        (699, 1132),
        (904, 1381),
    ]
    assert min(a / b for a, b in fa4_pairs) < ratio < 0.72
    for part in ("B200", "GB200", "B300", "GB300"):
        for seq in (768, 2048, 8192, 32768):
            for backward in (False, True):
                for causal in (True, False):
                    at = functools.partial(
                        rates.attention_fraction, part, seq, backward, causal, backend="cudnn"
                    )
                    assert at(head_dim=64) == pytest.approx(at(head_dim=128) * ratio, rel=1e-12)
                    assert at(head_dim=32) == pytest.approx(at(head_dim=64), rel=1e-12)
                    assert at(head_dim=256) == pytest.approx(at(head_dim=128), rel=1e-12)
                    mid = at(head_dim=round(64 * 2**0.5))
                    assert at(head_dim=64) < mid < at(head_dim=128)
    # FlashAttention-2 on a B200 is the H100's kernel at the run's head dim (its own measured head-dim ratio)
    fa2 = functools.partial(rates.attention_fraction, "B200", 8192, False, True, backend="flash")
    assert fa2(head_dim=64) / fa2(head_dim=128) == pytest.approx(
        rates.FA2_H100_FWD_CAUSAL_D64[4] / rates.FA2_H100_FWD_CAUSAL[4], rel=1e-9
    )


def test_blackwell_attention_sustains_what_its_gemms_do():
    """Blackwell's attention curves are bursts on a B200 (cudnn-frontend's 10 timed calls): a run at the power limit
    sustains them times the B200's GEMM sustained / burst ratio (1,420 at 8192^3 over the 1,745 MAMF), the rule
    Hopper's curves follow, on every Blackwell part and both SDPA backends; flashinfer#2899's 100 back-to-back FA4
    calls on a B200 (1,450 TFLOPS at their peak, 1,237 throttled) bound it from above. Under a locked SM clock the
    rate is the burst x clock / boost wherever the clock binds, for attention as for GEMMs."""
    from torchtitan.config import parse_args
    from torchtitan.estimate import rates
    from torchtitan.estimate.plan import build_plan
    from torchtitan.estimate.steptime import Rates

    ratio = 1420.0 / 1745.0
    for part in ("B200", "GB200", "B300", "GB300"):
        assert rates.attention_sustained_factor(part) == pytest.approx(ratio, rel=1e-12)
    assert rates.LOCKABLE_CLOCK["B200"][1] == rates.BLACKWELL_ATTENTION_SUSTAINED
    assert ratio < 1237.0 / 1450.0 < 1.0

    def attention_tflops(*extra: str) -> float:
        argv = ["--model.flavor=1B", "--estimate.num_devices=1", "--estimate.hardware=b200", *extra]
        return Rates(build_plan(parse_args(argv))).attention(8192, backward=False) / 1e12

    burst = 2250.0 * rates.attention_fraction("B200", 8192, backward=False, head_dim=64)  # the 1B flavor's
    assert attention_tflops() == pytest.approx(burst * ratio, rel=1e-9)
    assert attention_tflops("--estimate.attention_backend=flash") == pytest.approx(
        2250.0 * rates.attention_fraction("B200", 8192, False, head_dim=64, backend="flash") * ratio, rel=1e-9
    )
    assert attention_tflops("--estimate.sm_clock_mhz=1400") == pytest.approx(burst * 1400 / 1965, rel=1e-9)
    assert attention_tflops("--estimate.sm_clock_mhz=1800") == pytest.approx(burst * ratio, rel=1e-9)


def test_gb200_rates_reproduce_their_measurement():
    """The GB200's float8 GEMM at 8192^3 is Azure's cuBLASLt measurement (2,876.6 TFLOPS), bf16 that times the GB200's
    own MAMFs' bf16 / FP8 ratio (1,822.0 / 3,615.6; the B200's pair is within 1 %); the same method's H100 / H200
    figures at 8192^3 (1,290.1 / 1,300.6) are within 1 % of the Hopper float8 rate here, which is what makes the
    GB200 figure usable as a sustained rate. Attention runs at the B200's measured TFLOPS (not scaled by the
    datasheets' 2,500 / 2,250), cuDNN first (sm100)."""
    from torchtitan.estimate import rates

    assert 5000.0 * rates.gemm_efficiency("GB200", "fp8", 8192, 8192, 8192) == pytest.approx(2876.6, rel=1e-9)
    bf16 = 2500.0 * rates.gemm_efficiency("GB200", "bf16", 8192, 8192, 8192)
    assert bf16 == pytest.approx(2876.6 * 1822.0 / 3615.6, rel=1e-9)
    assert 1822.0 / 3615.6 == pytest.approx(
        1745.0 / 3432.5, rel=0.01
    )  # one die, one shape search: B200's ratio
    assert 3615.6 / 2876.6 == pytest.approx(1745.0 / 1420.0, rel=0.03)  # MAMF / sustained, as the B200's bf16
    # above the B200's measured rate, below the datasheets' ratio
    assert 1420.0 < bf16 < 1420.0 * 2500.0 / 2250.0
    hopper_fp8_8192 = 1978.0 * rates.gemm_efficiency("H100 SXM", "fp8", 8192, 8192, 8192)
    for azure in (1290.1, 1300.6):
        assert hopper_fp8_8192 == pytest.approx(azure, rel=0.01)
    for seq in (2048, 8192, 32768):
        for backward in (False, True):
            gb200 = 2500.0 * rates.attention_fraction("GB200", seq, backward)
            assert gb200 == pytest.approx(2250.0 * rates.attention_fraction("B200", seq, backward), rel=1e-9)
    assert rates.attention_backend("GB200") == "cudnn"
    assert rates.power_factor("GB200", 1200.0) == 1.0 and rates.power_factor("GB200", 1000.0) < 1.0


def test_blackwell_ultra_rates_reproduce_their_sources():
    """GB300: Azure's cuBLASLt FP8 figure at 8192^3 (3,286.3 TFLOPS), bf16 by its die's MAMF ratio (the B300's: no
    GB300 MAMF is published); B300: the B200's rates raised by the power rule to 1,100 W (its MAMFs are the B200's),
    the rule predicting the GB200 -> GB300 gain within 3 % of Azure's two measurements. Attention: the Blackwell
    curve times the GB300 / GB200 ratio measured with cuDNN 9.19 (cudnn-frontend df73764) at each length, constant
    outside the measured lengths; cuDNN first (sm103)."""
    from torchtitan.estimate import rates

    at_8192 = (8192, 8192, 8192)
    assert 5000.0 * rates.gemm_efficiency("GB300", "fp8", *at_8192) == pytest.approx(3286.3, rel=1e-9)
    assert 2500.0 * rates.gemm_efficiency("GB300", "bf16", *at_8192) == pytest.approx(
        3286.3 * 1769.0 / 3353.3
    )
    gain = (1100.0 / 1000.0) ** rates.BLACKWELL_POWER_EXPONENT
    for dtype in ("bf16", "fp8"):
        for shape in (at_8192, (8192, 1024, 4096), (16384, 14336, 4096)):
            b300, b200 = (rates.gemm_efficiency(d, dtype, *shape) for d in ("B300", "B200"))
            assert b300 == pytest.approx(b200 * gain, rel=1e-9)
    predicted = (1400.0 / 1200.0) ** rates.BLACKWELL_POWER_EXPONENT
    assert predicted == pytest.approx(3286.3 / 2876.6, rel=0.03)
    assert rates.B300_MAMF_BF16 / rates.B200_MAMF_BF16 == pytest.approx(1.0, abs=0.015)
    assert rates.B300_MAMF_FP8 / rates.B200_MAMF_FP8 == pytest.approx(1.0, abs=0.025)
    for ultra, sibling in (("B300", "B200"), ("GB300", "GB200")):
        for seq, fwd, bwd in ((2048, 1266 / 1042, 906 / 836), (8192, 1887 / 1598, 1385 / 1311)):
            for backward, ratio in ((False, fwd), (True, bwd)):
                got = rates.attention_fraction(ultra, seq, backward) / rates.attention_fraction(
                    sibling, seq, backward
                )
                assert got == pytest.approx(ratio, rel=1e-9), (ultra, seq, backward)
        assert rates.attention_backend(ultra) == "cudnn"
    for seq in (512, 1024):  # below the measured lengths: the 2K ratio
        assert rates.blackwell_ultra_attention_gain(seq, False) == pytest.approx(1266 / 1042)
    assert rates.blackwell_ultra_attention_gain(131072, True) == pytest.approx(1549 / 1473)
    assert rates.power_factor("B300", 1100.0) == 1.0 and rates.power_factor("GB300", 1200.0) < 1.0


def test_blackwell_non_causal_attention_is_its_measured_ratio_over_causal():
    """Non-causal cuDNN attention on a Blackwell part (context parallelism's ring steps) is the causal rate in use
    times the no-mask / causal ratio cuDNN 9.19 measured on the part's silicon (cudnn-frontend df73764: GB200 for the
    B200 and GB200, GB300 for the B300 and GB300), the 2K ratio below 2K and the 32K one above; causal attention and
    every other part are unchanged."""
    from torchtitan.estimate import rates

    measured = {  # (seq, forward no-mask / causal, backward no-mask / causal)
        "GB200": (
            (2048, 1245 / 1042, 1089 / 836),
            (8192, 1709 / 1598, 1409 / 1311),
            (32768, 1781 / 1720, 1501 / 1473),
        ),
        "GB300": (
            (2048, 1568 / 1266, 1168 / 906),
            (8192, 1930 / 1887, 1501 / 1385),
            (32768, 1880 / 2014, 1555 / 1549),
        ),
    }
    for silicon, twin in (("GB200", "B200"), ("GB300", "B300")):
        first, last = measured[silicon][0], measured[silicon][-1]
        points = (*measured[silicon], (512, *first[1:]), (131072, *last[1:]))  # constant outside 2K .. 32K
        for device in (silicon, twin):
            for seq, fwd, bwd in points:
                for backward, ratio in ((False, fwd), (True, bwd)):
                    nc = rates.attention_fraction(device, seq, backward, causal=False)
                    c = rates.attention_fraction(device, seq, backward, causal=True)
                    assert nc / c == pytest.approx(ratio, rel=1e-9), (device, seq, backward)
    # FlashAttention-2 on a Blackwell part and cuDNN on Hopper keep their own measured non-causal curves
    b200_fa2 = 2250.0 * rates.attention_fraction("B200", 2048, False, causal=False, backend="flash")
    assert b200_fa2 == pytest.approx(rates._h100_tflops(2048, False, False), rel=1e-9)
    h100_cudnn = 989.0 * rates.attention_fraction("H100 SXM", 2048, False, causal=False)
    assert h100_cudnn == pytest.approx(rates._hopper_tflops(2048, False, False, 128, "cudnn"), rel=1e-9)


def test_mi355x_rates_reproduce_their_measurements():
    """MI355X: HipKittens' torch.matmul bf16 and hipBLASLt FP8 figures at 8192^3 (1,521.3 / 3,233.2 TFLOPS) and its
    torch SDPA baselines by sequence length (causal and not, forward and backward); FlashAttention-kind backend (no
    cuDNN on ROCm); its mesh takes the MI300X's measured RCCL fraction with the link rule."""
    from torchtitan.estimate import collectives, rates

    assert 2516.6 * rates.gemm_efficiency("MI355X", "bf16", 8192, 8192, 8192) == pytest.approx(1521.3)
    assert 5033.2 * rates.gemm_efficiency("MI355X", "fp8", 8192, 8192, 8192) == pytest.approx(3233.2)
    assert rates.gemm_efficiency("MI355X", "bf16", 8192, 1024, 4096) < rates.gemm_efficiency(
        "MI355X", "bf16", 8192, 8192, 8192
    )
    for backward, causal, at_8k in (
        (False, True, 630.4),
        (False, False, 821.8),
        (True, True, 224.01),
        (True, False, 309.30),
    ):
        assert 2516.6 * rates.attention_fraction("MI355X", 8192, backward, causal) == pytest.approx(at_8k)
    below = 2516.6 * rates.attention_fraction("MI355X", 512, False)
    assert below == pytest.approx(54.8 / 2)  # launch-bound below the measured lengths
    assert 2516.6 * rates.attention_fraction("MI355X", 8192, True) < 1034.1 / 4  # AITER's kernel, not torch's
    assert rates.attention_backend("MI355X") == "flash"
    assert collectives.intra_fraction("MI355X", 0.8) == collectives.intra_fraction("MI300X", 0.8)


def test_hopper_attention_by_backend_and_head_dim():
    """On Hopper the SDPA kernel's rates are the measured curves of its backend and head dim at the measured lengths
    (FA2 at head dims 64 and 128 and cuDNN at 64: the FlashAttention-3 paper's H100 bars; cuDNN at 128: cuDNN 9.19
    on an H200, causal backward measured too), log2 between the head dims; torch's own choice (auto) is cuDNN on
    sm90 / sm100 parts and FlashAttention-2 elsewhere; FlashAttention-2 on Blackwell runs at the H100's rates of the
    same head dim."""
    from torchtitan.estimate import rates

    def tflops(device, seq, backward, causal, head_dim, backend):
        return 989.0 * rates.attention_fraction(device, seq, backward, causal, head_dim, backend)

    for (backend, hd), (xs, fwd, fwd_c, bwd, bwd_c) in rates._HOPPER_CURVES.items():
        for i, seq in enumerate(xs):
            for device in ("H100 SXM", "H200"):
                assert tflops(device, seq, False, False, hd, backend) == pytest.approx(fwd[i], rel=1e-9)
                assert tflops(device, seq, False, True, hd, backend) == pytest.approx(fwd_c[i], rel=1e-9)
                assert tflops(device, seq, True, False, hd, backend) == pytest.approx(bwd[i], rel=1e-9)
                if bwd_c is not None:
                    assert tflops(device, seq, True, True, hd, backend) == pytest.approx(bwd_c[i], rel=1e-9)
    # published points: cuDNN 9.19 forward causal 644 at 8K (head dim 128), FA2 backward 287 at 8K (head dim 64);
    # FA2's causal backward by the forward's causal / non-causal ratio
    assert tflops("H100 SXM", 8192, False, True, 128, "cudnn") == pytest.approx(644.0)
    assert tflops("H100 SXM", 8192, True, False, 64, "flash") == pytest.approx(287.0)
    assert tflops("H200", 8192, True, True, 128, "flash") == pytest.approx(318.0 * 333.0 / 370.0)
    # head dim 90.5 (2^6.5) is halfway in log2; 256 takes the 128 curve
    mid = tflops("H200", 8192, False, False, 2**6.5, "cudnn")
    assert mid == pytest.approx((412.0 + 691.0) / 2)
    assert tflops("H200", 8192, False, False, 256, "cudnn") == pytest.approx(691.0)
    for device in ("H100 SXM", "H100 PCIe", "H100 NVL", "H200", "H200 NVL", "B200", "GB200", "B300", "GB300"):
        assert rates.attention_backend(device) == "cudnn"
    for device in ("A100", "A100 40GB", "L40S", "MI300X"):
        assert rates.attention_backend(device) == "flash"
    assert rates.attention_backend("H100 SXM", "flash") == "flash"
    # A100: the H100's FA2 curves at the run's head dim, scaled to FA2's own A100 forward + backward at that head dim
    # (its benchmark figure's panels (c) and (d): 165 and 182 TFLOPS causal at 8K); MI300X keeps head dim 128
    for hd, published in ((64, 165.0), (128, 182.0)):
        fwd_bwd = rates.fwd_bwd_tflops(
            lambda x, b, hd=hd: 312.0 * rates.attention_fraction("A100", x, b, True, hd), 8192
        )
        assert fwd_bwd == pytest.approx(published)
    assert rates.attention_fraction("MI300X", 8192, False, True, 64) == rates.attention_fraction(
        "MI300X", 8192, False
    )
    # Blackwell with FlashAttention-2: the H100's FA2 curve (the same mma.sync kernels) at the run's head dim
    for device in ("B200", "GB200"):
        peak = rates.GEMM_SOURCES[device].table_peak
        for hd in (64, 128):
            on_blackwell = peak * rates.attention_fraction(device, 8192, True, False, hd, "flash")
            assert on_blackwell == pytest.approx(tflops("H100 SXM", 8192, True, False, hd, "flash"))
    assert peak * rates.attention_fraction("GB200", 8192, True, False, 64, "flash") == pytest.approx(287.0)


def test_attention_backend_of_a_source_reaches_its_rows():
    """The reference file's per-source estimate args (the SDPA kernel of the source's software) reach every row of
    the source; this project's H200 rows run torch's own choice (cuDNN), and pricing one with FlashAttention-2
    instead slows only its attention."""
    from torchtitan.estimate.validation import training_cfg

    titan = next(r for r in REF["training"] if r["source"] == "titan_h100")
    assert training_cfg(REF, titan).estimate.attention_backend == "flash"
    ours = next(r for r in REF["training"] if r["id"] == "h200_1b_single_compile")
    assert training_cfg(REF, ours).estimate.attention_backend == "auto"
    flash = dict(ours, estimate_args=[*ours["estimate_args"], "--estimate.attention_backend=flash"])
    a, b = training_estimate(REF, ours), training_estimate(REF, flash)
    da, db = a["compute_detail_s"], b["compute_detail_s"]
    assert db["attention"] > da["attention"] * 1.3
    assert db["matmul"] == da["matmul"]
    assert a["memory_gib"] == b["memory_gib"]


def test_sac_without_attention_recomputes_it():
    """--estimate.sac_saves_attention=false (torchtitan's save list before its PR #2095, cuDNN attention): selective
    op AC keeps no attention output or logsumexp (memory down by exactly that) and re-runs the attention forward in
    backward (step time up)."""
    row = next(r for r in REF["training"] if r["id"] == "b200_8b_fsdp8_b1_bf16_torchao")
    saved = dict(
        row, estimate_args=[a for a in row.get("estimate_args", []) if "sac_saves_attention" not in a]
    )
    unsaved = dict(saved, estimate_args=[*saved["estimate_args"], "--estimate.sac_saves_attention=false"])
    a, b = training_estimate(REF, saved), training_estimate(REF, unsaved)
    tokens, layers, h, heads = 8192, 32, 4096, 32
    # bf16 output + fp32 logsumexp per query row, kept by every block but the one whose backward recomputes it
    kept = tokens * (layers - 1) * (2 * h + 4 * heads) / 2**30
    assert a["memory_breakdown_gib"]["activations"] - b["memory_breakdown_gib"][
        "activations"
    ] == pytest.approx(kept, rel=1e-3)
    assert b["step_time_breakdown_s"]["recompute"] > a["step_time_breakdown_s"]["recompute"]
    assert b["step_time_breakdown_s"]["compute"] == pytest.approx(
        a["step_time_breakdown_s"]["compute"], rel=1e-9
    )


def test_rowwise_table_reproduces_torchaos_measurements():
    """rates.ROWWISE_SPEEDUP is torchao's published H100 table (pytorch/ao fdddb2cfa, docs/static/fp8-rowwise-perf.png):
    grid points return the published cells, between them log2-linear interpolation, outside the edge cells."""
    from torchtitan.estimate import rates

    assert len(rates.ROWWISE_SPEEDUP) == 6 and all(
        len(m) == 6 and all(len(k) == 6 for k in m) for m in rates.ROWWISE_SPEEDUP
    )
    s = rates.rowwise_linear_speedup
    assert s(1024, 1024, 1024) == pytest.approx(0.42)
    assert s(8192, 4096, 1024) == pytest.approx(0.52)
    assert s(8192, 4096, 4096) == pytest.approx(1.00)
    assert s(32768, 16384, 32768) == pytest.approx(1.73)
    assert s(8192, 4096, 2**10.5) == pytest.approx((0.52 + 0.76) / 2)
    assert s(98304, 4096, 128) == pytest.approx(s(32768, 4096, 1024)) == pytest.approx(0.59)


def test_rowwise_float8_priced_by_torchaos_table_on_hopper():
    """On Hopper with compiled blocks a rowwise float8 linear costs its bf16 time over the table's speedup at its
    per-rank forward shape; MI300X and eager blocks keep the GEMM-and-casts model (the table measured neither)."""
    from torchtitan.estimate import rates, steptime
    from torchtitan.estimate.plan import build_plan

    row = next(r for r in REF["training"] if r["id"] == "h100_8b_fsdp8_b1_rowwise_torchao")
    plan = build_plan(validation.training_cfg(REF, row))
    r = steptime.Rates(plan)
    assert steptime.rowwise_measured(plan, r)
    tokens, expected = plan.tokens_per_pass, 0.0
    for lin in plan.block_linears:
        assert lin.float8
        bf16 = dataclasses.replace(lin, float8=False)
        f, bw = steptime._linear_time(r, bf16, tokens, plan.tp, plan.act_bytes)
        k, n = steptime._local(lin, plan.tp)
        expected += (f + bw) / rates.rowwise_linear_speedup(tokens, k, n)
    p = steptime.block_pass(plan, r, "none", tokens)
    assert p.matmul + p.float8_casts == pytest.approx(expected)
    mi300x = dict(row, part="", estimate_args=["--estimate.hardware=mi300x"])
    eager = dict(row, args=[a for a in row["args"] if not a.startswith("--compile.")])
    for other in (mi300x, eager):
        plan = build_plan(validation.training_cfg(REF, other))
        assert not steptime.rowwise_measured(plan, steptime.Rates(plan))


def test_mi300x_ring_bandwidth_follows_its_links():
    """MI300X's node is a switchless mesh: a ring over 8 GPUs runs at the measured 312.9 GB/s (stas00/ml-engineering,
    all-reduce busbw, 4 GiB), over n GPUs at (n - 1) / 7 of it; the measured 2-GPU figure (47.7 GB/s), which sets
    nothing, is reproduced within 10 %. Behind NVSwitch a 2-GPU group keeps the node's bandwidth."""
    from torchtitan.estimate import collectives, steptime
    from torchtitan.estimate.plan import build_plan

    row = next(r for r in REF["training"] if r["id"] == "mi300x_8b_fsdp8_b1_bf16_torchao")
    plan = build_plan(validation.training_cfg(REF, row))
    r = steptime.Rates(plan)
    assert r.intra == pytest.approx(312.912e9)
    assert collectives.busbw(plan, r.intra, r.inter, 8, 1) == pytest.approx(312.912e9)
    two = collectives.busbw(plan, r.intra, r.inter, 2, 1)
    assert two == pytest.approx(312.912e9 / 7)
    assert abs(two / 47.671e9 - 1) < 0.10
    h100 = next(r for r in REF["training"] if r["id"] == "h100_8b_fsdp8_compile")
    plan = build_plan(validation.training_cfg(REF, h100))
    r = steptime.Rates(plan)
    assert collectives.busbw(plan, r.intra, r.inter, 2, 1) == r.intra


def _validation_script():
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    import estimate_validation

    return estimate_validation


def test_docs_tables_are_the_scripts():
    """docs/estimate.md's six validation tables (in-sample, cross-validated with their summary lines, by quantity, by
    source, the error bars by device family and layout kind that each estimate reports for its own case, and how often
    those error bars held a source left out) are what scripts/estimate_validation.py makes of the reference rows
    now: `--write-docs` regenerates them when the estimates move, and rewriting them from the current rows leaves the
    page unchanged."""
    import re

    ev = _validation_script()
    docs = (ROOT / "docs" / "estimate.md").read_text()
    ins = table(REF)
    for title, rows in ((ev.IN_SAMPLE, ins), (ev.CROSS_VALIDATED, CV)):
        section = re.search(rf"#### {re.escape(title)}\n\n((?:\|.*\n)+)\n(.*)\n", docs)
        assert section, f"docs/estimate.md lacks the table '{title}'"
        assert section.group(1).splitlines() == ev.rows_table(rows), title
        assert section.group(2) == ev.summary(rows), title
    generated = {
        ev.BY_KIND: ev.by_kind_table(CV),
        ev.BY_QUANTITY: ev.by_quantity_table(CV, ins),
        ev.BY_SOURCE: ev.by_source_table(CV, ins),
        ev.HELD_OUT: ev.held_out_table(CV),
    }
    for title, lines in generated.items():
        section = re.search(rf"#### {title}\n\n((?:\|.*\n)+)", docs)
        assert section, f"docs/estimate.md lacks the table '{title}'"
        assert section.group(1).splitlines() == lines, title
    assert any("| tokens/s/device | Hopper | data parallel |" in x for x in ev.by_kind_table(CV))
    rewritten = ev.replace_table(docs, ev.IN_SAMPLE, ev.rows_table(ins), ev.summary(ins))
    rewritten = ev.replace_table(rewritten, ev.CROSS_VALIDATED, ev.rows_table(CV), ev.summary(CV))
    for title, lines in generated.items():
        rewritten = ev.replace_table(rewritten, title, lines)
    assert rewritten == docs


def test_by_source_and_by_quantity_tables_count_every_figure():
    """The by-source table has one line per source of the reference file, and its figures and the by-quantity
    table's add up to every cross-validated figure; each line's counts are those of its rows."""
    ev = _validation_script()
    ins = table(REF)
    lines = ev.by_source_table(CV, ins)[2:]
    assert [x.split(" | ")[0].lstrip("| ") for x in lines] == list(REF["sources"])
    figures = [int(x.split(" | ")[2].split(" of ")[1]) for x in lines]
    assert sum(figures) == len(CV)
    quantity = {x.split(" | ")[0].lstrip("| "): x.split(" | ")[2] for x in ev.by_quantity_table(CV, ins)[2:]}
    assert sum(int(v.split(" of ")[1]) for k, v in quantity.items() if k != "every figure") == len(CV)
    within = sum(abs(x["error"]) <= x["goal"] for x in CV)
    assert quantity["every figure"] == f"{within} of {len(CV)}"
    titan = next(x for x in lines if x.startswith("| titan_h100 |"))
    rows = [x for x in CV if x["source"] == "titan_h100"]
    assert f"| {sum(abs(x['error']) <= x['goal'] for x in rows)} of {len(rows)} |" in titan


def test_readme_and_docs_headline_figures_are_the_rows():
    """The figures the README and docs/estimate.md quote for the whole validation (figures within goal, the
    cross-validated and in-sample medians, the tokens/s and TFLOPS median, the count outside, the number of
    sources, how often the printed ranges held a source left out) are those of the reference rows now, so that a pass that moves them cannot leave them stale."""
    readme = (ROOT / "README.md").read_text()
    docs = (ROOT / "docs" / "estimate.md").read_text()
    ins = table(REF)
    within = sum(abs(x["error"]) <= x["goal"] for x in CV)
    speed = [x for x in CV if x["what"] in ("tokens/s/device", "TFLOPS/device")]
    flat = " ".join(readme.split())  # the README wraps its lines anywhere
    assert f"on {len(CV)} published and measured figures" in flat
    assert f"{within} within their goal" in flat
    assert f"median error {median_abs_error(CV) * 100:.2f} %" in flat
    assert f"{median_abs_error(ins) * 100:.2f} % in-sample" in flat
    assert f"tokens/s and TFLOPS figures alone: {median_abs_error(speed) * 100:.2f} %" in flat
    assert f"the {len(CV) - within} outside are" in flat
    flat_docs = " ".join(docs.split())
    assert f"{len(CV) - within} figures are outside their own goal" in flat_docs
    assert f"{len(REF['sources'])} sources:" in flat_docs
    held = {what: round(100 * c["inside"] / c["figures"]) for what, c in held_out_coverage(CV).items()}
    assert f"the tokens/s range held {held['tokens/s/device']} % of the published runs, memory's" in flat
    assert f"memory's {held['memory GiB']} %" in flat
