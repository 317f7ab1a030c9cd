"""Small language models: the graphs onnxruntime-genai's builder emits, imported without weights, shaped
as onnxruntime shapes them, planned as it runs them, priced as generations; the CLI and the MQTT API.

The graphs are tiny weightless fixtures (tests/data/llm, made by tests/data/llm/make.py): 2 layers of
width 64 of Qwen2, Llama (q/k/v packed and not), Phi-3, Gemma and Mistral, in int4, int8, fp16 and fp32,
and an onnxruntime.quantization dynamic int8 graph. Where onnxruntime must run one, its absent weights
are filled with random values (bench/materialize.py).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as h
import onnxruntime as ort
import pytest
from agent_harness import agent_on, client, request_v5, write_config
from models import make_model, mlp, value

from agent.simulation.materialize import materialize
from daop_client import DaopClient
from monitors.errors import BadInput, GraphError
from monitors.graphs.decoder import find_decoder
from monitors.graphs.importer import load_decoder, load_graph
from monitors.graphs.limits import Limits
from monitors.graphs.onnx_import import read_weightless
from monitors.pricing.costmodel import weight_bytes
from monitors.pricing.generation import (
    GenerationPlan,
    GenerationSpec,
    decode_pasts,
    decode_weights,
    generation_times,
    plan_from_json,
)
from monitors.pricing.kernels import Kernel, Plan
from monitors.speed.present import AT_REST, Speed
from monitors.table import Member, MonitorTable

DATA = Path(__file__).resolve().parent / "data" / "llm"
FIXTURES = sorted(p.name for p in DATA.iterdir() if (p / "model.onnx").exists())
BUILDER = [f for f in FIXTURES if f != "qwen2-dynamic-int8"]


def model_path(name: str) -> Path:
    return DATA / name / "model.onnx"


def feeds_for(session: ort.InferenceSession, bindings: dict) -> dict[str, np.ndarray]:
    feeds = {}
    for arg in session.get_inputs():
        shape = bindings[arg.name].shape
        if arg.type == "tensor(int64)":
            feeds[arg.name] = np.ones(shape, np.int64) if "mask" in arg.name else np.zeros(shape, np.int64)
        else:
            dtype = np.float16 if arg.type == "tensor(float16)" else np.float32
            feeds[arg.name] = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    return feeds


def test_the_fixtures_cover_every_family_and_precision():
    assert {"qwen2-int4", "qwen2-int8", "qwen2-fp16", "qwen2-fp32", "llama-int4", "llama-fp32", "llama-unpacked-int4",
            "phi3-int4", "phi3-fp32", "gemma-int4", "gemma-fp32", "mistral-int4", "qwen2-dynamic-int8"} <= set(FIXTURES)
    for name in FIXTURES:  # weightless: the weights file was left behind
        assert not (DATA / name / "model.onnx.data").exists()


# --- import ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FIXTURES)
def test_every_graph_imports_for_a_prefill_with_an_empty_cache_and_a_decode_step(name):
    source = load_decoder(model_path(name))
    vocab = 256
    for new, past in ((7, 0), (1, 9)):
        graph = source.graph(source.decoder.bindings(new, past))
        assert graph.tensors["logits"].shape == (1, new, vocab)
        presents = [o.name for o in graph.model.graph.output if o.name.startswith("present")]
        assert len(presents) == 4  # 2 layers, key and value
        assert all(graph.tensors[p].shape[2] == past + new for p in presents)


@pytest.mark.parametrize("name", FIXTURES)
def test_inferred_shapes_are_the_ones_onnxruntime_produces(name):
    source = load_decoder(model_path(name))
    for new, past in ((5, 0), (1, 3)):
        bindings = source.decoder.bindings(new, past)
        graph = source.graph(bindings)
        session = ort.InferenceSession(materialize(graph).SerializeToString(), providers=["CPUExecutionProvider"])
        outputs = session.run(None, feeds_for(session, bindings))
        for meta, output in zip(session.get_outputs(), outputs, strict=True):
            assert output.shape == graph.tensors[meta.name].shape, meta.name


def test_the_decoder_inputs_come_from_the_graph_alone_without_genai_config(tmp_path):
    for name in ("qwen2-int4", "llama-unpacked-int4", "gemma-fp32", "phi3-int4"):
        shutil.copyfile(model_path(name), tmp_path / "model.onnx")
        alone = load_decoder(tmp_path / "model.onnx").decoder
        with_config = load_decoder(model_path(name)).decoder
        config = json.loads((DATA / name / "genai_config.json").read_text())["model"]["decoder"]
        assert alone.head_size == with_config.head_size == config["head_size"], name
        assert alone.bindings(3, 0) == with_config.bindings(3, 0)
        assert alone.context_limit is None and with_config.context_limit == 2048


def test_an_empty_cache_binds_a_zero_past_length():
    bindings = load_decoder(model_path("qwen2-int4")).decoder.bindings(12, 0)
    assert bindings["input_ids"].shape == (1, 12) and bindings["attention_mask"].shape == (1, 12)
    assert bindings["past_key_values.0.key"].shape == (1, 2, 0, 16)


def test_a_graph_that_is_not_a_decoder_is_a_clear_error():
    with pytest.raises(GraphError, match="not a language model: no input_ids"):
        find_decoder(mlp([8, 8]))
    model = read_weightless(model_path("qwen2-int4"), Limits())
    for past in [v for v in model.graph.input if v.name.startswith("past")]:
        model.graph.input.remove(past)
    with pytest.raises(GraphError, match="no input named like past_key_values"):
        find_decoder(model)


# --- planning --------------------------------------------------------------------------------------------------------

def _onnxruntime_ops(model: onnx.ModelProto, tmp_path: Path) -> dict[str, int]:
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    counts: dict[str, int] = {}
    for node in onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


@pytest.mark.parametrize("name", ["qwen2-int4", "qwen2-int8", "qwen2-dynamic-int8", "qwen2-fp32", "phi3-int4",
                                  "gemma-int4", "llama-unpacked-int4"])
def test_the_plan_runs_the_kernels_onnxruntime_runs(name, estimator, tmp_path):
    source = load_decoder(model_path(name))
    graph = source.graph(source.decoder.bindings(4, 6))
    plan = estimator.plan(graph, "cpu")
    ops = _onnxruntime_ops(materialize(graph), tmp_path)
    mine = [k.op for k in plan.kernels]
    assert sum(op.startswith("MatMulNBits") for op in mine) == ops.get("MatMulNBits", 0)
    assert mine.count("GroupQueryAttention") == ops.get("GroupQueryAttention", 0)
    int8 = ops.get("DynamicQuantizeMatMul", 0) + ops.get("MatMulIntegerToFloat", 0)
    assert sum(k.family == "qgemm" for k in plan.kernels) == int8
    assert sum(op.startswith("DynamicQuantizeMatMul") for op in mine) == ops.get("DynamicQuantizeMatMul", 0)
    assert mine.count("Silu") + mine.count("QuickGelu") == ops.get("QuickGelu", 0)  # SiLU fused
    assert "QuickGelu" not in mine  # x * sigmoid(x): alpha 1, priced from its own table
    assert not [n for n in plan.notes if "no cost model" in n]


def test_quantized_kernels_carry_their_weight_bytes(estimator):
    source = load_decoder(model_path("qwen2-int4"))
    plan = estimator.plan(source.graph(source.decoder.bindings(1, 30)), "cpu")
    nbits = [k for k in plan.kernels if k.family == "nbits"]
    assert nbits and all(k.params[3] == 4 and k.params[4] == 32 for k in nbits)  # 4 bits, blocks of 32, int8 compute
    k = nbits[0]
    assert weight_bytes(k) == k.params[1] * k.params[2] / 2 + k.params[1] / 32 * k.params[2] * 4
    gqa = [k for k in plan.kernels if k.family == "gqa"]
    assert len(gqa) == 2 and gqa[0].params[:4] == (4, 1, 31, 16)  # 4 heads, 1 token, past 30, heads of 16
    assert weight_bytes(gqa[0]) == 3 * 2 * 4 * 2 * 31 * 16  # keys and values of the context, three passes


# --- generations -----------------------------------------------------------------------------------------------------

def test_decode_weights_sum_every_step_and_are_exact_for_a_linear_cost():
    spec = GenerationSpec(100, 50)
    pasts = decode_pasts(spec)
    assert pasts[0] == 100 and pasts[-1] == 148 and len(pasts) == 3
    weights = decode_weights(pasts, 100, 148)
    assert sum(weights) == pytest.approx(49)
    cost = lambda past: 2.0 + 0.01 * past  # noqa: E731
    weighted = sum(w * cost(p) for w, p in zip(weights, pasts, strict=True))
    assert weighted == pytest.approx(sum(cost(p) for p in range(100, 149)))
    assert decode_pasts(GenerationSpec(10, 1)) == [] and decode_pasts(GenerationSpec(10, 3)) == [10, 11]


def test_a_generation_is_its_prefill_then_its_decode_steps(estimator):
    source = load_decoder(model_path("qwen2-int4"))
    spec = GenerationSpec(64, 33)
    plan = estimator.plan_generation(source.decoder, spec, source.graph)
    model = estimator.models["cpu"]
    times = generation_times(plan, lambda p: 1000 * model.seconds(p))
    prefill = 1000 * model.seconds(plan.prefill)
    first, last = (1000 * model.seconds(p) for _, _, p in (plan.decode[0], plan.decode[-1]))
    assert times.ttft_ms == pytest.approx(prefill)
    assert first <= times.tpot_ms <= last  # the mean step lies between the first and the last
    assert times.total_ms == pytest.approx(prefill + 32 * times.tpot_ms)
    assert estimator.base_latency_ms(plan) == pytest.approx(times.total_ms)
    again = plan_from_json(plan.to_json())
    assert isinstance(again, GenerationPlan) and again.to_json() == plan.to_json()
    assert estimator.base_latency_ms(again) == pytest.approx(times.total_ms)
    assert isinstance(plan_from_json(plan.prefill.to_json()), Plan)
    # the memory it needs: weights, the cache at the full context, the peak activations
    kv = 2 * 2 * 2 * (64 + 32) * 16 * 4  # layers x (key, value) x KV heads x context x head x float32
    assert plan.memory_bytes >= plan.prefill.weight_bytes + kv


def test_longer_prompts_and_contexts_cost_more(estimator):
    source = load_decoder(model_path("qwen2-fp32"))
    plans = {n: estimator.plan_generation(source.decoder, GenerationSpec(n, 64), source.graph) for n in (16, 512)}
    model = estimator.models["cpu"]
    short, long = (generation_times(plans[n], lambda p: model.seconds(p)) for n in (16, 512))
    assert long.ttft_ms > 4 * short.ttft_ms
    assert long.tpot_ms > short.tpot_ms  # a decode step reads and appends to a longer cache


def test_a_generation_that_does_not_fit_in_free_memory_is_not_run(estimator):
    source = load_decoder(model_path("qwen2-int4"))
    plan = estimator.plan_generation(source.decoder, GenerationSpec(32, 8), source.graph)
    roomy = Speed(cpu=2.0, gpu=None, gpu_free_bytes=None, reasons=(), mem_available_bytes=10**10)
    fine = estimator.estimate_generation({"cpu": plan}, "cpu", roomy)
    at_rest = estimator.estimate_generation({"cpu": plan}, "cpu", AT_REST)
    assert fine.why_not is None and fine.times.total_ms == pytest.approx(2 * at_rest.times.total_ms)
    tight = Speed(cpu=1.0, gpu=None, gpu_free_bytes=None, reasons=(), mem_available_bytes=plan.memory_bytes // 2)
    est = estimator.estimate_generation({"cpu": plan}, "cpu", tight)
    assert not est.times.feasible and est.times.tier == "poor"
    assert est.why_not.startswith(f"needs {plan.memory_bytes / 1e9:.2f} GB of memory")


def test_a_cpu_monitor_that_does_not_fit_does_not_turn_true_but_a_met_one_is_not_turned_false():
    table = MonitorTable()
    table.add("waiting", [Member(5.0, "cpu", 100.0, memory_bytes=2 * 10**9)], False, 1)
    table.add("running", [Member(5.0, "cpu", 100.0, memory_bytes=2 * 10**9)], True, 2)
    assert table.evaluate(10.0, Speed(mem_available_bytes=10**9)) == []  # its own app may hold the memory
    changes = table.evaluate(20.0, Speed(mem_available_bytes=4 * 10**9))
    assert [(c.monitor, c.meets) for c in changes] == [("waiting", True)]


def test_generation_spec_is_checked():
    for prompt, output in ((0, 1), (5, 0), (True, 3), (5, 2**21), (1.5, 2)):
        with pytest.raises(BadInput):
            GenerationSpec(prompt, output)
    assert GenerationSpec(512, 128).context == 639


# --- calibration -----------------------------------------------------------------------------------------------------

def test_the_calibration_measures_the_llm_kernels(estimator):
    tables = estimator.calibrations["cpu"].tables
    for family in ("nbits", "nbits_f", "qgemm", "gqa", "SimplifiedLayerNormalization",
                   "SkipSimplifiedLayerNormalization", "RotaryEmbedding", "GatherBlockQuantized"):
        assert len(tables[family].points) >= 4, family
    decode = {p: s for p, s in tables["gqa"].points if p[1] == 1}  # one token against a growing cache
    assert decode[(4.0, 1.0, 2048.0, 64.0)] > decode[(4.0, 1.0, 16.0, 64.0)]


def test_kernels_beyond_the_grid_axes_are_priced_by_their_coordinates(estimator):
    model = estimator.models["cpu"]
    four = Kernel("nbits", (64, 1024, 1024, 4, 32, 4), 2 * 64 * 1024 * 1024, "MatMulNBits")
    eight = Kernel("nbits", (64, 1024, 1024, 8, 128, 2), 2 * 64 * 1024 * 1024, "MatMulNBits")
    assert model.kernel_seconds(four) == model.kernel_seconds(eight)  # bits only change the bytes streamed
    assert weight_bytes(eight) > weight_bytes(four)


# --- the command line ------------------------------------------------------------------------------------------------

def daop(*args: str, state_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent", *args, "--state-dir", str(state_dir)],
                          capture_output=True, text=True, timeout=120)


def test_estimate_a_generation_from_prompt_and_output_lengths(state_dir):
    r = daop("estimate", str(model_path("qwen2-int4")), "--prompt-tokens", "64", "--output-tokens", "16", "--json",
             "--at-rest", state_dir=state_dir)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_tokens"] == 64 and out["output_tokens"] == 16 and out["fits"] is True
    assert out["total_ms"] == out["latency_ms"] == pytest.approx(
        out["time_to_first_token_ms"] + 15 * out["time_per_output_token_ms"], rel=1e-3, abs=0.01)
    assert out["tier"] in ("excellent", "good") and out["memory_bytes"] > 0
    plain = daop("estimate", str(model_path("qwen2-int4")), "--prompt-tokens", "64", "--output-tokens", "16",
                 state_dir=state_dir)
    assert plain.returncode == 0 and plain.stdout.count("\n") == 1 and "first token" in plain.stdout


@pytest.mark.parametrize("args, message", [
    (["--prompt-tokens", "8", "--input", "input_ids=1x8"], "--input does not go with --prompt-tokens"),
    (["--output-tokens", "8"], "--output-tokens needs --prompt-tokens"),
    (["--prompt-tokens", "0"], "prompt tokens must be a whole number"),
    (["--prompt-tokens", "2000", "--output-tokens", "100"], "need a context of 2099; this model's is 2048"),
])
def test_bad_generation_arguments_exit_2_with_one_line(args, message, state_dir):
    r = daop("estimate", str(model_path("qwen2-int4")), *args, state_dir=state_dir)
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


# --- MQTT ------------------------------------------------------------------------------------------------------------

CONFIG = """
[monitors]
min_dwell_s = 0.2
"""


@pytest.fixture
def agent(state_dir: Path, mosquitto, device, tmp_path: Path):
    proc = agent_on(device, state_dir, mosquitto.url, write_config(tmp_path, CONFIG), "dev1").start()
    yield proc
    proc.stop()


async def test_generation_over_mqtt_answers_tiers_only(agent, mosquitto):
    model = base64.b64encode(model_path("qwen2-int4").read_bytes()).decode()
    generation = {"promptTokens": 64, "outputTokens": 16}
    async with client(mosquitto.port) as c:
        answer, _ = await request_v5(c, "dev1", "estimate", {"onnx": model, "generation": generation})
        assert answer["status"] == "ok", answer
        data = answer["data"]
        assert set(data) == {"performanceTier", "timeToFirstTokenTier", "timePerOutputTokenTier"}
        assert all(isinstance(v, str) for v in data.values())
        met, _ = await request_v5(c, "dev1", "meets", {"onnx": model, "generation": generation,
                                                       "requiredTier": "poor"})
        assert met["data"] == {"meetsRequirement": True}
        created, _ = await request_v5(c, "dev1", "monitors/create", {"onnx": model, "generation": generation,
                                                                    "requiredTier": "moderate", "monitor": "chat"})
        assert created["data"] == {"monitor": "chat", "meetsRequirement": True}
        for bad, code in (({"promptTokens": 0}, "bad_generation"), ({"outputTokens": 3}, "bad_generation"),
                          ({"promptTokens": 8, "extra": 1}, "bad_generation"), ([8], "bad_generation")):
            answer, _ = await request_v5(c, "dev1", "estimate", {"onnx": model, "generation": bad})
            assert answer["status"] == "error" and answer["error"]["code"] == code, answer
        both, _ = await request_v5(c, "dev1", "estimate", {"onnx": model, "generation": generation,
                                                          "inputs": {"input_ids": {"shape": [1, 4]}}})
        assert both["error"]["code"] == "bad_generation"
        not_llm, _ = await request_v5(c, "dev1", "estimate", {
            "onnx": base64.b64encode(mlp([8, 8], batch=1).SerializeToString()).decode(), "generation": generation})
        assert not_llm["status"] == "error" and "not a language model" in not_llm["error"]["message"]


async def test_the_python_client_asks_about_generations(agent, mosquitto):

    async with DaopClient(mosquitto.url, device_id="dev1") as daop:
        tier = await daop.estimate(model_path("qwen2-int4"), generation=(64, 16))
        assert await daop.meets(model_path("qwen2-int4"), tier, generation=(64, 16))
        monitor = await daop.create_monitor(model_path("qwen2-int4"), "poor", generation=(64, 16))
        assert monitor.meets
        await monitor.delete()


def test_rms_norm_of_opset_23_and_int8_convolutions_are_priced_by_their_own_kernels(estimator):


    T = onnx.TensorProto
    nodes = [h.make_node("RMSNormalization", ["x", "g"], ["n"], axis=-1),
             h.make_node("QuantizeLinear", ["n", "s", "z"], ["q"]),
             h.make_node("ConvInteger", ["q", "w", "z"], ["c"], pads=[1, 1, 1, 1])]
    inits = [onnx.numpy_helper.from_array(np.ones(8, np.float32), "g"),
             onnx.numpy_helper.from_array(np.array(0.1, np.float32), "s"),
             onnx.numpy_helper.from_array(np.array(0, np.uint8), "z"),
             onnx.numpy_helper.from_array(np.ones((16, 4, 3, 3), np.uint8), "w")]
    model = make_model(nodes, [value("x", [1, 4, 8, 8])], [value("c", None, T.INT32)], inits, opset=23)
    plan = estimator.plan(load_graph(model.SerializeToString(), fmt="onnx"), "cpu")
    assert [(k.family, k.op) for k in plan.kernels] == [("norm", "RMSNormalization"), ("eltwise", "QuantizeLinear"),
                                                         ("conv", "ConvInteger")]
    assert estimator.models["cpu"].table(plan.kernels[0]) == "SimplifiedLayerNormalization"
