"""The accuracy benchmark's model zoo: real models as ONNX files plus the input bindings to run them with.

Each entry names an ONNX file under bench/.cache/zoo/ (built on first use, then
cached) and binds every graph input to a concrete shape. Several entries share
one file exported with symbolic dimensions (batch, sequence, height, width), so
the benchmark also exercises binding symbolic dimensions from InputSpecs.

Sources: the 9 CNNs the onnx wheel ships (IR 3, opset 9, weights from
ConstantOfShape), transformer encoders/decoders and ViTs from `transformers`
configs (random init, nothing downloaded), and the PyTorch nets in bench/nets.py.
Exports use opset 17 and IR version <= 10 so onnxruntime 1.31 loads them.

    python -m bench.zoo            # build what is missing and list the zoo
    python -m bench.zoo --rebuild  # rebuild every file
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from agent.simulation.materialize import materialize
from monitors.graphs.graph import InputSpec
from monitors.graphs.importer import load_graph

CACHE_DIR = Path(__file__).resolve().parent / ".cache" / "zoo"
OPSET = 17
MAX_IR_VERSION = 10
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"

Builder = Callable[[Path], None]


@dataclass(frozen=True)
class ZooModel:
    """One benchmark case: a model file and the concrete shapes of its inputs."""

    name: str
    family: str
    file: str  # file name under the cache dir; cases differing only in bindings share it
    inputs: dict[str, InputSpec]
    build: Builder

    def path(self, cache_dir: Path = CACHE_DIR, rebuild: bool = False) -> Path:
        """The ONNX file, built first when missing (or when `rebuild`)."""
        target = cache_dir / self.file
        if rebuild or not target.exists():
            cache_dir.mkdir(parents=True, exist_ok=True)
            self.build(target)
        return target


# --- writing files ---------------------------------------------------------------------------------------------------

def _write(model: onnx.ModelProto, path: Path) -> None:
    """Save atomically, with an IR version onnxruntime 1.31 reads."""
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    tmp = path.with_name(path.name + ".tmp")
    onnx.save(model, str(tmp))
    tmp.replace(path)


def _export(module: Any, args: tuple, path: Path, input_names: list[str], output_names: list[str],
            dynamic_axes: dict[str, dict[int, str]] | None = None) -> None:
    """torch.onnx.export with the TorchScript exporter (fast, no onnxscript), opset 17."""
    import torch  # noqa: PLC0415 - optional: only to build the zoo

    tmp = path.with_name(path.name + ".tmp")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, str(tmp), input_names=input_names, output_names=output_names,
                          opset_version=OPSET, dynamo=False, dynamic_axes=dynamic_axes or None,
                          do_constant_folding=True)
    model = onnx.load(str(tmp))
    if model.ir_version > MAX_IR_VERSION:
        _write(model, path)
        tmp.unlink()
    else:
        tmp.replace(path)


def _copy_light(source: str, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    shutil.copyfile(LIGHT_DIR / source, tmp)
    tmp.replace(path)


# --- builders --------------------------------------------------------------------------------------------------------

def _webnn(path: Path, source: Path, inputs: dict[str, InputSpec]) -> None:
    """A WebNN graph as the ONNX a WebNN-on-onnxruntime backend runs (weights drawn at random)."""
    tmp = path.with_name(path.name + ".tmp")
    onnx.save(materialize(load_graph(source, inputs=inputs)), str(tmp))
    tmp.replace(path)


def _bert(path: Path, layers: int, hidden: int, heads: int) -> None:
    import torch  # noqa: PLC0415 - optional: only to build the zoo
    from transformers import BertConfig, BertModel  # noqa: PLC0415 - optional: only to build the zoo

    torch.manual_seed(0)
    config = BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=4 * hidden, vocab_size=30522, max_position_embeddings=512)
    bert = BertModel(config, add_pooling_layer=False).eval()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.zeros(1, 16, dtype=torch.long)
    axes = {"batch": 0, "seq": 1}
    _export(Encoder(), (ids, torch.ones_like(ids)), path, ["input_ids", "attention_mask"], ["last_hidden_state"],
            {name: {i: a for a, i in axes.items()} for name in ("input_ids", "attention_mask", "last_hidden_state")})


def _gpt2(path: Path, layers: int, hidden: int, heads: int) -> None:
    import torch  # noqa: PLC0415 - optional: only to build the zoo
    from transformers import GPT2Config, GPT2LMHeadModel  # noqa: PLC0415 - optional: only to build the zoo

    torch.manual_seed(0)
    gpt = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=1024)).eval()

    class Prefill(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gpt = gpt

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            # attention_mask given: without it transformers traces aten::diff, which opset 17 lacks
            return self.gpt(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    ids = torch.zeros(1, 16, dtype=torch.long)
    _export(Prefill(), (ids, torch.ones_like(ids)), path, ["input_ids", "attention_mask"], ["logits"],
            {name: {0: "batch", 1: "seq"} for name in ("input_ids", "attention_mask", "logits")})


def _gpt_kv(path: Path, layers: int, hidden: int, heads: int, vocab: int = 50257, positions: int = 2048) -> None:
    import torch  # noqa: PLC0415 - optional: only to build the zoo

    from bench.nets import CachedDecoder  # noqa: PLC0415 - bench.nets needs torch: only to build the zoo

    torch.manual_seed(0)
    model = CachedDecoder(layers, hidden, heads, vocab=vocab, positions=positions).eval()
    head_dim = hidden // heads
    past = [torch.zeros(1, heads, 8, head_dim) for _ in range(2 * layers)]
    past_names = [f"past_{kind}.{i}" for i in range(layers) for kind in ("key", "value")]
    present_names = [f"present_{kind}.{i}" for i in range(layers) for kind in ("key", "value")]
    axes: dict[str, dict[int, str]] = {"input_ids": {0: "batch"}, "logits": {0: "batch"}}
    axes.update({n: {0: "batch", 2: "past"} for n in past_names})
    axes.update({n: {0: "batch", 2: "total"} for n in present_names})
    _export(model, (torch.zeros(1, 1, dtype=torch.long), *past), path, ["input_ids", *past_names],
            ["logits", *present_names], axes)


def _vit(path: Path, layers: int, hidden: int, heads: int) -> None:
    import torch  # noqa: PLC0415 - optional: only to build the zoo
    from transformers import ViTConfig, ViTModel  # noqa: PLC0415 - optional: only to build the zoo

    torch.manual_seed(0)
    vit = ViTModel(ViTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                             intermediate_size=4 * hidden, image_size=224, patch_size=16),
                   add_pooling_layer=False).eval()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vit = vit

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.vit(pixel_values=pixel_values).last_hidden_state

    _export(Encoder(), (torch.zeros(1, 3, 224, 224),), path, ["pixel_values"], ["last_hidden_state"],
            {"pixel_values": {0: "batch"}, "last_hidden_state": {0: "batch"}})


def _torch_net(path: Path, factory: Callable[[], Any], example_shape: tuple[int, ...],
               dynamic: tuple[str, ...] = ()) -> None:
    """Export a bench.nets image model; `dynamic` names which of (batch, height, width) stay symbolic."""
    import torch  # noqa: PLC0415 - optional: only to build the zoo

    from bench.nets import init_weights  # noqa: PLC0415 - bench.nets needs torch: only to build the zoo

    torch.manual_seed(0)
    model = init_weights(factory())
    axes = {i: name for i, name in ((0, "batch"), (2, "height"), (3, "width")) if name in dynamic}
    out_axes = {0: "batch"} if "batch" in dynamic else {}
    _export(model, (torch.zeros(*example_shape),), path, ["input"], ["output"],
            {"input": axes, "output": out_axes} if axes else None)


def _mlp(path: Path, inputs: int, width: int, depth: int, outputs: int) -> None:
    import torch  # noqa: PLC0415 - optional: only to build the zoo

    from bench.nets import MLP, init_weights  # noqa: PLC0415 - bench.nets needs torch: only to build the zoo

    torch.manual_seed(0)
    _export(init_weights(MLP(inputs, width, depth, outputs)), (torch.zeros(1, inputs),), path, ["input"], ["output"],
            {"input": {0: "batch"}, "output": {0: "batch"}})


def _net(name: str, **kwargs: Any) -> Callable[[], Any]:
    """A factory for a bench.nets class, imported lazily (torch only when building)."""
    def make() -> Any:
        from bench import nets  # noqa: PLC0415 - bench.nets needs torch: only to build the zoo
        return getattr(nets, name)(**kwargs)
    return make


# --- the registry ----------------------------------------------------------------------------------------------------

LIGHT_MODELS = {  # zoo name -> (file in the onnx wheel, input name)
    "alexnet": ("light_bvlc_alexnet.onnx", "data_0"),
    "densenet121": ("light_densenet121.onnx", "data_0"),
    "inception-v1": ("light_inception_v1.onnx", "data_0"),
    "inception-v2": ("light_inception_v2.onnx", "data_0"),
    "resnet50": ("light_resnet50.onnx", "gpu_0/data_0"),
    "shufflenet": ("light_shufflenet.onnx", "gpu_0/data_0"),
    "squeezenet": ("light_squeezenet.onnx", "data_0"),
    "vgg19": ("light_vgg19.onnx", "data_0"),
    "zfnet512": ("light_zfnet512.onnx", "gpu_0/data_0"),
}

BERT_SIZES = {"tiny": (2, 128, 2), "mini": (4, 256, 4), "small": (4, 512, 8), "base": (12, 768, 12)}
GPT2_SIZES = {"tiny": (4, 256, 4), "distil": (6, 768, 12), "small": (12, 768, 12)}
VIT_SIZES = {"tiny": (12, 192, 3), "small": (12, 384, 6), "base": (12, 768, 12)}
WIDE_VOCAB, WIDE_VOCAB_DECODER = 151936, (4, 896, 14)  # Qwen2.5-0.5B's vocabulary, width and heads; 4 layers


def _image(batch: int, height: int, width: int) -> dict[str, InputSpec]:
    return {"input": InputSpec((batch, 3, height, width), "float32")}


def _tokens(batch: int, seq: int) -> dict[str, InputSpec]:
    return {"input_ids": InputSpec((batch, seq), "int64"), "attention_mask": InputSpec((batch, seq), "int64")}


def _build_zoo() -> list[ZooModel]:
    zoo: list[ZooModel] = []
    for name, (source, input_name) in LIGHT_MODELS.items():
        zoo.append(ZooModel(name, "onnx-light", source, {input_name: InputSpec((1, 3, 224, 224), "float32")},
                            functools.partial(_copy_light, source)))

    bert_cases = {"tiny": [(1, 32), (1, 128), (4, 128)], "mini": [(1, 128), (4, 384)],
                  "small": [(1, 32), (1, 128), (1, 384)], "base": [(1, 128), (1, 384), (4, 384)]}
    for size, cases in bert_cases.items():
        build = functools.partial(_bert, **dict(zip(("layers", "hidden", "heads"), BERT_SIZES[size], strict=True)))
        for batch, seq in cases:
            zoo.append(ZooModel(f"bert-{size}-b{batch}-s{seq}", "encoder", f"bert-{size}.onnx", _tokens(batch, seq),
                                build))

    gpt_cases = {"tiny": [32, 256], "distil": [1, 64, 256], "small": [1, 512]}
    for size, seqs in gpt_cases.items():
        build = functools.partial(_gpt2, **dict(zip(("layers", "hidden", "heads"), GPT2_SIZES[size], strict=True)))
        for seq in seqs:
            label = "step-nocache" if seq == 1 else f"prefill-s{seq}"
            zoo.append(ZooModel(f"gpt2-{size}-{label}", "decoder", f"gpt2-{size}.onnx", _tokens(1, seq), build))

    layers, hidden, heads = GPT2_SIZES["distil"]
    for past in (128, 1023):
        inputs = {"input_ids": InputSpec((1, 1), "int64")}
        for i in range(layers):
            for kind in ("key", "value"):
                inputs[f"past_{kind}.{i}"] = InputSpec((1, heads, past, hidden // heads), "float32")
        zoo.append(ZooModel(f"gpt2-distil-step-kv{past}", "decoder", "gpt2-distil-kv.onnx", inputs,
                            functools.partial(_gpt_kv, layers=layers, hidden=hidden, heads=heads)))

    # Decode steps of a 152k-token vocabulary (Qwen2.5's) at several contexts: memory-bound, the float32 LM head
    # alone streams 545 MB a step, more than the blocks and the KV cache together (a 2,048-token past: 29 MB).
    layers, hidden, heads = WIDE_VOCAB_DECODER
    for context in (128, 1024, 4096):
        inputs = {"input_ids": InputSpec((1, 1), "int64")}
        for i in range(layers):
            for kind in ("key", "value"):
                inputs[f"past_{kind}.{i}"] = InputSpec((1, heads, context - 1, hidden // heads), "float32")
        zoo.append(ZooModel(f"gpt-vocab152k-step-ctx{context}", "decoder", "gpt-vocab152k-kv.onnx", inputs,
                            functools.partial(_gpt_kv, layers=layers, hidden=hidden, heads=heads,
                                              vocab=WIDE_VOCAB, positions=4096)))

    vit_cases = {"tiny": [1, 8], "small": [1], "base": [1]}
    for size, batches in vit_cases.items():
        build = functools.partial(_vit, **dict(zip(("layers", "hidden", "heads"), VIT_SIZES[size], strict=True)))
        for batch in batches:
            zoo.append(ZooModel(f"vit-{size}-b{batch}", "vit", f"vit-{size}.onnx",
                                {"pixel_values": InputSpec((batch, 3, 224, 224), "float32")}, build))

    cnn_files: list[tuple[str, str, Callable[[], Any], tuple[str, ...], list[tuple[int, int, int]]]] = [
        # (case prefix, file, factory, symbolic dims, [(batch, height, width)])
        ("mobilenetv2", "mobilenetv2-w1.0.onnx", _net("MobileNetV2", width=1.0), ("batch", "height", "width"),
         [(1, 224, 224), (8, 224, 224), (1, 160, 160)]),
        ("mobilenetv2-w0.5", "mobilenetv2-w0.5.onnx", _net("MobileNetV2", width=0.5), (), [(1, 224, 224)]),
        ("resnet18", "resnet18.onnx", _net("ResNet18"), ("batch", "height", "width"),
         [(1, 224, 224), (4, 224, 224), (1, 112, 112)]),
        ("efficientnet-b0", "efficientnet-b0.onnx", _net("EfficientNet"), ("height", "width"),
         [(1, 224, 224), (1, 256, 256)]),
        ("unet", "unet.onnx", _net("UNet", base=16), ("height", "width"),
         [(1, 144, 256), (1, 256, 256), (1, 288, 512), (1, 720, 1280)]),
    ]
    for prefix, file, factory, dynamic, cases in cnn_files:
        family = "segmentation" if prefix == "unet" else "cnn"
        example = cases[0] if not dynamic else (1, 224, 224) if prefix != "unet" else (1, 64, 64)
        build = functools.partial(_torch_net, factory=factory, example_shape=(example[0], 3, *example[1:]),
                                  dynamic=dynamic)
        for batch, height, width in cases:
            zoo.append(ZooModel(f"{prefix}-b{batch}-{width}x{height}", family, file, _image(batch, height, width),
                                build))

    for height, width in ((144, 256), (256, 256), (288, 512)):
        build = functools.partial(_torch_net, factory=_net("DeepLabLite"), example_shape=(1, 3, height, width))
        zoo.append(ZooModel(f"deeplab-lite-b1-{width}x{height}", "segmentation", f"deeplab-lite-{width}x{height}.onnx",
                            _image(1, height, width), build))

    for height, width in ((360, 640), (448, 800), (576, 1024)):  # channels-last: a Transpose pair per layer
        image = {"image": InputSpec((1, height, width, 3), "float32")}
        zoo.append(ZooModel(f"webnn-blur-segmenter-{width}x{height}", "webnn-nhwc",
                            f"webnn-blur-segmenter-{width}x{height}.onnx", image,
                            functools.partial(_webnn, source=EXAMPLES / "blur_segmenter.webnn", inputs=image)))

    mlp_cases = {(784, 256, 3, 10): [1, 256], (1024, 1024, 4, 1000): [1, 32, 256], (4096, 4096, 3, 4096): [1, 64]}
    for (n_in, width, depth, n_out), batches in mlp_cases.items():
        build = functools.partial(_mlp, inputs=n_in, width=width, depth=depth, outputs=n_out)
        for batch in batches:
            zoo.append(ZooModel(f"mlp-{width}x{depth}-b{batch}", "mlp", f"mlp-{n_in}-{width}x{depth}-{n_out}.onnx",
                                {"input": InputSpec((batch, n_in), "float32")}, build))
    return zoo


ZOO: list[ZooModel] = _build_zoo()
BY_NAME: dict[str, ZooModel] = {m.name: m for m in ZOO}


def build_all(models: list[ZooModel] | None = None, cache_dir: Path = CACHE_DIR, rebuild: bool = False,
              log: Callable[[str], None] = print) -> float:
    """Build the missing files of `models` (default: the whole zoo; each shared file once); returns the seconds."""
    start = time.perf_counter()
    done: set[str] = set()
    for model in ZOO if models is None else models:
        if model.file in done:
            continue
        done.add(model.file)
        if rebuild or not (cache_dir / model.file).exists():
            t = time.perf_counter()
            model.path(cache_dir, rebuild=rebuild)
            log(f"built {model.file} in {time.perf_counter() - t:.1f} s")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rebuild", action="store_true", help="rebuild every file")
    args = parser.parse_args(argv)
    seconds = build_all(rebuild=args.rebuild)
    for model in ZOO:
        shapes = ", ".join(f"{k}={'x'.join(map(str, v.shape))}" for k, v in list(model.inputs.items())[:2])
        more = f" (+{len(model.inputs) - 2} inputs)" if len(model.inputs) > 2 else ""
        print(f"{model.name:34} {model.family:13} {model.file:28} {shapes}{more}")
    print(f"{len(ZOO)} models in {len({m.file for m in ZOO})} files; built in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
