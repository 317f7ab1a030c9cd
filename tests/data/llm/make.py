"""Make the weightless LLM graphs the tests import: tiny models of each family onnxruntime-genai builds.

Each is a Hugging Face config of 2 layers of width 64 given random weights (bench/llm_zoo.py
does the building: `transformers`, a WordLevel tokenizer, onnxruntime-genai's model builder),
then only `model.onnx` and `genai_config.json` are kept: the weights (model.onnx.data) are
deleted, so the graphs here are weightless, as an app hands them to the agent. Beside the
builder's graphs: an `onnxruntime.quantization.quantize_dynamic` int8 copy of the fp32 Qwen
graph (MatMulInteger, DynamicQuantizeLinear), and a decoder in plain ONNX ops as torch's exporter (and
Optimum) write them.

Needs the benchmark's packages (bench/requirements.txt) and onnxruntime-genai:

    .venv/bin/pip install -r bench/requirements.txt
    .venv/bin/python -m tests.data.llm.make
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic

from bench import llm_zoo

HERE = Path(__file__).resolve().parent

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=2048, rms_norm_eps=1e-6)

# (fixture name, family, precisions, builder extra options)
FIXTURES = (
    (llm_zoo.Family("qwen2", "qwen2", dict(TINY, tie_word_embeddings=True), "Qwen2/2.5",
                    ("int4", "int8", "fp16", "fp32"))),
    (llm_zoo.Family("llama", "llama", dict(TINY, tie_word_embeddings=False), "Llama", ("int4", "fp32"))),
    (llm_zoo.Family("llama-unpacked", "llama", dict(TINY, tie_word_embeddings=False),
                    "Llama, q/k/v not packed", ("int4",), {"disable_qkv_fusion": "true"})),
    (llm_zoo.Family("phi3", "phi3", dict(TINY, num_key_value_heads=4, original_max_position_embeddings=2048,
                                          pad_token_id=0), "Phi-3", ("int4", "fp32"))),
    (llm_zoo.Family("gemma", "gemma", dict(TINY, num_key_value_heads=1, head_dim=32,
                                           hidden_activation="gelu_pytorch_tanh"), "Gemma", ("int4", "fp32"))),
    (llm_zoo.Family("mistral", "mistral", dict(TINY, sliding_window=1024), "Mistral", ("int4",))),
)


def main(argv: list[str]) -> int:
    if argv[1:] == ["--plain"]:  # only the plain-ONNX decoder
        _plain_decoder(HERE / "plain-decoder-fp32")
        return 0
    with tempfile.TemporaryDirectory(prefix="daop-llm-") as tmp:
        cache = Path(tmp)
        for fam in FIXTURES:
            for precision in fam.precisions:
                try:
                    llm_zoo.build(fam, precision, cache_dir=cache, log=print)
                except RuntimeError as exc:
                    print(f"skipped {fam.name} {precision}: {exc}")
                    continue
                _keep(fam.folder(precision, cache), HERE / f"{fam.name}-{precision}")
        _quantize_dynamic(cache / "qwen2" / "fp32" / "model.onnx", HERE / "qwen2-dynamic-int8")
    _plain_decoder(HERE / "plain-decoder-fp32")
    return 0


def _plain_decoder(target: Path) -> None:
    """A decoder in plain ONNX ops (MatMul, Softmax, Concat of the cache), as torch's exporter and Optimum
    write them: bench/nets.py's CachedDecoder, 2 layers of width 64, cache inputs past_key_values.N.*."""
    import torch  # noqa: PLC0415 - optional: only to make the data

    from bench.nets import CachedDecoder  # noqa: PLC0415 - needs torch: only to make the data

    torch.manual_seed(0)
    model = CachedDecoder(2, 64, 4, vocab=256, positions=2048).eval()
    past_names = [f"past_key_values.{i}.{kind}" for i in range(2) for kind in ("key", "value")]
    present_names = [f"present.{i}.{kind}" for i in range(2) for kind in ("key", "value")]
    axes = {"input_ids": {0: "batch_size", 1: "sequence_length"}, "logits": {0: "batch_size", 1: "sequence_length"}}
    axes.update({n: {0: "batch_size", 2: "past_sequence_length"} for n in past_names})
    axes.update({n: {0: "batch_size", 2: "total_sequence_length"} for n in present_names})
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        out = Path(tmp) / "model.onnx"
        torch.onnx.export(model, (torch.zeros(1, 2, dtype=torch.long), *[torch.zeros(1, 4, 3, 16)] * 4), str(out),
                          input_names=["input_ids", *past_names], output_names=["logits", *present_names],
                          dynamic_axes=axes, opset_version=17, dynamo=False)
        exported = onnx.load(str(out))
        exported.ir_version = min(exported.ir_version, 10)
        onnx.save(exported, str(target / "model.onnx"), save_as_external_data=True, location="model.onnx.data",
                  size_threshold=256)
    (target / "model.onnx.data").unlink()


def _keep(built: Path, target: Path) -> None:
    """The graph and its genai_config.json, without the weights."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name in ("model.onnx", "genai_config.json"):
        shutil.copyfile(built / name, target / name)


def _quantize_dynamic(fp32: Path, target: Path) -> None:

    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "model.onnx"
        quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8)
        model = onnx.load(str(out))
        onnx.save(model, str(target / "model.onnx"), save_as_external_data=True, location="model.onnx.data",
                  size_threshold=256)
    (target / "model.onnx.data").unlink()  # weightless: the weights stay behind
    shutil.copyfile(fp32.with_name("genai_config.json"), target / "genai_config.json")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
