"""Peak memory and time of importing a 435 MB model without reading its weights.

Two cases, each imported (read_weightless + bind_and_infer) in a fresh
process whose peak RSS (ru_maxrss) is reported:
  absent  - weights as external data in a side file that does not exist
  inline  - 435 MB of weights inline in the .onnx file (random bytes)
and, for scale, `onnx.load` of the inline file.

    .venv/bin/python -m bench.import_memory [--mb 435] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

CHILD = r"""
import json, sys, time

def hwm():  # peak RSS of this process image in KiB (ru_maxrss would carry the forking parent's)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

sys.path.insert(0, {root!r})
import onnx
from monitors.graphs.importer import load_graph
before = hwm()
t0 = time.perf_counter()
if {how!r} == "onnx.load":
    m = onnx.load({path!r})
    result = sum(len(t.raw_data) for t in m.graph.initializer)
else:
    g = load_graph({path!r})
    result = g.weight_bytes
seconds = time.perf_counter() - t0
peak = hwm()
print(json.dumps({{"before_mb": before / 1024, "peak_mb": peak / 1024, "seconds": seconds, "weight_bytes": result}}))
"""


def measure(path: Path, how: str) -> dict:
    code = CHILD.format(root=str(ROOT), path=str(path), how=how)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=435, help="weight megabytes (default 435)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the test models (default: a temp dir)")
    parser.add_argument("--skip-onnx-load", action="store_true", help="do not measure onnx.load for comparison")
    args = parser.parse_args()

    from models import absent_weights_model, write_inline_weights_model  # noqa: PLC0415 - tests/ is on the path only here

    total = args.mb * 1_000_000
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        absent = Path(tmp) / "absent.onnx"
        absent.write_bytes(absent_weights_model(total).SerializeToString())
        inline = write_inline_weights_model(Path(tmp) / "inline.onnx", total, random=True)
        print(f"{'case':<28}{'file MB':>9}{'weights MB':>12}{'RSS before MB':>15}{'peak RSS MB':>13}{'seconds':>9}")
        cases = [("absent weights (load_graph)", absent, "load_graph"),
                 ("inline weights (load_graph)", inline, "load_graph")]
        if not args.skip_onnx_load:
            cases.append(("inline weights (onnx.load)", inline, "onnx.load"))
        for label, path, how in cases:
            r = measure(path, how)
            print(f"{label:<28}{path.stat().st_size / 1e6:>9.1f}{r['weight_bytes'] / 1e6:>12.1f}"
                  f"{r['before_mb']:>15.1f}{r['peak_mb']:>13.1f}{r['seconds']:>9.3f}")


if __name__ == "__main__":
    main()
