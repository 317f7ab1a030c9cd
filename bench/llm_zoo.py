"""The LLM benchmark's model zoo: small language models built by onnxruntime-genai's model builder.

Each family is a Hugging Face config written here (the shape of a published model, or a
smaller model of that architecture), given random weights by `transformers` (nothing is
downloaded from any hub) and a minimal WordLevel tokenizer made with `tokenizers` (the builder
wants one in its input folder). onnxruntime-genai's builder then writes the ONNX graph
(`model.onnx`, weights in `model.onnx.data` beside it, never read by the estimator) and
`genai_config.json`, for each precision, under bench/.cache/llm/<family>/<precision>/. Built
once, then cached; the random checkpoint is deleted once every precision is built.

Biases are random, not zero: the builder drops all-zero biases (Qwen's q/k/v biases would vanish).

    python -m bench.llm_zoo                 # build what is missing, list the zoo
    python -m bench.llm_zoo --rebuild qwen  # rebuild the families matching a regex
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CACHE_DIR = Path(__file__).resolve().parent / ".cache" / "llm"
PRECISIONS = ("int4", "fp32")


@dataclass(frozen=True)
class Family:
    """One architecture: a transformers model type and its config (the builder reads both)."""

    name: str
    model_type: str
    config: dict[str, Any]
    about: str
    precisions: tuple[str, ...] = PRECISIONS
    # onnxruntime-genai builder extra options (key=value), e.g. {"int4_block_size": "128"}
    extra: dict[str, str] = field(default_factory=dict)

    def folder(self, precision: str, cache_dir: Path = CACHE_DIR) -> Path:
        return cache_dir / self.name / precision

    def model_path(self, precision: str, cache_dir: Path = CACHE_DIR) -> Path:
        return self.folder(precision, cache_dir) / "model.onnx"


FAMILIES: tuple[Family, ...] = (
    Family("qwen2.5-0.5b", "qwen2", dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
        rms_norm_eps=1e-6, tie_word_embeddings=True),
        "Qwen2.5-0.5B's shape: 24 layers, 14 query / 2 KV heads of 64, tied 152k vocabulary"),
    Family("llama-smollm2-360m", "llama", dict(
        hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
        num_key_value_heads=5, vocab_size=49152, max_position_embeddings=8192, rope_theta=1e5,
        rms_norm_eps=1e-5, tie_word_embeddings=True),
        "SmolLM2-360M's shape (Llama architecture): 32 layers, 15 / 5 heads of 64"),
    Family("phi3-small-12l", "phi3", dict(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=16,
        num_key_value_heads=16, vocab_size=32064, max_position_embeddings=4096, original_max_position_embeddings=4096,
        rope_theta=1e4, rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=0),
        "Phi-3 architecture (fused qkv and gate/up weights, 16 heads without GQA), 12 layers of 1024"),
    Family("gemma-small-8l", "gemma", dict(
        hidden_size=1024, intermediate_size=4096, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, vocab_size=65536, max_position_embeddings=8192,
        rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True),
        "Gemma architecture (one KV head, heads of 256, GELU-tanh MLP, scaled embedding), 8 layers of 1024"),
)


def family(name: str) -> Family:
    for f in FAMILIES:
        if f.name == name:
            return f
    raise KeyError(name)


# --- building -------------------------------------------------------------------------------------------------------

def _checkpoint(fam: Family, target: Path) -> None:
    """A random-weight Hugging Face checkpoint of the family's config, plus a tokenizer, in `target`."""
    import torch  # noqa: PLC0415 - optional: only to build the zoo
    from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: PLC0415 - optional: only to build the zoo
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: PLC0415 - optional: only to build the zoo

    torch.manual_seed(0)
    config = AutoConfig.for_model(fam.model_type, **fam.config)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.02)  # the builder drops all-zero biases
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    vocab = {f"t{i}": i for i in range(config.vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0", bos_token="t2", eos_token="t1",
                            pad_token="t0").save_pretrained(tmp)
    tmp.replace(target)


def build(fam: Family, precision: str, cache_dir: Path = CACHE_DIR, log: Any = None) -> Path:
    """The family's model.onnx at `precision`, built first when missing."""
    out = fam.folder(precision, cache_dir)
    path = out / "model.onnx"
    if path.exists():
        return path
    hf = cache_dir / fam.name / "hf"
    if not (hf / "config.json").exists():
        if log:
            log(f"{fam.name}: random checkpoint")
        hf.parent.mkdir(parents=True, exist_ok=True)
        _checkpoint(fam, hf)
    if log:
        log(f"{fam.name}: onnxruntime-genai builder, {precision}")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(tmp),
               "-p", precision, "-e", "cpu", "-c", str(cache_dir / fam.name / "builder-cache")]
    if fam.extra:
        command += ["--extra_options", *(f"{k}={v}" for k, v in fam.extra.items())]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0 or not (tmp / "model.onnx").exists():
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"the builder failed for {fam.name} {precision}:\n{tail}")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    shutil.rmtree(cache_dir / fam.name / "builder-cache", ignore_errors=True)
    if all(fam.model_path(p, cache_dir).exists() for p in fam.precisions):
        shutil.rmtree(hf, ignore_errors=True)  # gigabytes of random weights, no longer needed
    return path


def build_all(families: list[Family] | tuple[Family, ...] = FAMILIES, log: Any = None) -> float:
    """Build every missing model; returns the seconds spent."""
    start = time.perf_counter()
    for fam in families:
        for precision in fam.precisions:
            build(fam, precision, log=log)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the LLM zoo with onnxruntime-genai's model builder.")
    parser.add_argument("--rebuild", metavar="REGEX", help="rebuild the families whose name matches")
    args = parser.parse_args(argv)
    if args.rebuild:
        for fam in FAMILIES:
            if re.search(args.rebuild, fam.name):
                for precision in fam.precisions:
                    shutil.rmtree(fam.folder(precision), ignore_errors=True)
    seconds = build_all(log=lambda line: print(line, file=sys.stderr, flush=True))
    for fam in FAMILIES:
        for precision in fam.precisions:
            folder = fam.folder(precision)
            data = sum(p.stat().st_size for p in folder.glob("*.data"))
            config = json.loads((folder / "genai_config.json").read_text())["model"]
            print(f"{fam.name:22} {precision:5} {data / 1e6:8.0f} MB of weights  {config['type']:7}  {fam.about}")
    print(f"({seconds:.0f} s building)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
