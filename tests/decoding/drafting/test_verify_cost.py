"""The key a measured verify-cost curve is cached under (CaDDTree, DominoTree's cond_adaptive budget)."""


def test_a_cost_curve_is_not_reused_across_graphs_or_attention_kernels(tiny_llama):
    """An eager curve on a GPU is flat where the host's launches set the pace; a CUDA-graph one is not: before
    2026-12-05 both modes shared one cached curve, and the stop rule of the second sized its trees by the first."""
    from decoding.drafting.verify_cost import machine_key

    eager = machine_key(tiny_llama, "drafters/x/dflash")
    assert eager.endswith(f"-{tiny_llama.config._attn_implementation}") and "cpu" in eager
    assert machine_key(tiny_llama, "drafters/x/dflash") == eager  # stable: the cache is found again
    tiny_llama.graphs = object()  # what a target with model.cuda_graph=true holds
    assert machine_key(tiny_llama, "drafters/x/dflash") == eager + "-graphs"
    tiny_llama.graphs = None
    keys = {}
    for attn in ("eager", "sdpa"):
        tiny_llama.config._attn_implementation = attn
        keys[attn] = machine_key(tiny_llama, "drafters/x/dflash")
    assert keys["eager"].endswith("-eager") and keys["sdpa"].endswith("-sdpa")


def test_a_target_alone_has_a_key_without_a_drafter(tiny_llama):
    """PTD's tau_per_cost curve times the target alone (search/ptd.py): its key names no drafter."""
    from decoding.drafting.verify_cost import machine_key

    alone, with_drafter = machine_key(tiny_llama), machine_key(tiny_llama, "drafters/x/dflash")
    assert "dflash" not in alone and with_drafter.replace("-dflash", "") == alone


def test_a_cost_curve_is_not_reused_across_a_different_split_over_devices():
    """A target spread over two GPUs pays a hop between them per forward: its curve is not the one-GPU curve."""
    from decoding.drafting.verify_cost import machine_key
    from decoding.engine.target import TargetModel
    from pipeline.zoo import random_target

    model = random_target("tiny", arch="llama", seed=3).model
    whole = machine_key(TargetModel(model))
    model.model.layers[1].to("meta")  # the meta device stands in for a second GPU
    split = machine_key(TargetModel(model))
    assert split != whole and split.replace("-cpu-x2-", "-cpu-") == whole
