"""row_argmax equals torch.argmax(-1) exactly: first index of the maximum, ties, NaN, shorter last blocks."""

import pytest
import torch

from decoding.engine.argmax import BLOCK, MIN_WIDTH, row_argmax


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 49152), (40, 49152), (3, 49157), (2, 5, MIN_WIDTH + 1), (MIN_WIDTH,), (7, 300)])
def test_row_argmax_is_argmax_on_random_rows(shape, dtype):
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=gen).to(dtype)
    assert torch.equal(row_argmax(x), x.argmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ties_give_the_first_index_as_argmax_does(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, (64, 3 * BLOCK * 20 + 17), generator=gen).to(dtype)  # every row full of exact ties
    assert torch.equal(row_argmax(x), x.argmax(-1))
    y = torch.zeros(4, 10 * BLOCK + 5, dtype=dtype)
    y[0, [3, BLOCK + 1]] = 1  # two blocks hold the maximum: the first one's index
    y[1, [5 * BLOCK - 1, 5 * BLOCK]] = 1  # the maximum on both sides of a block edge
    y[2, -2:] = 1  # only in the shorter last block, twice
    # row 3: all equal, index 0
    assert row_argmax(y).tolist() == y.argmax(-1).tolist() == [3, 5 * BLOCK - 1, 10 * BLOCK + 3, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_nan_counts_as_the_maximum_as_in_argmax(dtype):
    x = torch.randn(3, 2 * MIN_WIDTH).to(dtype)
    x[0, 5000] = float("nan")
    x[1, [100, 7000]] = float("nan")
    assert torch.equal(row_argmax(x), x.argmax(-1))
    assert row_argmax(x)[:2].tolist() == [5000, 100]


def test_empty_batches_and_narrow_rows_fall_back_to_argmax():
    assert row_argmax(torch.zeros(0, 2 * MIN_WIDTH)).shape == (0,)
    x = torch.randn(5, 64)
    assert torch.equal(row_argmax(x), x.argmax(-1))
