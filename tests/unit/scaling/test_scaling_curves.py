"""Hand-computed values of the curve formulas (spec §1.1, §1.7)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_allclose

from scalerl.scaling import SigmoidFit, linearised_efficiency, power_law, sigmoid


def test_sigmoid_hand_values() -> None:
    # A=0.6, B=2, C_mid=100, R0=0.2:
    #   C=100: (C_mid/C)^B = 1      → 0.2 + 0.4/2    = 0.40
    #   C=200: (1/2)^2 = 0.25       → 0.2 + 0.4/1.25 = 0.52
    #   C=50:  2^2 = 4              → 0.2 + 0.4/5    = 0.28
    #   C=0:   limit                → R0             = 0.20
    got = sigmoid([0.0, 50.0, 100.0, 200.0], A=0.6, B=2.0, C_mid=100.0, R0=0.2)
    assert_allclose(got, [0.20, 0.28, 0.40, 0.52], rtol=0, atol=1e-12)


def test_sigmoid_matches_naive_formula_and_saturates() -> None:
    c = np.geomspace(1e-3, 1e6, 50)
    a, b, cm, r0 = 0.645, 1.7, 10909.0, 0.3
    naive = r0 + (a - r0) / (1 + (cm / c) ** b)
    assert_allclose(sigmoid(c, A=a, B=b, C_mid=cm, R0=r0), naive, rtol=1e-12)
    assert sigmoid(1e12, A=a, B=b, C_mid=cm, R0=r0) == pytest.approx(a, abs=1e-9)


def test_power_law_hand_values() -> None:
    # A=0.8, D=2, B=0.5: C=4 → 0.8 − 2/2 = −0.2; C=100 → 0.8 − 2/10 = 0.6
    assert_allclose(power_law([4.0, 100.0], A=0.8, B=0.5, D=2.0), [-0.2, 0.6], atol=1e-12)


def test_linearised_efficiency_is_c_to_the_b_on_the_curve() -> None:
    a, b, cm, r0 = 0.61, 1.92, 2542.0, 0.3
    c = np.geomspace(100, 20000, 30)
    f = linearised_efficiency(sigmoid(c, A=a, B=b, C_mid=cm, R0=r0), A=a, B=b, C_mid=cm, R0=r0)
    assert_allclose(f, c**b, rtol=1e-8)
    slope = np.polyfit(np.log(c), np.log(f), 1)[0]
    assert slope == pytest.approx(b, rel=1e-9)


def test_linearised_efficiency_outside_range_is_nan() -> None:
    f = linearised_efficiency([0.2, 0.3, 0.7], A=0.6, B=2.0, C_mid=100.0, R0=0.3)
    assert np.isnan(f).all()


def test_sigmoid_fit_predict_and_frozen() -> None:
    fit = SigmoidFit(A=0.6, B=2.0, C_mid=100.0, R0=0.2, n_points=5, sse=0.0, r2=1.0)
    assert_allclose(fit.predict([100.0, 200.0]), [0.40, 0.52], atol=1e-12)
    assert fit.predict(100.0).shape == ()
    with pytest.raises(AttributeError):
        fit.A = 0.7  # type: ignore[misc]
    assert fit.to_dict()["C_mid"] == 100.0
