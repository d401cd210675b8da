"""Layer skipping in the target wrapper: subset wrappers (early-exit / slim drafters) with their own
cache, and read-only slim passes over the full model's cache."""

import pytest
import torch

from decoding.engine.target import TargetModel


def all_cache(target):
    return [(layer.keys.clone(), layer.values.clone()) for layer in target.cache.layers if layer.keys is not None]


def test_layer_loop_with_no_layer_skipped_equals_the_model_forward(tiny_target):
    target = tiny_target
    target.prefill([10, 11, 12, 13])
    ref = target.forward(torch.tensor([14, 15, 16]), torch.arange(3), None)
    ref_cache = all_cache(target)
    target.prefill([10, 11, 12, 13])
    positions = torch.arange(3) + target.cache_len
    out = target._run_layers(torch.tensor([14, 15, 16]), positions, None, (), False, target.layers)
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-4, rtol=1e-4)
    for (k, v), (k0, v0) in zip(all_cache(target), ref_cache):
        torch.testing.assert_close(k, k0, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v, v0, atol=1e-5, rtol=1e-5)


def test_slim_pass_reads_the_cache_and_leaves_it_untouched(tiny_target):
    target = tiny_target
    ids = [10, 11, 12, 13, 14, 15]
    target.prefill(ids[:4])
    before = all_cache(target)
    last = target.num_layers - 1
    out = target.forward(torch.tensor(ids[4:]), torch.arange(2), None, active_layers=range(last))
    assert target.cache_len == 4
    # a pass over L-1 of L layers is counted, at (L-1)/L of a full forward (cost-weighted forwards)
    assert target.num_forwards == 1 and target.forward_cost == pytest.approx(last / target.num_layers)
    for (k, v), (k0, v0) in zip(all_cache(target), before):
        assert torch.equal(k, k0) and torch.equal(v, v0)
    # Skipping only the last layer: the block rows equal the full model's hidden state after layer
    # L-2 put through the final norm and head.
    with torch.inference_mode():
        full = target.model(torch.tensor([ids]), output_hidden_states=True).hidden_states[last][0, 4:]
        ref = target.model.lm_head(target.model.model.norm(full)).float()
    torch.testing.assert_close(out.logits, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("layers", [(0, 1), (0, 2, 3)])
def test_subset_wrapper_with_its_own_cache_equals_an_uncached_run(tiny_target, layers):
    """An early-exit / slim drafter: prefill + incremental forwards equal one uncached pass."""
    sub = TargetModel(tiny_target.model, tiny_target.tokenizer, layers=layers)
    ids = [10, 11, 12, 13, 14, 15, 16]
    sub.prefill(ids[:4])
    a = sub.forward(torch.tensor(ids[4:6]), torch.arange(2), None).logits
    b = sub.forward(torch.tensor(ids[6:]), torch.arange(1), None).logits
    fresh = TargetModel(tiny_target.model, tiny_target.tokenizer, layers=layers)
    fresh.reset()
    ref = fresh._run_layers(torch.tensor(ids), torch.arange(len(ids)), None, (), False, fresh.layers).logits
    torch.testing.assert_close(torch.cat([a, b]), ref[4:], atol=1e-4, rtol=1e-4)
    assert sub.cache_len == len(ids)
    # the target's own cache is separate
    assert tiny_target.cache is None or tiny_target.cache_len == 0


def test_invalid_layer_sets_are_refused(tiny_target):
    with pytest.raises(ValueError):
        TargetModel(tiny_target.model, layers=[0, 99])
    sub = TargetModel(tiny_target.model, layers=[0, 1])
    sub.prefill([10, 11])
    with pytest.raises(ValueError):
        sub.forward(torch.tensor([12]), torch.arange(1), None, active_layers=[2])


def name_the_layer_cache_past_key_values(model) -> None:
    """Decoder layers as transformers before 5.2x has them: the cache argument is `past_key_values`
    (their **kwargs would swallow a `cache=` silently)."""
    import inspect

    for layer in model.model.layers:
        base = type(layer)
        # the installed transformers' own name, under which the renamed layer hands the cache on
        own = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"

        class Renamed(base):
            def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                        use_cache=False, position_embeddings=None, **kwargs):
                assert "cache" not in kwargs, "the cache went in under the wrong name"
                return super().forward(hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                       use_cache=use_cache, position_embeddings=position_embeddings,
                                       **{own: past_key_values}, **kwargs)

        layer.__class__ = Renamed


def test_the_layer_loop_passes_the_cache_under_the_name_the_decoder_layers_take(tiny_target):
    ids = [10, 11, 12, 13, 14, 15, 16]
    ref = TargetModel(tiny_target.model, tiny_target.tokenizer, layers=(0, 1))
    ref.prefill(ids[:4])
    expected = ref.forward(torch.tensor(ids[4:]), torch.arange(3), None).logits
    name_the_layer_cache_past_key_values(tiny_target.model)
    sub = TargetModel(tiny_target.model, tiny_target.tokenizer, layers=(0, 1))
    sub.prefill(ids[:4])
    assert sub.cache_len == 4
    torch.testing.assert_close(sub.forward(torch.tensor(ids[4:]), torch.arange(3), None).logits, expected)
    assert sub.cache_len == len(ids)
