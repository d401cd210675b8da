"""The PTD search's forward-cost model (search/ptd.py): linear between measured row counts on an eager target;
on a target whose forwards replay CUDA graphs (model.cuda_graph), a forward costs its padded bucket's rows."""

import pytest

from search.ptd import relative_cost

CURVE = {1: 10.0, 2: 11.0, 4: 12.0, 8: 16.0, 16: 24.0}


def test_an_eager_forward_costs_linearly_between_measured_sizes():
    assert relative_cost(CURVE, 1) == 1.0
    assert relative_cost(CURVE, 3) == pytest.approx(1.15)
    assert relative_cost(CURVE, 5) == pytest.approx(1.3)
    assert relative_cost(CURVE, 32) == pytest.approx(4.0)  # extrapolated from the last two sizes


def test_a_replayed_forward_costs_its_bucket():
    assert relative_cost(CURVE, 3, padded=True) == relative_cost(CURVE, 4) == 1.2
    assert relative_cost(CURVE, 5, padded=True) == relative_cost(CURVE, 8) == 1.6
    assert relative_cost(CURVE, 16, padded=True) == 2.4


def test_the_cost_curve_runs_through_the_replayed_forward():
    from decoding.engine.cuda_graph import GraphReplayer
    from decoding.engine.target import TargetModel
    from pipeline.zoo import random_target
    from search.ptd import forward_cost_curve

    target = TargetModel(random_target("tiny").model, graphs=GraphReplayer(True, "model.cuda_graph", emulate=True))
    curve = forward_cost_curve(target, 20, sizes=(1, 2, 4), repeats=1)
    assert sorted(curve) == [1, 2, 4] and all(ms > 0 for ms in curve.values())
    assert sorted(target.graphs.graphs) == ["target:1", "target:2", "target:4"]
