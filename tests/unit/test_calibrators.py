"""Calibrators against independent NumPy oracles, the registry, plugins and config validation."""
from __future__ import annotations

import dataclasses
import json
import textwrap
import warnings
from collections import Counter

import numpy as np
import pytest
from scipy.stats import entropy as scipy_entropy

from quantdbg import _calibrator_specs as specs
from quantdbg.calibration.calibrators import (
    Calibrator,
    EntropyConfig,
    MinMaxConfig,
    MseConfig,
    PercentileConfig,
    TensorRange,
    available_calibrators,
    base,
    calibrator,
    get_calibrator,
    register_calibrator,
)
from quantdbg.calibration.calibrators.calibrator import best_candidate
from quantdbg.calibration.calibrators.entropy import entropy_divergences
from quantdbg.calibration.calibrators.mse import mse_errors
from quantdbg.calibration.calibrators.percentile import percentile_edge
from quantdbg.calibration.stats import TensorCollector, TensorStats
from quantdbg.config import CalibConfig, CalibratorChoice
from quantdbg.errors import ConfigError, FormatError, QuantDbgWarning


def _stats(values: np.ndarray, num_bins: int = 2048, name: str = "t") -> TensorStats:
    collector = TensorCollector(name, histogram=True, num_bins=num_bins)
    collector.update(values.astype(np.float32))
    return collector.result()


def _samples(kind: str, rng: np.random.Generator, n: int = 200_000) -> np.ndarray:
    if kind == "relu":
        return np.maximum(rng.standard_normal(n), 0)
    if kind == "laplace":
        return rng.laplace(size=n)
    if kind == "outliers":
        return np.concatenate([rng.standard_normal(n), rng.standard_normal(20) * 40])
    return np.round(rng.standard_normal(n) * 20) / 4  # "discrete": many empty bins between values


# --- pytorch-quantization's entropy, transcribed as a plain per-candidate loop -------------------

def _oracle_entropy(calib_hist: np.ndarray, calib_bin_edges: np.ndarray, start_bin: int = 128):
    """pytorch_quantization.calib.histogram._compute_amax_entropy (num_bits=8, signed, stride 1)."""
    bins = calib_hist.astype(np.int64).copy()
    bins[0] = bins[1]
    nbins = 128
    divergences = []
    for i in range(start_bin, len(bins) + 1):
        space = np.linspace(0, i, num=nbins + 1)
        digitized_space = np.digitize(range(i), space) - 1
        digitized_space[bins[:i] == 0] = -1
        new_density_counts = np.zeros(nbins, dtype=np.float64)
        for idx, digitized in enumerate(digitized_space):
            if digitized != -1:
                new_density_counts[digitized] += bins[idx]
        counter = Counter(digitized_space.tolist())
        for key, val in counter.items():
            if key != -1:
                new_density_counts[key] = new_density_counts[key] / val
        new_density = np.zeros(i, dtype=np.float64)
        for idx, digitized in enumerate(digitized_space):
            if digitized != -1:
                new_density[idx] = new_density_counts[digitized]
        reference_density = np.array(bins[:len(digitized_space)], dtype=np.float64)
        reference_density[-1] += np.sum(bins[i:])
        divergences.append(scipy_entropy(reference_density, new_density))
    divergences = np.array(divergences)
    last_argmin = len(divergences) - 1 - np.argmin(divergences[::-1])
    return divergences, calib_bin_edges[last_argmin + start_bin]


@pytest.mark.parametrize("kind", ["relu", "laplace", "outliers", "discrete"])
def test_entropy_matches_pytorch_quantization_loop(kind, rng):
    values = np.abs(_samples(kind, rng, 50_000))
    counts, edges = np.histogram(values, bins=384, range=(0, values.max()))
    want_div, want_amax = _oracle_entropy(counts, edges)
    cand, got_div = entropy_divergences(counts, 128)
    assert np.array_equal(np.isinf(got_div), np.isinf(want_div))
    finite = np.isfinite(want_div)
    np.testing.assert_allclose(got_div[finite], want_div[finite], rtol=1e-9, atol=1e-12)
    assert edges[best_candidate(cand, got_div)] == want_amax


def test_entropy_calibrator_uses_its_binned_histogram(rng):
    s = _stats(_samples("relu", rng), num_bins=256)
    hist = s.binned(256)
    _, want = _oracle_entropy(hist.counts, hist.edges)
    got = get_calibrator("entropy").compute(s)
    assert got == TensorRange("t", -min(want, s.absmax), min(want, s.absmax), "entropy")


@pytest.mark.parametrize("start_bin", [128, 200])
def test_entropy_equals_the_loop_on_random_histograms(start_bin, rng):
    # Arbitrary counts, not a smooth distribution: runs of empty bins, a few huge bins, a clipped
    # tail, so every branch of the prefix-sum formulation (empty levels, P > 0 where Q = 0) is hit.
    for n in (256, 301, 400):
        counts = rng.poisson(rng.uniform(0, 50, n)) * (rng.random(n) > 0.3)
        counts[rng.integers(0, n, 3)] += rng.integers(1_000, 100_000, 3)
        counts[-1] = max(counts[-1], 1)  # the last bin holds max|x|
        edges = np.arange(n + 1, dtype=np.float64) * 0.25
        want_div, want_amax = _oracle_entropy(counts, edges, start_bin)
        cand, got_div = entropy_divergences(counts, start_bin)
        assert cand.tolist() == list(range(start_bin, n + 1))
        assert np.array_equal(np.isinf(got_div), np.isinf(want_div))
        finite = np.isfinite(want_div)
        np.testing.assert_allclose(got_div[finite], want_div[finite], rtol=1e-9, atol=1e-12)
        assert edges[best_candidate(cand, got_div)] == want_amax


# --- percentile --------------------------------------------------------------------------------

@pytest.mark.parametrize("pct", [99.0, 99.99, 100.0])
def test_percentile_matches_loop_oracle_and_raw_percentile(pct, rng):
    raw = _samples("outliers", rng)
    s = _stats(raw)
    hist = s.binned(2048)
    cumulative, index = 0, None
    for i, c in enumerate(hist.counts):  # oracle: first bin where the running count reaches pct
        cumulative += int(c)
        if cumulative >= hist.counts.sum() * pct / 100:
            index = i
            break
    assert percentile_edge(hist.counts, pct) == index + 1
    amax = get_calibrator(PercentileConfig(pct)).compute(s).amax
    assert amax == min((index + 1) * hist.width, s.absmax)
    assert abs(amax - np.percentile(np.abs(raw.astype(np.float32)), pct)) <= hist.width
    if pct == 100.0:
        assert amax == s.absmax


@pytest.mark.parametrize("bad", [50, 49.9, 100.01, -1, True, "99"])
def test_percentile_config_is_validated(bad):
    with pytest.raises(ConfigError, match=r"percentile must be in \(50, 100\]"):
        PercentileConfig(bad)


# --- mse ---------------------------------------------------------------------------------------

def _oracle_mse(counts: np.ndarray, start_bin: int) -> np.ndarray:
    """The documented error model by brute force: midpoint quadrature in every bin it integrates."""
    errors = []
    u = (np.arange(1000) + 0.5) / 1000  # quadrature points within one bin
    for k in range(start_bin, len(counts) + 1):
        step = k / 127
        total = 0.0
        for j, c in enumerate(counts):
            if j >= k:
                total += c * np.mean((j + u - k) ** 2)
            elif j < np.ceil(step / 2):
                v = j + u
                total += c * np.mean((v - step * np.floor(v / step + 0.5)) ** 2)
            else:
                total += c * step * step / 12
        errors.append(total)
    return np.array(errors)


@pytest.mark.parametrize("kind", ["relu", "outliers"])
def test_mse_matches_brute_force_model(kind, rng):
    counts = np.histogram(np.abs(_samples(kind, rng, 20_000)), bins=300)[0]
    cand, got = mse_errors(counts, 2)
    np.testing.assert_allclose(got, _oracle_mse(counts, 2), rtol=1e-6)
    assert cand[0] == 2 and cand[-1] == 300


@pytest.mark.parametrize("kind", ["relu", "laplace", "outliers"])
def test_mse_threshold_is_near_the_empirical_optimum(kind, rng):
    raw = _samples(kind, rng, 100_000).astype(np.float32)
    s = _stats(raw)
    amax = get_calibrator(MseConfig(start_bin=16)).compute(s).amax

    def fake_quant_mse(t: float) -> float:  # what INT8 Q/DQ really does to the raw values
        step = t / 127
        return float(np.mean((raw - np.clip(np.round(raw / step), -127, 127) * step) ** 2))

    grid = np.linspace(s.absmax / 128, s.absmax, 400)
    best = min(fake_quant_mse(t) for t in grid)
    assert fake_quant_mse(amax) <= 1.05 * best


# --- minmax, degenerate tensors, num_bins -------------------------------------------------------

def test_minmax_is_max_abs(rng):
    raw = rng.standard_normal(1000).astype(np.float32) - 3
    got = get_calibrator("minmax").compute(_stats(raw))
    assert got.amax == np.abs(raw).max() and got.lo == -got.hi and got.method == "minmax"


@pytest.mark.parametrize("method", ["minmax", "entropy", "percentile", "mse"])
@pytest.mark.parametrize("values", [np.zeros(10), np.array([np.nan, np.inf])])
def test_degenerate_tensor_gets_defined_range_and_warning(method, values):
    s = _stats(values, name="dead")
    with pytest.warns(QuantDbgWarning, match="Tensor 'dead' had (only zeros|no finite values)"):
        got = get_calibrator(method).compute(s)
    assert (got.lo, got.hi) == (-calibrator.ZERO_TENSOR_AMAX, calibrator.ZERO_TENSOR_AMAX)


def test_calibrator_num_bins_overrides_collected_resolution(rng):
    s = _stats(_samples("outliers", rng), num_bins=2048)
    coarse = get_calibrator(PercentileConfig(99.9, num_bins=64)).compute(s).amax
    hist = s.binned(64)
    assert coarse == min(percentile_edge(hist.counts, 99.9) * hist.width, s.absmax)


@pytest.mark.parametrize("make", [lambda: EntropyConfig(start_bin=64), lambda: EntropyConfig(num_bins=128),
                                  lambda: EntropyConfig(num_bins=256, start_bin=256),
                                  lambda: MseConfig(start_bin=0), lambda: MseConfig(num_bins=1)])
def test_histogram_configs_are_validated(make):
    with pytest.raises(ConfigError):
        make()


# --- registry ----------------------------------------------------------------------------------

def test_builtins_are_registered_and_built_from_names_or_configs():
    assert {"minmax", "entropy", "percentile", "mse"} <= set(available_calibrators())
    assert get_calibrator("percentile").config == PercentileConfig()
    cal = get_calibrator(PercentileConfig(99.9))
    assert cal.name == "percentile" and cal.config.percentile == 99.9
    assert get_calibrator(MinMaxConfig()).name == "minmax"


def test_unknown_name_suggests_close_matches():
    with pytest.raises(ConfigError, match=r"No calibrator named 'entropi'\. Did you mean 'entropy'\?"):
        get_calibrator("entropi")


def test_unregistered_config_and_bad_spec_are_refused():
    @dataclasses.dataclass(frozen=True)
    class Stray:
        pass

    with pytest.raises(ConfigError, match="Stray is not the config of any registered calibrator"):
        get_calibrator(Stray())
    with pytest.raises(ConfigError, match="registered name or a config instance, got dict"):
        get_calibrator({"method": "entropy"})


def test_the_built_in_calibrators_are_the_registrys_static_table():
    # the registry lists the built-ins itself (no import of the calibrators package fills it), and
    # each one agrees with the spec table that configs are read with
    assert {cls.name for cls in base.BUILTINS} == {"entropy", "minmax", "mse", "percentile"}
    for cls in base.BUILTINS:
        assert specs.spec_config(cls.name) is cls.config_class
        assert type(get_calibrator(cls.name)) is cls
        assert type(get_calibrator(cls.config_class())) is cls


def _private_registries(monkeypatch):
    """Registrations in a test stay in that test."""
    monkeypatch.setattr(base, "_IMPLS", dict(base._IMPLS))
    monkeypatch.setattr(specs, "_SPECS", dict(specs._SPECS))


def test_name_and_config_cannot_be_registered_twice(monkeypatch):
    _private_registries(monkeypatch)
    with pytest.raises(ConfigError, match="'entropy' is already registered"):
        @register_calibrator("entropy", config=MinMaxConfig)
        class Other(Calibrator):
            pass
    with pytest.raises(ConfigError, match="MinMaxConfig already configures calibrator 'minmax'"):
        @register_calibrator("minmax2", config=MinMaxConfig)
        class Other2(Calibrator):
            pass


def test_spec_json_round_trip():
    for spec in ("mse", PercentileConfig(99.5, 512), EntropyConfig(start_bin=256), MseConfig()):
        data = json.loads(json.dumps(CalibConfig(method=spec).to_dict()))
        again = CalibConfig.from_dict(data).method
        assert again == spec and type(again) is type(spec)
    assert CalibConfig(PercentileConfig(99.5, 512)).to_dict()["method"] == {
        "calibrator": "percentile", "config": {"percentile": 99.5, "num_bins": 512}}
    assert CalibConfig("mse").to_dict()["method"] == {"calibrator": "mse", "config": None}


def test_spec_errors_name_the_spec_or_the_field():
    with pytest.raises(ConfigError, match=r"^No calibrator named 'msee'\. Did you mean 'mse'\?"):
        CalibConfig("msee").to_dict()
    data = CalibConfig(per_op={"Conv": "mse"}).to_dict()
    data["per_op"][0][1] = CalibratorChoice("msee").to_dict()
    with pytest.raises(FormatError) as err:
        CalibConfig.from_dict(data)
    assert "field 'per_op[0][1]': No calibrator named 'msee'. Did you mean 'mse'?" in str(err.value)
    data = CalibConfig().to_dict()
    data["method"] = {"calibrator": "percentile", "config": {"percentile": 20.0}}
    with pytest.raises(FormatError) as err:
        CalibConfig.from_dict(data)
    assert str(err.value).endswith("field 'method.config': PercentileConfig.percentile must be in (50, 100], "
                                   "got 20.0.")


def test_entry_point_plugins_load_lazily(tmp_path, monkeypatch, rng):
    (tmp_path / "quantdbg_halfmax_plugin.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass
        from quantdbg.calibration.calibrators import Calibrator, register_calibrator

        @dataclass(frozen=True)
        class HalfMaxConfig:
            pass

        @register_calibrator("halfmax", config=HalfMaxConfig)
        class HalfMax(Calibrator):
            def compute_amax(self, stats):
                return stats.absmax / 2
    """))
    dist = tmp_path / "quantdbg_halfmax_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: quantdbg-halfmax-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[quantdbg.calibrators]\nhalfmax = quantdbg_halfmax_plugin:HalfMax\n"
        "broken = quantdbg_no_such_module:Nope\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _private_registries(monkeypatch)
    monkeypatch.setattr(specs, "_PLUGINS_LOADED", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cal = get_calibrator("halfmax")
    assert any("plugin 'broken'" in str(w.message) and w.category is QuantDbgWarning for w in caught)
    raw = rng.standard_normal(100).astype(np.float32)
    assert cal.compute(_stats(raw)).amax == pytest.approx(np.abs(raw).max() / 2)
