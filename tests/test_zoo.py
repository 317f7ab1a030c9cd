"""The accuracy zoo builds real models that the importer reads, and the ground-truth harness times them."""

from __future__ import annotations

import onnx
import pytest

from agent import calibration_store
from bench import groundtruth, support, zoo
from monitors.graphs.importer import load_graph
from monitors.speed.present import AT_REST, MEASURED_WEIGHT, MEMORY_NOISE
from probes.calibration import Calibration
from probes.refresh import HANDOFF_KEY, HANDOFF_MB, LOCKSTEP_KEY, STREAM_KEY


def test_zoo_entries_are_unique_and_fully_bound() -> None:
    names = [m.name for m in zoo.ZOO]
    assert len(names) == len(set(names))
    assert 40 <= len(names) <= 70
    for model in zoo.ZOO:
        assert model.inputs, model.name
        for spec in model.inputs.values():
            assert spec.shape and all(d > 0 for d in spec.shape), model.name
            assert spec.dtype in ("float32", "int64"), model.name


def test_light_squeezenet_copies_and_imports(tmp_path) -> None:
    model = zoo.BY_NAME["squeezenet"]
    path = model.path(tmp_path)
    assert path.parent == tmp_path and path.exists()
    graph = load_graph(path, inputs=model.inputs)
    output = graph.model.graph.output[0].name
    assert graph.tensors[output].shape[:2] == (1, 1000)


def test_mlp_exported_with_symbolic_batch_binds_to_the_zoo_shape(tmp_path) -> None:
    pytest.importorskip("torch")
    model = zoo.BY_NAME["mlp-256x3-b256"]
    path = model.path(tmp_path)
    proto = onnx.load(str(path))
    assert proto.ir_version <= zoo.MAX_IR_VERSION
    assert [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [zoo.OPSET]
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    graph = load_graph(path, inputs=model.inputs)
    assert graph.tensors[proto.graph.output[0].name].shape == (256, 10)


def test_groundtruth_times_in_a_subprocess_and_caches(tmp_path) -> None:
    model = zoo.BY_NAME["squeezenet"]
    path = model.path(tmp_path)
    cache = tmp_path / "gt.json"
    first = groundtruth.measure(path, model.inputs, repeats=5, target_s=0.05, cache_file=cache)
    assert not first["cached"] and first["repeats"] >= 5 and first["median_ms"] > 0
    # the warm refresh the agent would have taken then, all three probes
    assert all(first["probe"][k] > 0 for k in (LOCKSTEP_KEY, HANDOFF_KEY, STREAM_KEY))
    again = groundtruth.measure(path, model.inputs, repeats=5, target_s=0.05, cache_file=cache)
    assert again["cached"] and again["median_ms"] == first["median_ms"]
    other = {name: type(spec)((2, *spec.shape[1:]), spec.dtype) for name, spec in model.inputs.items()}
    assert groundtruth.cache_key(path, other) != groundtruth.cache_key(path, model.inputs)


def test_groundtruth_rounds_spread_over_all_models_keep_each_ones_lowest_median(tmp_path) -> None:
    jobs = [(m.path(tmp_path), m.inputs) for m in (zoo.BY_NAME["squeezenet"], zoo.BY_NAME["shufflenet"])]
    cache = tmp_path / "gt.json"
    lines: list[str] = []
    groundtruth.measure_spread(jobs, rounds=2, repeats=5, target_s=0.02, cache_file=cache, log=lines.append)
    # round by round over both jobs, not one job's rounds back to back
    assert [line.split(" ms")[0].rsplit(" ", 1)[0] for line in lines] == [
        "round 1/2: light_squeezenet.onnx", "round 1/2: light_shufflenet.onnx",
        "round 2/2: light_squeezenet.onnx", "round 2/2: light_shufflenet.onnx"]
    stored = groundtruth.load_cache(cache)
    squeeze = stored[groundtruth.cache_key(*jobs[0])]
    assert squeeze["rounds"] == 2 and stored[groundtruth.cache_key(*jobs[1])]["rounds"] == 2
    medians = [float(line.split()[-2]) for line in lines]
    assert f"{squeeze['median_ms']:.3g}" == f"{min(medians[0], medians[2]):.3g}"
    groundtruth.measure_spread(jobs[:1], rounds=2, cache_file=cache, log=lines.append)
    assert len(lines) == 4  # cached: not measured again without remeasure


def test_groundtruth_present_speed_is_the_agents_answer_from_the_refresh_taken_with_the_truth() -> None:
    reference = {LOCKSTEP_KEY: 1e-3, HANDOFF_KEY: 1e-3, STREAM_KEY: 3e-3}
    # a slow phase: compute 1.44x, handoffs 1 ms more than that explains, memory 1.5x beyond the compute's slowdown
    probe = {LOCKSTEP_KEY: 1.44e-3, HANDOFF_KEY: 1.44e-3 + 1e-3, STREAM_KEY: 1.44 * 1.5 * 3e-3}
    speed = groundtruth.present_speed(probe, reference)
    assert speed.cpu == pytest.approx(1.44 ** MEASURED_WEIGHT, abs=1e-4)  # blended as on a quiet device
    assert speed.handoff_ms_per_mb == pytest.approx(1.0 / HANDOFF_MB, abs=1e-5)
    assert speed.memory == pytest.approx(1.5 / MEMORY_NOISE, abs=1e-4)
    assert groundtruth.present_speed(None, reference) == AT_REST
    assert groundtruth.present_speed(reference, reference).cpu == 1.0


def test_a_benchmark_will_not_score_a_calibration_it_cannot_use_and_leaves_it_in_place(tmp_path, capsys) -> None:
    """The agent's own loading would set such a file aside and calibrate again: a benchmark told to score one
    calibration must not score a new one made unasked."""
    path = calibration_store.calibration_path(tmp_path, "cpu")
    path.parent.mkdir(parents=True, exist_ok=True)
    for text, why in (('{"format": 1}', "calibration format 1"),
                      (Calibration(fingerprint={"device": "cpu", "cpu": "another"}, tables={}, per_kernel_s=0.0,
                                   per_run_s=0.0).to_json(), "made for another device")):
        path.write_text(text)
        with pytest.raises(SystemExit) as exit_:
            support.scored_estimator(tmp_path)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert why in err and "daop-agent calibrate --state-dir" in err and len(err.splitlines()) == 1
        assert path.read_text() == text and not path.with_suffix(".corrupt").exists()
