"""The per-module operator counter against hand-computed FLOPs, torch's FlopCounterMode on the whole
suite, and its bookkeeping: module attribution (in-place, shared, repeated, double backward), phases,
bytes, and hooks gone afterwards."""

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import flop_registry

from dnnperf.models.translation import MultiHeadAttention
from dnnperf.probes import opcount
from dnnperf.probes.opcount import (
    NO_MODULE,
    ROOT_MODULE,
    TORCH_FAMILIES,
    UNATTRIBUTED,
    OpCounter,
    count_step,
)
from dnnperf.workloads import all_workloads, count_parameters, get_workload

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

MATMUL = ("matmul",)


def flops(counter: OpCounter, module: str, phase: str, families=None) -> int:
    return sum(
        r.flops or 0
        for r in counter.table()
        if r.module == module and r.phase == phase and (families is None or r.family in families)
    )


def forward_and_backward(model: nn.Module, *inputs: torch.Tensor) -> OpCounter:
    """Count ``model(*inputs).sum().backward()``; the model is the root, reported as ROOT_MODULE."""
    with OpCounter(model) as counter:
        output = model(*inputs)
        output = output[0] if isinstance(output, tuple) else output
        output.sum().backward()
    return counter


def no_hooks_left(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


# ---------------------------------------------------------------------------------------------------------
# Private torch APIs
# ---------------------------------------------------------------------------------------------------------


def test_the_private_torch_apis_the_counter_relies_on_still_behave():
    """Fails when torch moves or changes TorchDispatchMode or the autograd introspection used here."""
    from torch.utils._python_dispatch import TorchDispatchMode

    assert issubclass(opcount.CountingMode, TorchDispatchMode)
    assert callable(torch._C._current_graph_task_id) and callable(torch._C._current_autograd_node)
    assert {torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.convolution} <= set(
        flop_registry
    )
    model = nn.Sequential(nn.Linear(4, 3))
    counter = forward_and_backward(model, torch.randn(2, 4, requires_grad=True))
    backward = [r for r in counter.table() if r.phase == "backward" and r.family == "matmul"]
    # Two products (grad input, grad weight) found through the autograd node the Linear created.
    assert [(r.module, r.name, r.calls) for r in backward] == [("0", "aten.mm", 2)]


def test_a_torch_without_dispatch_modes_gets_a_clear_error(monkeypatch):
    monkeypatch.setattr(opcount, "_DISPATCH_MODE_ERROR", ImportError("no _python_dispatch"))
    with pytest.raises(RuntimeError, match="TorchDispatchMode"):
        OpCounter(nn.Linear(2, 2))


# ---------------------------------------------------------------------------------------------------------
# Hand-computed FLOPs
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("input_grad", [True, False])
def test_conv2d_with_stride_padding_and_groups(input_grad):
    n, c_in, c_out, k, groups, size = 2, 4, 6, 3, 2, 9
    conv = nn.Conv2d(c_in, c_out, k, stride=2, padding=1, groups=groups)
    out_size = (size + 2 - k) // 2 + 1
    counter = forward_and_backward(conv, torch.randn(n, c_in, size, size, requires_grad=input_grad))
    # 2 per multiply-add; the bias additions (and the bias gradient inside convolution_backward) are
    # not counted, as in torch's formula.
    forward = 2 * n * c_out * out_size * out_size * (c_in // groups) * k * k
    assert flops(counter, ROOT_MODULE, "forward") == forward
    # grad weight always, grad input only when the input requires grad: each one forward's worth
    # (torch's own formula counts a grouped weight gradient `groups` times over)
    assert flops(counter, ROOT_MODULE, "backward") == forward * (2 if input_grad else 1)


@pytest.mark.parametrize("input_grad", [True, False])
def test_linear(input_grad):
    batch, d_in, d_out = 3, 8, 6
    counter = forward_and_backward(nn.Linear(d_in, d_out), torch.randn(batch, d_in, requires_grad=input_grad))
    forward = 2 * batch * d_in * d_out
    assert flops(counter, ROOT_MODULE, "forward", MATMUL) == forward
    assert flops(counter, ROOT_MODULE, "backward", MATMUL) == forward * (2 if input_grad else 1)
    # the bias gradient: a sum over the batch, one addition per element of the output gradient
    assert flops(counter, ROOT_MODULE, "backward", ("reduction",)) == batch * d_out


class _Experts(nn.Module):
    """Four experts' matrices, each row of the input through its expert's (``torch._grouped_mm``, as
    transformers' mixture-of-experts layers call it), or through a loop of plain products. The output
    squared: a gradient of stride 0 (``sum``'s) is one the CPU's grouped product refuses."""

    def __init__(self, grouped: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 48, 32))
        self.grouped = grouped

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ends = [10, 30, 45, 64]  # rows 0-9 to the first expert, 10-29 to the second, ...
        if self.grouped:
            offsets = torch.tensor(ends, dtype=torch.int32)
            return torch._grouped_mm(x, self.weight.transpose(-2, -1), offs=offsets).square()
        starts = [0, *ends[:-1]]
        return torch.cat([x[s:e] @ w.t() for s, e, w in zip(starts, ends, self.weight, strict=True)]).square()


def test_grouped_products_count_the_flops_of_the_loop_of_products_they_replace():
    x = torch.randn(64, 32, requires_grad=True)
    grouped = forward_and_backward(_Experts(grouped=True), x)
    looped = forward_and_backward(_Experts(grouped=False), x)
    for phase in ("forward", "backward"):
        assert flops(grouped, ROOT_MODULE, phase, MATMUL) == flops(looped, ROOT_MODULE, phase, MATMUL) > 0
    assert flops(grouped, ROOT_MODULE, "forward", MATMUL) == 2 * 64 * 32 * 48  # each row through one expert


def rnn_products(gates: int, batch: int, steps: int, d_in: int, hidden: int, layers: int) -> list[int]:
    """Forward multiply-add FLOPs per (layer, direction) of a bidirectional RNN: every weight matrix on
    every token, 2 * B * T * gates * (input + hidden) * hidden."""
    widths = [d_in] + [2 * hidden] * (layers - 1)
    return [2 * batch * steps * gates * hidden * (width + hidden) for width in widths for _ in range(2)]


@pytest.mark.filterwarnings("ignore::UserWarning")  # mkldnn.flags() warns about TF32 on this build
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("onednn", [True, False])
@pytest.mark.parametrize("input_grad", [True, False])
def test_lstm_and_gru(cell, onednn, input_grad):
    batch, steps, d_in, hidden, layers = 2, 4, 6, 5, 2
    gates, cell_flops = (4, 13) if cell == "lstm" else (3, 10)
    rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(d_in, hidden, num_layers=layers, bidirectional=True)
    x = torch.randn(steps, batch, d_in, requires_grad=input_grad)
    with torch.backends.mkldnn.flags(enabled=onednn):
        counter = forward_and_backward(rnn, x)
    products = rnn_products(gates, batch, steps, d_in, hidden, layers)
    tokens, directions = batch * steps, 2 * layers
    # Gate arithmetic per hidden unit and token (LSTM: pre-activation sum 4, nonlinearities 4, cell
    # update 3, output 2; GRU: 10); the biases ride in the matrix products and are not counted.
    gate_arithmetic = cell_flops * hidden * tokens * directions
    names = {r.name for r in counter.table()}
    if "aten.mkldnn_rnn_layer" in names:  # one oneDNN kernel per layer and direction
        assert flops(counter, ROOT_MODULE, "forward", ("rnn",)) == sum(products) + gate_arithmetic
        # oneDNN computes all gradients (data and weights) whether or not the input needs one
        assert flops(counter, ROOT_MODULE, "backward", ("rnn",)) == 2 * (sum(products) + gate_arithmetic)
        return
    # Decomposed on the CPU into mm/addmm (input projection over all steps, then one product per step)
    # and element-wise operators, each counted by its own formula.
    assert flops(counter, ROOT_MODULE, "forward", MATMUL) == sum(products)
    assert flops(counter, ROOT_MODULE, "forward", ("elementwise",)) == gate_arithmetic
    # Backward products: the weight gradients (one forward's worth), the gradients through the
    # recurrence at every step but the first (the zero initial state needs none) and the input
    # gradients, except into the first layer's input when it does not require grad.
    hidden_products = [2 * batch * (steps - 1) * gates * hidden * hidden for _ in range(directions)]
    input_products = [p - 2 * batch * steps * gates * hidden * hidden for p in products]
    if not input_grad:
        input_products[:2] = [0, 0]
    assert flops(counter, ROOT_MODULE, "backward", MATMUL) == sum(products) + sum(hidden_products) + sum(
        input_products
    )


@pytest.mark.parametrize("backend", ["math", "flash"])
def test_multi_head_attention(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    batch, tgt, src, d_model, heads = 2, 5, 7, 16, 4
    attention = MultiHeadAttention(d_model, heads, dropout=0.0)
    x = torch.randn(batch, tgt, d_model, requires_grad=True)
    memory = torch.randn(batch, src, d_model, requires_grad=True)
    chosen = SDPBackend.MATH if backend == "math" else SDPBackend.FLASH_ATTENTION
    with sdpa_kernel(chosen):
        counter = forward_and_backward(attention, x, memory)
    projections = {
        name: 2 * batch * (tgt if name in ("q_proj", "out_proj") else src) * d_model * d_model
        for name in ("q_proj", "k_proj", "v_proj", "out_proj")
    }
    for name, forward in projections.items():
        assert flops(counter, name, "forward", MATMUL) == forward
        assert flops(counter, name, "backward", MATMUL) == 2 * forward
    # QKᵀ and AV: 2 * B * h * T * S * d each, summed over heads (h * d = d_model)
    products = 2 * (2 * batch * tgt * src * d_model)
    assert flops(counter, ROOT_MODULE, "forward", TORCH_FAMILIES) == products
    ran = {r.name for r in counter.table() if r.module == ROOT_MODULE}
    if "aten._scaled_dot_product_flash_attention_for_cpu" in ran:
        # the fused kernel's backward: five products, the recomputed scores included
        assert flops(counter, ROOT_MODULE, "backward", TORCH_FAMILIES) == products * 5 // 2
    else:
        assert backend == "math"
        assert flops(counter, ROOT_MODULE, "backward", TORCH_FAMILIES) == 2 * products


@pytest.mark.parametrize("input_grad", [True, False])
def test_batch_norm(input_grad):
    norm = nn.BatchNorm2d(3)
    x = torch.randn(2, 3, 4, 4, requires_grad=input_grad)
    n = x.numel()
    counter = forward_and_backward(norm, x)
    # mean 1 + variance 3 + normalize 2 + scale and shift 2
    assert flops(counter, ROOT_MODULE, "forward", ("normalization",)) == 8 * n
    # x̂ 2 + Σg·x̂ 2 for the weight gradient, Σg 1 for the bias; the input gradient adds 4
    assert flops(counter, ROOT_MODULE, "backward", ("normalization",)) == (9 if input_grad else 5) * n
    norm.eval()  # running statistics: normalize and affine only
    with OpCounter(norm) as counter, torch.no_grad():
        norm(x)
    assert flops(counter, ROOT_MODULE, "forward", ("normalization",)) == 4 * n


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(affine):
    norm = nn.LayerNorm(8, elementwise_affine=affine)
    x = torch.randn(2, 5, 8, requires_grad=True)
    n = x.numel()
    counter = forward_and_backward(norm, x)
    assert flops(counter, ROOT_MODULE, "forward", ("normalization",)) == (8 if affine else 6) * n
    # the input gradient needs x̂, Σg and Σg·x̂ whether or not there are weights
    assert flops(counter, ROOT_MODULE, "backward", ("normalization",)) == 9 * n


def test_embedding():
    vocab, dim = 50, 8
    embedding = nn.Embedding(vocab, dim)
    indices = torch.randint(0, vocab, (2, 5))
    counter = forward_and_backward(embedding, indices)
    (gather,) = [r for r in counter.table() if r.name == "aten.embedding"]
    rows = indices.numel() * dim * 4
    assert (gather.flops, gather.bytes_read, gather.bytes_written) == (0, indices.numel() * 8 + rows, rows)
    (scatter,) = [r for r in counter.table() if r.name == "aten.embedding_dense_backward"]
    assert scatter.module == ROOT_MODULE and scatter.phase == "backward"
    # one addition per gradient element into its row; the whole weight gradient is written
    assert scatter.flops == indices.numel() * dim
    assert scatter.bytes_written == vocab * dim * 4


def test_bytes_count_each_storage_once_per_operator():
    x = torch.randn(4, 4)
    row = torch.randn(1, 4)
    with OpCounter(nn.Identity()) as counter:
        x * x
        x + row.expand(4, 4)
    mul, add = (next(r for r in counter.table() if r.name == name) for name in ("aten.mul", "aten.add"))
    assert (mul.bytes_read, mul.bytes_written) == (64, 64)
    assert (add.bytes_read, add.bytes_written) == (64 + 16, 64)


# ---------------------------------------------------------------------------------------------------------
# Attribution
# ---------------------------------------------------------------------------------------------------------


def test_an_in_place_activation_is_attributed_to_its_own_module():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(inplace=True))
    counter = forward_and_backward(model, torch.randn(2, 3, 6, 6, requires_grad=True))
    ops = {(r.module, r.phase, r.name) for r in counter.table() if r.family != "free"}
    assert {("1", "forward", "aten.relu_"), ("1", "backward", "aten.threshold_backward")} <= ops
    assert not any(
        name in ("aten.relu_", "aten.threshold_backward") for module, _, name in ops if module != "1"
    )
    assert {("0", "forward", "aten.convolution"), ("0", "backward", "aten.convolution_backward")} <= ops


class SharedActivation(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        act = nn.Tanh()
        self.first = nn.Sequential(nn.Linear(4, 4), act)
        self.second = nn.Sequential(nn.Linear(4, 4), act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


def test_a_shared_module_reports_under_its_first_name_with_every_call():
    counter = forward_and_backward(SharedActivation(), torch.randn(3, 4))
    assert counter.module_calls["first.1"] == 2 and "second.1" not in counter.module_calls
    calls = {(r.module, r.name): r.calls for r in counter.table()}
    assert calls[("first.1", "aten.tanh")] == 2 and calls[("first.1", "aten.tanh_backward")] == 2
    assert not any(module == "second.1" for module, _ in calls)


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.tanh(self.lin(x)))


def test_a_module_called_twice_accumulates_both_calls():
    counter = forward_and_backward(Twice(), torch.randn(3, 4))
    assert counter.module_calls["lin"] == 2
    one = 2 * 3 * 4 * 4
    assert flops(counter, "lin", "forward", MATMUL) == 2 * one
    # weight gradients of both calls, the input gradient of the second only (x needs none)
    assert flops(counter, "lin", "backward", MATMUL) == 3 * one
    # the tanh between the calls ran in the root's own forward
    assert flops(counter, ROOT_MODULE, "forward", ("elementwise",)) == 3 * 4


def test_double_backward_is_attributed_to_the_modules():
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.randn(3, 4, requires_grad=True)
    with OpCounter(model) as counter:
        (grad,) = torch.autograd.grad(model(x).sum(), x, create_graph=True)
        grad.square().sum().backward()
    summary = counter.by_module()
    for module in ("0", "1", "2"):
        assert summary[module]["backward"]["flops"] > 0
    assert summary.get(UNATTRIBUTED, {}).get("backward", {}).get("flops", 0) == 0
    # the second-order ops of tanh (its backward's backward) belong to the Tanh module
    assert {r.name for r in counter.table() if r.module == "1" and r.phase == "backward"} >= {
        "aten.tanh_backward",
        "aten.mul",
    }


class Boom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.lin(x)
        raise RuntimeError("boom")


def test_hooks_and_the_mode_are_gone_after_the_counter_also_on_error():
    model = SharedActivation()
    forward_and_backward(model, torch.randn(3, 4))
    assert no_hooks_left(model)
    boom = Boom()
    counter = OpCounter(boom)
    with pytest.raises(RuntimeError, match="boom"), counter:
        boom(torch.randn(2, 4))
    assert no_hooks_left(boom)
    before = counter.table()
    torch.randn(2, 2) @ torch.randn(2, 2)
    assert counter.table() == before  # no longer counting
    with counter:  # and usable again
        boom.lin(torch.randn(2, 4))
    assert flops(counter, "lin", "forward", MATMUL) == 2 * (2 * 2 * 4 * 4)


# ---------------------------------------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------------------------------------


def test_the_step_reports_its_phases_and_the_update_is_counted():
    counter = count_step("basic_cnn", "tiny", 2)
    summary = counter.by_module()
    assert set(summary[NO_MODULE]) >= {"forward", "backward", "update"}  # loss, its gradient, SGD
    assert all(r.module == NO_MODULE for r in counter.table() if r.phase == "update")
    # SGD, first step: grad + wd * param (2 per element), then param - lr * buffer (2); the momentum
    # buffer starts as a copy of the gradient.
    assert counter.total_flops("update") == 4 * count_parameters(counter.model)


def test_without_autograd_introspection_the_stage_marks_give_the_phases(monkeypatch):
    """The fallback where torch lacks the private graph-task and current-node queries."""
    reference = count_step("basic_cnn", "tiny", 2)
    monkeypatch.setattr(opcount, "_graph_task_id", None)
    monkeypatch.setattr(opcount, "_current_node", None)
    counter = count_step("basic_cnn", "tiny", 2)
    for phase in ("forward", "backward", "update"):
        assert counter.total_flops(phase) == reference.total_flops(phase) > 0
    # backward operators cannot be traced to their module any more
    assert {r.module for r in counter.table() if r.phase == "backward"} == {UNATTRIBUTED}


def test_a3c_acting_under_no_grad_is_forward_work_of_the_network():
    config = get_workload("a3c").config("tiny")
    counter = count_step("a3c", "tiny", 2)
    # rollout_steps acting passes + the bootstrap value (no_grad) + the loss's batched pass
    assert counter.module_calls["conv1"] == config.rollout_steps + 2
    assert {r.phase for r in counter.table() if r.module == "conv1"} == {"forward", "backward"}
    calls = {
        r.phase: r.calls for r in counter.table() if r.module == "conv1" and r.name == "aten.convolution"
    }
    assert calls == {"forward": config.rollout_steps + 2}


def test_gpt2_matmul_flops_follow_the_6nd_rule():
    config = get_workload("gpt2").config("tiny")
    batch = 2
    tokens, d, layers, seq = batch * config.seq_len, config.n_embd, config.n_layer, config.seq_len
    counter = count_step("gpt2", "tiny", batch)
    # Weight matrices: q, k, v, out (4 d²) and the 4x MLP (8 d²) per layer, and the output projection
    # (tied to the token embedding, d x vocab). Forward 2 per multiply-add per token, backward twice
    # that (every layer's input requires grad). Attention (math backend: dropout is on): QKᵀ and AV,
    # 2 * B * T² * d each per layer forward, twice that backward.
    matrices = 12 * layers * d * d + d * config.vocab_size
    attention = 3 * layers * 2 * (2 * batch * seq * seq * d)
    expected = 6 * tokens * matrices + attention
    assert counter.total_flops(families=MATMUL) == expected
    assert counter.total_flops(families=TORCH_FAMILIES) == expected
    # The usual estimate, 6 x non-embedding parameters (biases and norms included, the tied projection
    # counted once) x tokens + 12 x layers x T² x d x B, agrees within 5%.
    model = counter.model
    embeddings = model.wte.weight.numel() + model.wpe.weight.numel()
    non_embedding = count_parameters(model) - embeddings + model.lm_head.weight.numel()
    estimate = 6 * non_embedding * tokens + 12 * layers * seq * seq * d * batch
    assert abs(counter.total_flops(families=MATMUL) - estimate) <= 0.05 * estimate


TORCH_OPS = {str(op) for op in flop_registry if isinstance(op, torch._ops.OpOverloadPacket)}


class _NoModuleTracking:
    """FlopCounterMode's module tracker breaks torch.autograd.grad inside a step (WGAN-GP's penalty);
    totals need no module attribution, so the reference counter runs without it."""

    parents = frozenset({"Global"})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def flop_counter_mode_reference(name: str) -> int:
    """torch's own FlopCounterMode total over the same step: the independent reference."""
    from torch.utils.flop_counter import FlopCounterMode

    workload = get_workload(name)
    torch.manual_seed(0)
    task = workload.build("tiny", "cpu")
    batch = workload.data("tiny").synthesize(2, 0)
    counter = FlopCounterMode(display=False)
    assert hasattr(counter, "mod_tracker")  # notices a change in FlopCounterMode's internals
    counter.mod_tracker = _NoModuleTracking()
    with counter:
        task.step(batch)
    return int(counter.get_total_flops())


@pytest.mark.parametrize("name", [w.name for w in all_workloads()])
def test_every_workload_is_counted_and_agrees_with_flop_counter_mode(name):
    counter = count_step(name, "tiny", 2)
    assert not counter.formula_errors
    reference = flop_counter_mode_reference(name)
    torch_formula_ops = sum(r.flops or 0 for r in counter.table() if r.name in TORCH_OPS)
    assert torch_formula_ops == reference > 0  # the same operators, the same formulas
    assert counter.total_flops("forward") + counter.total_flops("backward") >= reference
    assert counter.coverage() >= 0.98, counter.uncovered()
    backward = counter.total_flops("backward")
    unattributed = counter.by_module().get(UNATTRIBUTED, {}).get("backward", {}).get("flops", 0)
    assert backward > 0 and unattributed <= 0.01 * backward
    assert counter.total_flops("update") > 0
    known = {ROOT_MODULE, NO_MODULE, UNATTRIBUTED} | {n for n, _ in counter.model.named_modules() if n}
    assert {r.module for r in counter.table()} <= known


def test_reading_the_results_does_not_need_the_mode():
    counter = forward_and_backward(nn.Linear(3, 2), torch.randn(4, 3))
    records = counter.table()
    assert {r.phase for r in records} == {"forward", "backward"}
    assert counter.total_flops() == sum(r.flops or 0 for r in records)
    assert counter.uncovered() == {} and counter.coverage() == 1.0


def test_gelus_tanh_approximation_is_a_row_of_its_own():
    """One operator, two kernels (tanh-GELU ran 5x slower than erf-GELU here): the approximation is
    part of the row's name, forward and backward, so that each is calibrated and predicted apart."""
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(approximate="tanh"), nn.GELU())
    counter = OpCounter(model)
    with counter:
        model(torch.randn(4, 8, requires_grad=True)).sum().backward()
    names = {(r.module, r.phase, r.name) for r in counter.table()}
    assert {("1", "forward", "aten.gelu[tanh]"), ("1", "backward", "aten.gelu_backward[tanh]")} <= names
    assert {("2", "forward", "aten.gelu"), ("2", "backward", "aten.gelu_backward")} <= names


@pytest.mark.parametrize(
    ("pool", "shape", "window"),
    [
        (nn.AvgPool2d(3, stride=2, padding=1), (2, 4, 8, 8), 9),  # the kernel fits: 3x3 per output
        (nn.MaxPool2d(2), (2, 4, 8, 8), 4),
        # EfficientNet's pooler: a 1280-wide kernel with ceil_mode over a 2x2 map covers the 2x2 map
        (nn.AvgPool2d(1280, ceil_mode=True), (2, 4, 2, 2), 4),
    ],
)
def test_pooling_flops_are_the_window_it_covers_per_output(pool, shape, window):
    """The truth: a pooling output reads (and adds or compares) the input elements its window covers:
    the kernel, or the whole padded input where the kernel is larger than it."""
    x = torch.randn(*shape, requires_grad=True)
    counter = forward_and_backward(nn.Sequential(pool), x)
    outputs = pool(x).numel()
    assert flops(counter, "0", "forward", ("pooling",)) == window * outputs


def test_a_convolutions_rows_are_its_batch_times_output_pixels():
    """Output rows per call, forward and backward: batch x output height x output width (a strided
    convolution's output map, not its input's), summed over the calls; 0 for other operators."""
    model = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(16, 4, 1))
    counter = OpCounter(model)
    with counter:
        for _ in range(3):
            model(torch.randn(5, 8, 12, 10)).sum().backward()
    found = {(r.module, r.phase): r.rows for r in counter.table() if r.family == "convolution"}
    assert found == {(m, p): 3 * 5 * 6 * 5 for m in ("0", "2") for p in ("forward", "backward")}
    assert all(r.rows == 0 for r in counter.table() if r.family != "convolution")


def test_a_products_rows_are_its_smallest_dimension():
    """A linear layer's products at a batch of 3: the forward's (3 x 64 by 64 x 16) and the backward's
    input gradient (3 x 16 by 16 x 64) and weight gradient (16 x 3 by 3 x 64) all have 3 as their
    smallest dimension; at a batch of 100 the smallest is the layer's 16 outputs."""
    for batch, smallest in ((3, 3), (100, 16)):
        model = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 64, bias=False))
        counter = OpCounter(model)
        with counter:
            for _ in range(2):
                model(torch.randn(batch, 64, requires_grad=True)).sum().backward()
        found = {
            (r.module, r.phase, r.name): (r.rows, r.calls) for r in counter.table() if r.family == "matmul"
        }
        # Forward: one product a call (addmm with the bias, mm without); backward: the input's and the
        # weight's gradients (the first layer's input needs one: it requires grad), two a call.
        assert found == {
            ("0", "forward", "aten.addmm"): (2 * smallest, 2),
            ("2", "forward", "aten.mm"): (2 * smallest, 2),
            ("0", "backward", "aten.mm"): (4 * smallest, 4),
            ("2", "backward", "aten.mm"): (4 * smallest, 4),
        }


def test_convolution_kinds_follow_groups_and_kernel_size():
    """Each convolution's shape class from how the layer was built: groups and kernel size."""
    built = {
        "0": (nn.Conv2d(8, 16, 1), "pointwise"),
        "1": (nn.Conv2d(16, 16, 3, padding=1, groups=16), "depthwise"),
        "2": (nn.Conv2d(16, 16, 3, padding=1, groups=4), "grouped"),
        "3": (nn.Conv2d(16, 8, 3, padding=1), ""),
        "4": (nn.ConvTranspose2d(8, 8, 2, stride=2), ""),
        "5": (nn.Conv2d(8, 8, 1, groups=8), "depthwise"),
        "6": (nn.Conv2d(8, 8, (1, 7), padding=(0, 3)), ""),
    }
    model = nn.Sequential(*(layer for layer, _ in built.values()))
    counter = OpCounter(model)
    with counter:
        model(torch.randn(2, 8, 8, 8)).sum().backward()
    found = {(r.module, r.phase): r.kind for r in counter.table() if r.family == "convolution"}
    for name, (_, kind) in built.items():
        assert found[(name, "forward")] == kind, name
        assert found[(name, "backward")] == kind, name
    assert all(r.kind == "" for r in counter.table() if r.family != "convolution")


class _SteppedGRU(nn.Module):
    """A GRU cell stepped by hand over a sequence: one Python call a step, compiled (``torch._VF``) or
    written out in Python, one torch call per kernel."""

    def __init__(self, compiled: bool) -> None:
        super().__init__()
        self.cell = nn.GRUCell(4, 4)
        self.compiled = compiled

    def step(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        cell = self.cell
        if self.compiled:
            return torch._VF.gru_cell(x, h, cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
        gi = torch.nn.functional.linear(x, cell.weight_ih, cell.bias_ih).chunk(3, 1)
        gh = torch.nn.functional.linear(h, cell.weight_hh, cell.bias_hh).chunk(3, 1)
        r = torch.sigmoid(gi[0] + gh[0])
        z = torch.sigmoid(gi[1] + gh[1])
        n = torch.tanh(gi[2] + r * gh[2])
        return n + z * (h - n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x[:, 0]
        for t in range(1, x.shape[1]):
            h = self.step(x[:, t], h)
        return h


def test_kernels_a_compiled_call_issues_after_its_first_are_inner_calls_of_the_forward():
    steps = 4
    kernels, inner = {}, {}
    for compiled in (True, False):
        model = _SteppedGRU(compiled)
        x = torch.randn(2, steps + 1, 4, requires_grad=True)
        counter = OpCounter(model)
        with counter:
            loss = model(x).sum()
            with counter("backward"):
                loss.backward()
        forward = [r for r in counter.table() if r.phase == "forward" and r.family != "free"]
        kernels[compiled] = sum(r.calls for r in forward if r.name != "aten.sum")
        inner[compiled] = sum(r.inner_calls for r in forward)
        assert all(r.inner_calls == 0 for r in counter.table() if r.phase != "forward" or r.family == "free")
    # Written out, every kernel is a torch call of its own: none is inner. Compiled, the kernels of
    # each of the `steps` calls but its first are, whatever their number.
    assert inner[False] == 0
    assert kernels[True] > 2 * steps  # a dozen or so a call
    assert inner[True] == kernels[True] - steps


def test_a_python_torch_function_is_no_scope_and_a_failing_call_closes_its_own():
    logits, labels = torch.randn(3, 5, requires_grad=True), torch.tensor([0, 1, 2])
    counter = OpCounter(nn.Module())
    with counter:
        # F.cross_entropy is Python: the compiled loss it calls (log-softmax, then the NLL) is unseen.
        torch.nn.functional.cross_entropy(logits, labels)
    rows = {r.name: (r.calls, r.inner_calls) for r in counter.table() if r.family != "free"}
    assert rows == {"aten._log_softmax": (1, 0), "aten.nll_loss_forward": (1, 0)}
    scopes = opcount.CallScopes()
    with scopes:
        with pytest.raises(RuntimeError):
            torch.cosine_embedding_loss(logits, torch.randn(3, 5), torch.ones(2))  # 3 rows, 2 targets
        assert scopes.issued is None  # the failed call's scope closed with it


def test_a_timed_counter_leaves_the_scopes_out_of_the_step_it_times():
    model = _SteppedGRU(compiled=True)
    counter = OpCounter(model, timed=True)
    with counter:
        model(torch.randn(2, 5, 4))
    rows = [r for r in counter.table() if r.family != "free"]
    assert sum(r.calls for r in rows) > 20 and all(r.inner_calls == 0 for r in rows)
