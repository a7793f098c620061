"""Per-operator time on one device: a roofline with calibrated rates, plus a per-call overhead.

For each (module, phase, operator) row of a :class:`~dnnperf.perfmodel.graph.StepGraph`, per call: ``t =
combine(flops / rate, bytes / bandwidth) + overhead``. The compute rate of matrix products, convolutions,
attention and RNN kernels is the machine's peak, or on a calibrated machine the measured curve at the
call's FLOPs; every other family computes at the float32 peak (it is memory-bound in practice). The
bandwidth is the machine's, or the calibrated triad curve at the call's bytes (working sets in cache run
faster), except for the optimizer's update: it streams every parameter, gradient and state tensor once a
step, none of them touched since backward, so its rows take the bandwidth at the whole update's bytes
(from memory, not cache), and only the calibrated share of its counted bytes
(``Machine.update_byte_share``: a parameter's kernels run back to back and find its tensors in cache); and
except for kernels that compute per element (``PER_ELEMENT_OPS``: random numbers, GELU, softmax,
transcendental functions; and with ``ComputeOptions.norms_per_element`` normalization and pooling), whose
time grows with their bytes at one rate whatever fits in cache: they take the bandwidth from memory, and
their own efficiency, calibrated on the zoo, is their rate. The roofline time is divided by the machine's
efficiency for the operator (``"family/phase/op"`` first, then ``"family/phase"``, then ``"family"``; 1.0
when absent). ``combine`` is ``sum`` (a CPU core overlaps little of its memory traffic with arithmetic:
the ablation in docs/validation.md#single-process-on-the-cpu-step-time) or ``max`` (the roofline);
overhead is the machine's dispatch cost per call (its phase's, ``Machine.phase_call_s``, where calibrated)
plus its family's fixed cost per call (``Machine.call_s``: a convolution's reorders and set-up), views and
metadata operators excluded (they cost no kernel). On a machine that is this host's device
(``Machine.replay_device``), a row whose every call is a convolution the description kept
(perfmodel/kernels.py), or on a CPU the fused attention kernel (``replay_attention``, on by default), takes
its replayed seconds instead of the roofline and the family's fixed cost (the replay includes both); the
dispatch cost stays (the eager step's module and autograd calls around the
kernel). A matrix product of the forward or backward costs, on top, its operands' trip from memory
(``Machine.cold_product_call_s`` a call, ``cold_product_byte_s`` a counted byte: the curves time
products in cache). On a host that counts them, each page fault the step takes
(``StepGraph.page_faults``) costs the machine's ``page_fault_s`` on top (``faults_s``). The ablation of
these choices is in docs/validation.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dnnperf.perfmodel.graph import StepGraph
from dnnperf.perfmodel.kernels import (
    DATA_MOVEMENT_FAMILIES,
    MATRIX_OPS,
    floating_dtypes,
    replayed_between,
    replayed_rows,
)
from dnnperf.perfmodel.machine import ZOO_DTYPE, Machine
from dnnperf.perfmodel.subnormals import priced_slowdown

#: Families run by a compute library (GEMM/convolution kernels) and their calibrated curve.
COMPUTE_FAMILIES = {"matmul": "matmul", "convolution": "convolution", "attention": "matmul", "rnn": "matmul"}
#: Families that launch no kernel (views, metadata, allocation without initialisation).
NO_KERNEL = ("free",)
#: Kernels whose time per element is the same whatever fits in cache (they compute, or draw random
#: numbers, per element: 6.7-7.2 ns for bernoulli_, 1.97-2.01 for tanh-GELU, 0.37-0.48 for erf-GELU,
#: 0.69-0.73 for softmax from 256 KiB to 8 MiB here, where an add took 0.17-0.39 ns): their bytes
#: take one bandwidth, the machine's from memory, and their own efficiency (the zoo calibrates each)
#: makes it their rate. Through the cache's curve, a call smaller than the zoo's came out up to 4x
#: fast (GPT-2 `small` batch 4's GELUs: 0.93 ms predicted, 4.9 measured).
PER_ELEMENT_FAMILIES = ("random",)
PER_ELEMENT_OPS = frozenset(
    {
        "aten.gelu",
        "aten.gelu[tanh]",
        "aten.gelu_backward",
        "aten.gelu_backward[tanh]",
        "aten._softmax",
        "aten._safe_softmax",
        "aten._log_softmax",
        # Transcendental functions, each computed per element (a tanh took 2.5 ns an element here,
        # an add 0.2-0.4): the calibration's zoo runs each (calibrate._Pointwise).
        "aten.tanh",
        "aten.tanh_backward",
        "aten.sigmoid",
        "aten.sigmoid_backward",
        "aten.silu",
        "aten.exp",
        "aten.log",
        "aten.sin",
        "aten.cos",
        "aten.sqrt",
        "aten.rsqrt",
        "aten.erf",
    }
)


#: A call of the memory family larger than this (bytes read and written) is a large copy
#: (ComputeOptions.large_copies_from_memory): beyond the 2 MiB L2 of the Xeons the model was built on,
#: and beyond every copy of the layer zoo's own (calibrate._zoo: 1.2 MB at most).
LARGE_COPY_BYTES = 2 * 2**20


def large_copies(families: np.ndarray, bytes_per_call: np.ndarray) -> np.ndarray:
    """Which rows are large copies (``LARGE_COPY_BYTES``)."""
    return (families == "memory") & (bytes_per_call > LARGE_COPY_BYTES)


#: Families whose kernels work out statistics or a window per element (batch, group, layer and
#: instance norms; max and average pools): on one thread of the Xeon of validation-heldout-third-host.md
#: they took about the same time per element from 256 KiB to 9 MiB (batch norm's forward 1.25-1.63 ns,
#: a 3x3 average pool 8.0-8.2, layer norm 1.1-1.5) while an add went from 0.10 to 0.29 ns as it left
#: the 2 MiB L2. Priced through the cache's curve, a call smaller than the zoo's took the L2's
#: bandwidth: hf:resnet `tiny` batch 4's batch norms forward at 0.66 ns an element against 1.7-2.0 in
#: its step. Per element where ``ComputeOptions.norms_per_element`` (or ``norms_out_of_cache``).
PER_ELEMENT_NORMS = ("normalization", "pooling")


def per_element(ops: pd.DataFrame, norms: bool = False) -> np.ndarray:
    """Which rows are PER_ELEMENT kernels (with ``norms``, every row of PER_ELEMENT_NORMS too)."""
    families = PER_ELEMENT_FAMILIES + PER_ELEMENT_NORMS if norms else PER_ELEMENT_FAMILIES
    return ops["family"].isin(families).to_numpy() | ops["op"].isin(PER_ELEMENT_OPS).to_numpy()


@dataclass(frozen=True)
class ComputeOptions:
    """Model variants, for the ablation: roofline max or sum of the two terms, overhead, page faults,
    the update's bandwidth from memory, the cost of zero operands and replayed kernels on or off."""

    combine: str = "sum"
    overhead: bool = True
    faults: bool = True
    update_from_memory: bool = True
    zero_operands: bool = True
    replay_kernels: bool = True
    #: An interpolated description's rows from its two sources' replays, interpolated to its batch
    #: (kernels.replayed_between); on the CPU, where it was validated (validation-heldout.md).
    replays_between: bool = True
    #: On a CPU, a matrix product's replay where slower than its roofline, for products smaller than
    #: the calibrated matmul curve's first size (kernels.MATRIX_OPS). Off: on the held-out sets it
    #: raised as many rows past their step as it brought up to it (validation-heldout.md).
    replay_matrix_products: bool = False
    #: On a CPU, the fused attention kernel's calls replayed (kernels.ATTENTION_OPS) rather than
    #: priced by their products' FLOPs: judged by the seventeenth held-out set, whose rows that run the
    #: kernel came to a median |error| of 3.9% with the replays against 6.3% without, none of them
    #: worse by more than 5 points (validation-heldout.md).
    replay_attention: bool = True
    per_element: bool = True
    #: With ``per_element``, normalization and pooling priced per element too (PER_ELEMENT_NORMS),
    #: their efficiencies fitted on the zoo that way (calibrate.zoo_fit). Off: judged by the
    #: twenty-first held-out set, it brought the rows it changes from a median |error| of 14.0% to
    #: 6.2%, but a network of group norms larger than the zoo's grew by 5.6 points at batch 8 (-9.1%
    #: to -14.8%), past the rule's 5 (validation-heldout-third-host.md, "normalization and pooling per
    #: element").
    norms_per_element: bool = False
    #: Normalization and pooling priced per element at the rate the zoo measured them at beyond the L2
    #: (calibrate.zoo_fit: its layers again with 8 MiB in) rather than at the zoo's own sizes: in a
    #: step their calls ran slower than the zoo's hot loop (hf:resnet's batch norms at 1.7-2.0 ns an
    #: element, the zoo's 1.4-1.6). Off: judged by the twenty-second held-out set, it brought the rows
    #: it changes from a median |error| of 17.6% to 13.5%, but a network of 3-D max pools (an operator
    #: the zoo never ran, priced at the 2-D pools' rate) grew by 27.9 points at batch 8
    #: (validation-heldout-third-host.md, "normalization and pooling out of cache").
    norms_out_of_cache: bool = False
    #: With ``norms_per_element`` or ``norms_out_of_cache``, only the operators the zoo timed priced
    #: per element (their own efficiency, ``"family/phase/op"``); the others (a 3-D max pool) stay on
    #: the cache's curve at their family's efficiency. Off: judged by the twenty-third held-out set
    #: (with ``norms_out_of_cache``), it took the rows it changes from a median |error| of 6.5% to
    #: 9.9%, four of them past 5 points: a pool's cost per element follows its window, not its bytes (a
    #: 1-D average pool of 4, run by the 2-D kernel, at the 3x3 pool's rate per element: +1.7% to
    #: +34.7%) (validation-heldout-third-host.md, "the zoo's normalization and pooling out of cache").
    norms_zoo_only: bool = False
    #: On this host's GPU, each phase's host seconds as the description measured them (issue.py)
    #: rather than the calibrated per-call costs alone.
    measured_issue: bool = True
    #: Each phase's calls at that phase's host cost (Machine.phase_call_s); False: every call at
    #: ``dispatch_s``.
    phase_calls: bool = True
    #: The update's counted bytes scaled by Machine.update_byte_share; False: as counted.
    update_share: bool = True
    #: A convolution between FEW_ROWS_AT and MANY_ROWS_AT rows a call priced between its few-rows
    #: class and its kind (few_rows_weight); False: the class below FEW_ROWS rows, the kind above.
    few_rows_between: bool = True
    #: A matrix product of the forward or backward with its operands out of cache: the machine's
    #: cold_product_call_s a call and cold_product_byte_s a counted byte on top of its price. False:
    #: every product at its price in cache (validation-heldout.md, variant "products in cache").
    cold_products: bool = True
    #: A matrix product of few rows (its smallest dimension, ``rows``) at the machine's
    #: product_rows_efficiency of those rows (product_rows_factor) rather than its FLOPs' rate. Off:
    #: judged by the eighteenth and nineteenth held-out sets, it brought the rows it changes from a
    #: median |error| of 8.8% to 4.5% and of 13.3% to 4.1%, but grew one row's by more than the 5
    #: points their rule allowed on the first and four on the second (recurrent cells stepped by hand,
    #: already over without it): validation-heldout-second-host.md, variant "products of few rows at
    #: their rate". An interpolated description's rows follow the batch in a line (StepGraph.at_batch):
    #: past a product's width, where its smallest dimension stops growing, they overshoot it, so far
    #: beyond its two descriptions' batches the price of a product of few rows falls short.
    few_rows_products: bool = False
    #: Each phase's operators (kernel and host time) multiplied by the description's slowdown from
    #: subnormal floats (StepGraph.subnormal_slowdown: the step timed as it runs and with them flushed
    #: to zero), where the phase's own outputs are notably subnormal (subnormals.priced_slowdown;
    #: perfmodel/subnormals.py). Off: the slowdown can be a moment of training. A GPT whose head is
    #: tied to an N(0, 1) embedding ran its backward 1.2x as long as flushed in its first steps, up to
    #: 10x around its fifth and 1.5x by its twelfth; its descriptions timed it at 8x, and priced, the
    #: twenty-eighth held-out set's rows of it came to +280% and +338% (-20% and -11% unpriced). The
    #: twenty-seventh set, networks whose subnormals last, had passed it (its 12 changed (row, phase)
    #: pairs from a median |error| of 42.3% to 9.7%, none worse by 5 points) after the twenty-fourth
    #: to twenty-sixth failed it (validation-heldout-third-host.md, "Subnormal floats").
    subnormals: bool = False
    #: A forward kernel call issued inside a compiled function after its first (``inner_calls``: a
    #: ``GRUCell``'s, an ``nn.GRU``'s dozen a time step) at the machine's inner_call_s rather than the
    #: forward's per-call cost, which carries a module's Python with each call. Judged by the twentieth
    #: held-out set (recurrent networks in torch.nn), whose rows it changes came to a median |error|
    #: of 9.9% with it against 18.9% without, none of them worse by more than 5 points
    #: (validation-heldout-third-host.md, variant "every forward call at its phase's cost").
    composite_calls: bool = True
    #: The elementwise family's rows (an add, a multiply, a power) at the machine's bandwidth from
    #: memory rather than the cache's curve at their working set, their efficiencies fitted on the
    #: zoo that way (calibrate.zoo_fit): in a step their operands were written layers before and come
    #: from beyond the L2. hf:vaultgemma `small` at 2 (the thirtieth held-out set) ran its forward's
    #: multiplies at 16 GB/s (torch's profiler), priced at 38 GB/s through the cache's curve; from
    #: memory, 15.6. Off: judged by the thirty-first held-out set, it took the rows it changes (all 16)
    #: from a median |error| of 9.2% to 6.5%, but grew four by more than 5 points, a hypernetwork's and
    #: a WaveNet's, already over (validation-heldout-third-host-pricings.md, "Elementwise from memory").
    elementwise_from_memory: bool = False
    #: The memory family's efficiencies (copies, pads, concatenations) fitted on the zoo's copies too
    #: (calibrate._sized_zoo: a pad, a concatenation, a GLU's split, block transposes, 1-4 MiB in),
    #: not only on the few a recurrent layer runs: from those, 0.08 of the cache's curve forward and
    #: 0.14 backward, a WaveNet's pads at batch 8 came to 12.5 ms where its step ran them in about 4.
    #: Off: judged by the thirty-second held-out set, it changed 3 rows, all under already, their
    #: median |error| from 15.5% to 18.2%; with host gaps, by the thirty-third, the set from 5.2%,
    #: 38.5%, -1.8% to 7.4%, 26.9%, +6.2% (validation-heldout-third-host-pricings-2.md, "Copies").
    copies_calibrated: bool = False
    #: On this host's CPU, each phase's host seconds between its operator calls beyond the calibration
    #: network's (host_gap_seconds): the model's own Python, where its description timed them
    #: (describe_model's ``time_gaps``). Charged at their part that does not grow with the batch
    #: (``fixed_gaps``); the whole gaps, a variant ("host gaps"), failed the thirtieth held-out set on
    #: its max (14.2%, 31.6%, -11.0% to 5.2%, 38.1%, +0.3%: a Set Transformer already over), as the
    #: twenty-eighth had, and the twelfth on the second host, its language models over
    #: (validation-heldout-third-host.md, "The model's own Python").
    host_gaps: bool = True
    #: On a CPU, each distinct call of data movement and of the operators with no formula in the
    #: forward and backward replayed (kernels.DATA_MOVEMENT_FAMILIES), its replay's time for its row
    #: rather than its bytes at the memory family's efficiency. Off: judged by the thirty-fourth
    #: held-out set, it took the set from 10.1%, 32.8%, +4.0% to 12.9%, 34.0%, +2.8%: its replays
    #: priced a cumulative sum's backward flips and a spectrum's zeros nearer the step, and so uncovered
    #: what their bytes' over-price had covered, the sums themselves and uncounted copies
    #: (validation-heldout-third-host-pricings.md, "Data movement replayed").
    replay_data_movement: bool = False
    #: On a CPU, each distinct call in the forward and backward of an operator the machine's layer zoo
    #: never timed (Machine.zoo_ops) replayed, its replay's time for its row rather than its family's
    #: price: a cumulative sum, an FFT, a flip, an unfold's col2im. Not the calls that take indices
    #: or masks (kernels.reads_values), whose random operands would not do the step's work. Off: the
    #: thirty-fifth held-out set passed it with the twenty-eighth's rule (19.3%, 80.1%, -5.3% to 11.2%,
    #: 78.5%, -2.6%); the thirty-sixth, fixed to confirm it, failed it on its max alone (27.9%, 38.9%,
    #: -27.3% to 23.3%, 43.5%, -21.1%: a Perceiver over already, +38.9% to +43.5%)
    #: (validation-heldout-third-host-pricings-2.md, "Untimed operators again").
    replay_untimed: bool = False
    #: With ``replay_untimed``, the zoo's operators in a dtype other than the one it timed them in
    #: (machine.ZOO_DTYPE) count as untimed too: a complex exponential, a complex or double-precision
    #: product, which run other kernels (a state-space LM's complex ``exp`` at batch 4 was priced at
    #: 2.27 ms as float32's and ran in 70.3 ms in its step). Off with ``replay_untimed``: the
    #: thirty-sixth set passed it on top of those replays by the twentieth's rule (its two changed rows,
    #: a float64 MLP's, from 30.2% to 27.7%), but the replays it extends failed there.
    replay_other_dtypes: bool = False
    #: On a CPU, the layer zoo's timings net of the minor page faults their calls took, at the host's
    #: cost a fault (calibrate.page_fault_cost), before its efficiencies are fitted: a step's faults
    #: are charged apart (StepGraph.page_faults), and the zoo's depend on the allocator's history (an
    #: LSTM layer's step took 1,484 faults each time, a GRU's 300 and then none). Off: judged by the
    #: thirty-sixth held-out set, it moved none of its rows by 2% (another calibration's zoo took
    #: faults only in its matrix products and a batch norm's backward).
    zoo_faults_apart: bool = False
    #: The memory family's rows (copies, pads, concatenations, stacks) at the machine's bandwidth from
    #: memory rather than the cache's curve at their working set, their efficiencies fitted on the zoo
    #: that way (calibrate.zoo_fit): a copy writes memory just allocated, not in cache, and reads
    #: operands written layers before. Through the cache's curve the zoo's small copies (12 KB to 1.2
    #: MB, a recurrent layer's) came out at 0.01-0.17 of it, and that efficiency over-priced a
    #: Perceiver's 29.7 MB of clones at batch 8 (42 ms against about 3.3 in its step). Off: tried on
    #: the thirtieth to thirty-sixth held-out sets' stored steps, it priced a Fourier operator's zeros
    #: at their own efficiency from memory, +24% to +90%, and was dropped before the thirty-seventh
    #: set was fixed (validation-heldout-third-host-pricings-2.md, "Large copies from memory").
    copies_from_memory: bool = False
    #: Only the memory family's calls larger than ``LARGE_COPY_BYTES`` at the bandwidth from memory,
    #: at their own efficiency (``memory/PHASE/large``), fitted on the zoo's copies of that size
    #: (calibrate._sized_zoo: a pad, a concatenation, a GLU's split, block transposes, 4-17 MB a call);
    #: smaller calls keep the cache's curve at the efficiency of the zoo's small copies, whose
    #: sizes (12 KB to 1.2 MB) they share. Off: judged by the thirty-seventh held-out set with the
    #: twenty-eighth's rule, it took the set from 7.2%, 22.5%, -7.2% to 8.0%, 22.5%, -8.0%.
    large_copies_from_memory: bool = False
    #: With ``host_gaps``, an interpolated description's gaps at batch 0 (StepGraph.fixed_gaps) rather
    #: than at its batch: the part that does not grow with the batch (variant "host gaps, fixed part";
    #: a description of one batch has none). On: the fortieth held-out set passed it with the
    #: twenty-eighth's rule (19.4%, 34.6%, -19.4% without any gaps to 11.6%, 25.3%, -11.6%), the
    #: forty-first confirmed it (12.0%, 24.1%, -12.0% without to 5.8%, 16.7%, -5.8%).
    fixed_gaps: bool = True

    def __post_init__(self) -> None:
        if self.combine not in ("max", "sum"):
            raise ValueError(f"combine must be 'max' or 'sum', got {self.combine!r}")


def other_replays(
    machine: Machine, options: ComputeOptions
) -> Callable[[Mapping[str, Any], str], bool] | None:
    """Which calls a description keeps (kernels.KernelCalls) are replayed beyond convolutions and small
    products, by call and family: data movement (``replay_data_movement``), the operators the
    machine's layer zoo never timed (``replay_untimed``), and with ``replay_other_dtypes`` any of
    them, products included, in a dtype the zoo did not time; None: none."""
    timed = {op.split("[")[0] for op in machine.zoo_ops}
    movement, untimed = options.replay_data_movement, options.replay_untimed and bool(timed)
    dtypes = untimed and options.replay_other_dtypes
    if not movement and not untimed:
        return None

    def replayed(call: Mapping[str, Any], family: str) -> bool:
        other_dtype = dtypes and bool(floating_dtypes(call) - {ZOO_DTYPE})
        if call["op"] in MATRIX_OPS:  # products are the zoo's curves' in its dtype
            return other_dtype
        moved = movement and family in DATA_MOVEMENT_FAMILIES
        return moved or (untimed and (call["op"] not in timed or other_dtype))

    return replayed


def op_times(graph: StepGraph, machine: Machine, options: ComputeOptions = ComputeOptions()) -> pd.DataFrame:
    """The graph's rows with seconds: ``compute_s`` (the roofline part, or a replay's time where
    ``replayed``), ``overhead_s`` and ``seconds``."""
    ops = graph.ops
    calls = np.maximum(ops["calls"].to_numpy(float), 1.0)
    flops = ops["flops"].to_numpy(float)
    nbytes = ops["bytes"].to_numpy(float)
    families = ops["family"].to_numpy(str)
    dtypes = ops["dtype"].to_numpy(str)
    per_call_flops = flops / calls
    rate = np.array([machine.peak(d) for d in dtypes])
    phases = ops["phase"].to_numpy(str)
    curves = machine.compute_curves
    for family, curve_name in COMPUTE_FAMILIES.items():
        for phase in np.unique(phases[families == family]):
            mask = (families == family) & (phases == phase)
            # The phase's own curve (calibrate.zoo_curves), else the operator's, else matmul's.
            curve = curves.get(f"{curve_name}/{phase}") or curves.get(curve_name) or curves.get("matmul")
            if curve is not None:
                # The float32 curve, scaled to the dtype's peak where the dtype differs.
                scale = rate[mask] / machine.peak("float32")
                rate[mask] = curve(per_call_flops[mask]) * scale
    if machine.product_rows_efficiency and options.few_rows_products and "rows" in ops:
        # A product of few rows computes at a fraction of its FLOPs' rate (Machine's doc).
        product = ops["op"].isin(PRODUCT_ROWS_OPS).to_numpy()
        few = product_rows_factor(ops["rows"].to_numpy(float) / calls, machine.product_rows_efficiency)
        rate = rate * np.where(product, few, 1.0)
    if machine.bandwidth_curve is not None:
        working_set = nbytes / calls
        update = phases == "update"
        if options.update_from_memory and update.any():
            working_set = np.where(update, nbytes[update].sum(), working_set)
        bandwidth = machine.bandwidth_curve(working_set)
        if options.per_element:
            norms = options.norms_per_element or options.norms_out_of_cache
            at_memory = per_element(ops, norms)
            if norms and options.norms_zoo_only:
                keys = ops["family"] + "/" + ops["phase"] + "/" + ops["op"]
                at_memory &= per_element(ops) | keys.isin(list(machine.efficiency)).to_numpy()
            if options.elementwise_from_memory:
                at_memory |= families == "elementwise"
            if options.copies_from_memory:
                at_memory |= families == "memory"
            if options.large_copies_from_memory:
                at_memory |= large_copies(families, working_set)
            bandwidth = np.where(at_memory, machine.memory_bandwidth, bandwidth)
    else:
        bandwidth = np.full(len(ops), machine.memory_bandwidth)
    compute = flops / rate
    memory = nbytes / bandwidth
    if options.update_share:
        memory = np.where(phases == "update", memory * machine.update_byte_share, memory)
    roofline = np.maximum(compute, memory) if options.combine == "max" else compute + memory
    if machine.efficiency:
        # Achieved fraction of the roofline per operator, else per convolution kind, else per family
        # and phase, else per family, from calibration microbenchmarks.
        efficiency = machine.efficiency
        kinds = ops["kind"].fillna("").to_numpy(str) if "kind" in ops else np.full(len(ops), "")
        operators = ops["op"].to_numpy(str)
        large = np.array(
            [
                efficiency.get(f"{f}/{p}/{o}")
                or (k and efficiency.get(f"{f}/{p}/{k}"))
                or efficiency.get(f"{f}/{p}", efficiency.get(f, 1.0))
                for f, p, o, k in zip(families, phases, operators, kinds, strict=True)
            ]
        )
        if options.large_copies_from_memory:
            beyond = large_copies(families, nbytes / calls)
            own = np.array([efficiency.get(f"memory/{p}/large", 0.0) for p in phases])
            large = np.where(beyond & (own > 0), own, large)
        # A convolution of few output rows a call: between its kind's few-rows class and the kind.
        small = np.array(
            [
                (
                    f == "convolution"
                    and f"{f}/{p}/{o}" not in efficiency
                    and efficiency.get(f"{f}/{p}/{k or 'dense'}-small")
                )
                or e
                for f, p, o, k, e in zip(families, phases, operators, kinds, large, strict=True)
            ]
        )
        rows = ops["rows"].to_numpy(float) / calls if "rows" in ops else np.zeros(len(ops))
        between = (
            few_rows_weight(rows) if options.few_rows_between else ((rows > 0) & (rows < FEW_ROWS)) * 1.0
        )
        weight = np.where(families == "convolution", between, 0.0)
        roofline = roofline / (small**weight * large ** (1.0 - weight))
    if machine.zero_operand_s and options.zero_operands and "zeros" in ops:
        # Kernels that take a slow path on zeros (perfmodel/zeros.py): the calibrated cost of each.
        per_zero = np.array([machine.zero_operand_s.get(o, 0.0) for o in ops["op"].to_numpy(str)])
        roofline = roofline + ops["zeros"].to_numpy(float) * per_zero
    kernel = ~np.isin(families, NO_KERNEL)
    fixed = np.array([machine.call_s.get(f"{f}/{p}", 0.0) for f, p in zip(families, phases, strict=True)])
    found = np.zeros(len(ops), dtype=bool)
    between = bool(options.replays_between and graph.kernels_between and machine.replay_device == "cpu")
    if options.replay_kernels and machine.replay_device and (graph.kernels or between):
        keys = list(zip(ops["module"], phases, ops["op"], strict=True))
        per_row = dict(zip(keys, ops["calls"], strict=True))
        device, fault_s = machine.replay_device, machine.page_fault_s
        # Matrix products smaller than the calibrated curve's first size (kernels.MATRIX_OPS).
        matmul = [c.sizes[0] for n, c in curves.items() if n.split("/")[0] == "matmul"]
        below = min(matmul) if matmul and options.replay_matrix_products else 0.0
        attention, others = options.replay_attention, other_replays(machine, options)
        if graph.kernels:
            replayed = replayed_rows(graph.kernels, per_row, device, fault_s, below, attention, others)
        else:
            replayed = replayed_between(
                graph.kernels_between, graph.batch_size, per_row, device, fault_s, below, attention, others
            )
        measured = np.array([replayed.get(key, np.nan) for key in keys])
        found = ~np.isnan(measured)
        # A matrix product's replay only raises its price.
        found &= ~(ops["op"].isin(MATRIX_OPS).to_numpy() & (measured < roofline))
        roofline = np.where(found, measured, roofline)
        fixed = np.where(found, 0.0, fixed)
    if options.cold_products and (machine.cold_product_call_s or machine.cold_product_byte_s):
        # Timed in cache, a product's price misses its operands' trip from memory (Machine's doc).
        product = ops["op"].isin(MATRIX_OPS).to_numpy() & np.isin(phases, ("forward", "backward")) & ~found
        cold = calls * machine.cold_product_call_s + nbytes * machine.cold_product_byte_s
        roofline = roofline + np.where(product, cold, 0.0)
    dispatch = np.full(len(ops), machine.dispatch_s)
    if options.phase_calls and machine.phase_call_s:
        dispatch = np.array([machine.phase_call_s.get(p, machine.dispatch_s) for p in phases])
    if options.composite_calls and machine.inner_call_s and not machine.asynchronous and "inner_calls" in ops:
        # Calls a compiled function issues after its first pay no Python of their own (Machine's doc);
        # never more than the phase's cost. An asynchronous device's host costs are its queue's.
        inner = np.minimum(ops["inner_calls"].to_numpy(float), calls) * (phases == "forward")
        dispatch = dispatch - inner / calls * np.maximum(dispatch - machine.inner_call_s, 0.0)
    overhead = calls * (dispatch + fixed) * kernel if options.overhead else np.zeros(len(ops))
    if options.subnormals and graph.subnormal_slowdown:
        priced = priced_slowdown(graph.subnormal_outputs, graph.subnormal_slowdown)
        slowdown = np.array([priced.get(p, 1.0) for p in phases])
        roofline, overhead = roofline * slowdown, overhead * slowdown
    out = ops.copy()
    out["replayed"] = found
    out["compute_s"] = roofline
    out["overhead_s"] = overhead
    out["seconds"] = roofline + overhead
    return out


@dataclass(frozen=True)
class StepTime:
    """One device's step without parallelism, by phase, and the roofline/overhead split."""

    forward_s: float
    backward_s: float
    update_s: float
    data_s: float
    compute_s: float  # roofline part of forward + backward + update
    overhead_s: float  # per-call overhead of forward + backward + update
    faults_s: float = 0.0  # page faults of the step

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s + self.update_s + self.data_s + self.faults_s


def data_seconds(graph: StepGraph, machine: Machine) -> float:
    """Taking a batch from the in-memory pool and placing it: one copy of the batch (read + write)
    through memory, or on a device with its own memory the copy from pinned host memory."""
    if machine.host_bandwidth > 0:
        return graph.batch_bytes / machine.host_bandwidth
    return 2 * graph.batch_bytes / machine.memory_bandwidth


def queued_end(
    host_s: np.ndarray, device_s: np.ndarray, calls: np.ndarray, issued: float = 0.0, free: float = 0.0
) -> np.ndarray:
    """When each row's last kernel ends on a device that runs behind its host: the host issues the
    rows' calls in order, ``host_s`` per call, and the device runs each call, ``device_s`` per call,
    once it is issued and the device is free. A row of ``c`` calls starting with the host at ``h0``
    and the device free at ``d0`` ends at ``max(d0 + c*d, h0 + max(c*h + d, h + c*d))``: the device's
    own queue, or its last call waiting for the host (host-bound) or its first call's issue then the
    calls back to back (device-bound). The host starts issuing at ``issued``; the device is free from
    ``free``."""
    ends = np.empty(len(host_s))
    device = free
    for i, (h, d, c) in enumerate(zip(host_s, device_s, calls, strict=True)):
        device = max(device + c * d, issued + max(c * h + d, h + c * d))
        issued += c * h
        ends[i] = device
    return ends


def fault_seconds(graph: StepGraph, machine: Machine, options: ComputeOptions = ComputeOptions()) -> float:
    """What the step's page faults cost on ``machine`` (0 when either side does not count them)."""
    if not options.faults or not graph.page_faults:  # not counted, or none
        return 0.0
    return graph.page_faults * machine.page_fault_s


#: The zoo's convolutions of fewer output rows a call than this (batch x output pixels: the rows of
#: the matrix product they amount to) calibrate their kind's "-small" class: oneDNN's rate falls
#: steeply at few rows (a 1x1 convolution of 1,024 channels on this AMD EPYC, one thread: 92 GFLOP/s
#: forward at 1,024 rows, 57 at 64).
FEW_ROWS = 128


#: Between these output rows a call a convolution's efficiency moves from its kind's few-rows class
#: to its kind's, log-linearly in the rows: the zoo's few-rows layers have at most 64 rows a call,
#: its kinds' own layers 512 or more (one dense 3x3 at 128), so a call between the two is priced
#: between their efficiencies rather than by which side of FEW_ROWS it falls.
FEW_ROWS_AT = 64
MANY_ROWS_AT = 512


def few_rows_weight(rows_per_call: np.ndarray) -> np.ndarray:
    """The share (in log efficiency) of a convolution's few-rows class in its efficiency: 1 up to
    FEW_ROWS_AT rows a call, 0 from MANY_ROWS_AT, log-linear between; 0 where the rows are not
    recorded (0)."""
    rows = np.asarray(rows_per_call, dtype=float)
    clipped = np.clip(rows, FEW_ROWS_AT, MANY_ROWS_AT)
    weight = np.log(MANY_ROWS_AT / clipped) / np.log(MANY_ROWS_AT / FEW_ROWS_AT)
    return np.where(rows > 0, weight, 0.0)


def few_rows_class(kind: str, rows_per_call: float) -> str:
    """The efficiency class a zoo convolution of few output rows a call calibrates ("pointwise-small",
    "dense-small" for a kind of ""); "" otherwise (it calibrates its kind's)."""
    return f"{kind or 'dense'}-small" if 0 < rows_per_call < FEW_ROWS else ""


#: The products whose rows (their smallest dimension, opcount.product_rows) set their rate.
PRODUCT_ROWS_OPS = ("aten.mm", "aten.addmm")


def product_rows_factor(rows_per_call: np.ndarray, efficiency: dict[str, float]) -> np.ndarray:
    """A matrix product's fraction of its curve's rate at ``rows_per_call`` (its smallest dimension)
    from the machine's calibrated fractions per rows (Machine.product_rows_efficiency): log-linear
    in the rows between two calibrated ones, the fewest's below them, 1 from twice the most (the
    many-rows products' own rate); 1 where the rows are not recorded (0)."""
    rows = np.asarray(rows_per_call, dtype=float)
    points = sorted((int(r), float(e)) for r, e in efficiency.items())
    if not points:
        return np.ones_like(rows)
    at = np.log([r for r, _ in points] + [2 * points[-1][0]])
    fraction = np.log([e for _, e in points] + [1.0])
    factor = np.exp(np.interp(np.log(np.maximum(rows, 1.0)), at, fraction))
    return np.where(rows > 0, factor, 1.0)


#: Phases whose gaps between calls are charged: the update's per-call cost is calibrated on
#: optimizers themselves (calibrate.update_samples), whose loops are the same in any model.
GAP_PHASES = ("forward", "backward")


def host_gap_seconds(
    graph: StepGraph, machine: Machine, options: ComputeOptions = ComputeOptions()
) -> dict[str, float]:
    """Per phase, the host seconds the description measured between its operator calls
    (``StepGraph.gaps``) beyond its calls at the calibration network's gap each
    (``Machine.gap_call_s``), never below zero: the Python of a model's modules, which the per-call
    costs, calibrated on a network of plain layers, leave out. Only on the CPU that described it
    (``Machine.replay_device``): another machine runs other Python at another speed. With
    ``options.fixed_gaps``, the gaps of the description's two sources at batch 0 (StepGraph.fixed_gaps;
    a description of one batch has none to charge)."""
    if not (options.host_gaps and options.overhead and machine.replay_device == "cpu"):
        return {}
    gaps = graph.fixed_gaps if options.fixed_gaps else graph.gaps
    return {
        phase: max(seconds - calls * machine.gap_call_s[phase], 0.0)
        for phase, (seconds, calls) in gaps.items()
        if phase in GAP_PHASES and phase in machine.gap_call_s
    }


def update_step_seconds(
    graph: StepGraph, machine: Machine, options: ComputeOptions = ComputeOptions()
) -> float:
    """The optimizer's fixed cost a step (``Machine.update_step_s``) for each optimizer step of the
    graph (``StepGraph.update_steps``); none without the host's overhead or on an asynchronous device,
    whose host costs are its queue's."""
    if not options.overhead or machine.asynchronous:
        return 0.0
    return machine.update_step_s * graph.update_steps


def step_time(
    graph: StepGraph,
    machine: Machine,
    options: ComputeOptions = ComputeOptions(),
    times: pd.DataFrame | None = None,
) -> StepTime:
    """Forward + backward + update (+ the data stage) of one step on one device; ``times``: the
    graph's op_times on ``machine`` with ``options``, where the caller has them."""
    times = op_times(graph, machine, options) if times is None else times
    if machine.asynchronous:
        return queued_step(graph, machine, times, options)
    by_phase = times.groupby("phase")["seconds"].sum()
    gaps = host_gap_seconds(graph, machine, options)
    fixed_update = update_step_seconds(graph, machine, options)
    return StepTime(
        forward_s=float(by_phase.get("forward", 0.0)) + gaps.get("forward", 0.0),
        backward_s=float(by_phase.get("backward", 0.0)) + gaps.get("backward", 0.0),
        update_s=float(by_phase.get("update", 0.0)) + fixed_update,
        data_s=data_seconds(graph, machine),
        compute_s=float(times["compute_s"].sum()),
        overhead_s=float(times["overhead_s"].sum()) + sum(gaps.values()) + fixed_update,
        faults_s=fault_seconds(graph, machine, options),
    )


def scaled_to_issue(host_s: np.ndarray, phases: np.ndarray, issue_s: dict[str, float]) -> np.ndarray:
    """Each row's host seconds ``host_s`` scaled so that each phase's add up to the seconds the
    description measured the host issue it in (``StepGraph.issue_s``; a phase not measured, or
    charged nothing, keeps its rows' seconds): the calls' costs give the order and the shares, the
    measurement the model's own code between the calls."""
    scaled = host_s.copy()
    for phase, seconds in issue_s.items():
        mask = phases == phase
        charged = float(host_s[mask].sum())
        if charged > 0:
            scaled[mask] *= seconds / charged
    return scaled


def queued_step(graph: StepGraph, machine: Machine, times: pd.DataFrame, options: ComputeOptions) -> StepTime:
    """The step of an asynchronous device (:func:`queued_end`): the batch's copy, then every row in
    the description's order. A kernel call costs the host the machine's per-call overhead
    (``dispatch_s``) and its family's extra (``host_call_s``; a view costs that alone), and the device
    the row's roofline seconds per call, its family's fixed cost and the machine's ``kernel_s`` (or a
    replay's seconds, which hold all three). The step ends when both have finished (the runner
    synchronises); a phase's seconds are how far it moved that end, the host's tail counted in the
    update."""
    calls = np.maximum(times["calls"].to_numpy(float), 1.0)
    kernel = ~times["family"].isin(NO_KERNEL).to_numpy()
    dispatch = np.where(kernel, machine.dispatch_s if options.overhead else 0.0, 0.0)
    fixed = np.maximum(times["overhead_s"].to_numpy(float) / calls - dispatch, 0.0)  # op_times' call_s
    keys = times["family"].astype(str) + "/" + times["phase"].astype(str)
    extra = keys.map(machine.host_call_s).fillna(0.0).to_numpy(float) if options.overhead else 0.0
    host = dispatch + extra
    phases = times["phase"].to_numpy(str)
    if options.overhead and options.measured_issue and machine.stream_device:
        host = scaled_to_issue(host * calls, phases, graph.issue_s) / calls
    # A replay timed the whole kernel; the roofline's rows are net of a kernel's floor (the zoo's times).
    floor = np.where(times["replayed"].to_numpy(bool), 0.0, machine.kernel_s)
    device = np.where(kernel, times["compute_s"].to_numpy(float) / calls + fixed + floor, 0.0)
    copy_issued = machine.dispatch_s if options.overhead else 0.0
    data = data_seconds(graph, machine)
    ends = queued_end(host, device, calls, issued=copy_issued, free=copy_issued + data)
    issued = copy_issued + float((host * calls).sum())
    seconds: dict[str, float] = {}
    reached = copy_issued + data
    for phase in ("forward", "backward", "update"):
        mask = phases == phase
        if mask.any():
            end = float(ends[mask].max())
            seconds[phase] = max(end - reached, 0.0)
            reached = max(reached, end)
    seconds["update"] = seconds.get("update", 0.0) + max(issued - reached, 0.0)  # the host's tail
    return StepTime(
        forward_s=seconds.get("forward", 0.0),
        backward_s=seconds.get("backward", 0.0),
        update_s=seconds["update"],
        data_s=copy_issued + data,
        compute_s=float(times["compute_s"].sum()),
        overhead_s=float((host * calls).sum()),
        faults_s=fault_seconds(graph, machine, options),
    )
