"""pipeline/models.py: image-text checkpoints (Gemma 3 4B-27B, Mistral 3, LLaVA) run as their text part's causal LM,
sharing the checkpoint's weights; what has no such text model is one line; a load frees what a finished job left."""

import pytest
import torch
import transformers

from decoding.engine.loop import generate
from decoding.engine.target import TargetModel
from decoding.methods.ar import AR
from pipeline.models import ModelConfig, ModelLoadError, load_model, text_causal_lm
from pipeline.zoo import SHAPES, uncached_greedy

TEXT = {**SHAPES["tiny"][0], "num_hidden_layers": 4, "max_position_embeddings": 4096, "initializer_range": 0.2}
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
              patch_size=14)


def image_text_config(family: str, vocab_size: int = TEXT["vocab_size"]):
    text = {**TEXT, "vocab_size": vocab_size}
    if family == "gemma3":  # Gemma 3 4B-27B: hybrid sliding/full text layers, a SigLIP tower
        return transformers.Gemma3Config(text_config={**text, "sliding_window": 8, "query_pre_attn_scalar": 16},
                                         vision_config=VISION, mm_tokens_per_image=4, image_token_index=vocab_size - 3,
                                         boi_token_index=vocab_size - 2, eoi_token_index=vocab_size - 1)
    if family == "mistral3":  # Mistral Small 3.1 / Ministral 3: no causal-LM class for the whole checkpoint
        return transformers.Mistral3Config(text_config={"model_type": "mistral", **text},
                                           vision_config={"model_type": "pixtral", "head_dim": 16, **VISION},
                                           image_token_index=vocab_size - 1)
    if family == "llava":  # LLaVA: a LLaMA decoder beside a CLIP tower
        return transformers.LlavaConfig(text_config={"model_type": "llama", **text},
                                        vision_config={"model_type": "clip_vision_model", "projection_dim": 32, **VISION},
                                        image_token_index=vocab_size - 1)
    # Qwen2.5-VL: its text stack (M-RoPE) has no causal-LM class of its own
    return transformers.Qwen2_5_VLConfig(text_config={**text, "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 4]}},
                                         vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 64,
                                                        "num_heads": 2, "out_hidden_size": TEXT["hidden_size"]})


def image_text_model(family: str, vocab_size: int = TEXT["vocab_size"]):
    torch.manual_seed(0)
    return transformers.AutoModelForImageTextToText.from_config(image_text_config(family, vocab_size)).eval()


def test_gemma3_image_text_checkpoint_runs_as_its_text_causal_lm_sharing_the_weights():
    whole = image_text_model("gemma3")
    text = text_causal_lm(whole)
    assert type(text).__name__ == "Gemma3ForCausalLM" and text.config is whole.config.text_config
    assert text.generation_config is whole.generation_config  # its end-of-turn tokens
    shared = {p.data_ptr() for p in whole.parameters()}
    assert all(p.data_ptr() in shared for p in text.parameters())  # nothing copied
    assert not any("vision" in name for name, _ in text.named_parameters())
    prompt = list(range(5, 30))  # past the 8-token window
    assert generate(AR(), TargetModel(text), prompt, max_new_tokens=12).new_tokens == uncached_greedy(whole, prompt, 12)


def test_a_text_checkpoint_is_returned_as_it_is():
    from pipeline.zoo import random_target

    model = random_target("tiny", arch="gemma3").model
    assert text_causal_lm(model) is model


def test_a_text_part_that_does_not_reproduce_the_checkpoint_is_one_line(monkeypatch):
    whole = image_text_model("gemma3")
    real = type(whole).forward

    def shifted(self, *args, **kwargs):  # the whole model doing something on text that its decoder does not
        out = real(self, *args, **kwargs)
        out.logits = out.logits + 1.0
        return out

    monkeypatch.setattr(type(whole), "forward", shifted)
    with pytest.raises(ModelLoadError, match="its text part alone .* does not reproduce the checkpoint's logits"):
        text_causal_lm(whole, "gemma3-4b")


@pytest.fixture
def saved(tmp_path, tiny_model_dirs):
    from transformers import AutoTokenizer

    def save(family: str):
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs["llama"])  # the character-level one of conftest
        path = tmp_path / family
        image_text_model(family, vocab_size=len(tokenizer) + 3).save_pretrained(path)
        tokenizer.save_pretrained(path)
        return ModelConfig(name=family, path=str(path), dtype="float32")

    return save


@pytest.mark.parametrize("family, text_class", [("mistral3", "MistralForCausalLM"), ("llava", "LlamaForCausalLM")])
def test_load_model_reads_an_image_text_checkpoint_without_a_causal_lm_class_through_its_text_part(saved, family,
                                                                                                   text_class):
    model, tokenizer = load_model(saved(family))
    assert type(model).__name__ == text_class and model.config._name_or_path.endswith(family)
    ids = tokenizer("hello there").input_ids
    assert len(generate(AR(), TargetModel(model, tokenizer), ids, max_new_tokens=4).new_tokens) == 4


def test_an_image_text_checkpoint_whose_text_part_has_no_causal_lm_class_is_one_line(saved):
    with pytest.raises(ModelLoadError, match=r"^model 'qwen2_5_vl': its text part \(qwen2_5_vl_text\) has no "
                                             r"causal-LM class in transformers, so the engine cannot run it alone$"):
        load_model(saved("qwen2_5_vl"))


def test_loading_a_model_first_frees_a_finished_jobs_graphed_target(tiny_model_dirs):
    """Hydra's basic launcher runs a sweep's jobs one after another in one process. A target with CUDA graphs is a
    reference cycle (its graphs hold its bound forward), which Python's automatic collection frees only when its
    own allocation counts say so: the next job's load must free it first, or two models share the GPU."""
    import gc
    import weakref

    from decoding.engine.cuda_graph import GraphReplayer

    config = ModelConfig(name="tiny-llama", path=str(tiny_model_dirs["llama"]), dtype="float32")
    model, tokenizer = load_model(config)
    graphed = TargetModel(model, tokenizer, graphs=GraphReplayer(True, "model.cuda_graph", emulate=True))
    generate(AR(), graphed, tokenizer("hello there").input_ids, max_new_tokens=4)
    assert graphed.graphs.captures >= 1
    finished = weakref.ref(graphed)
    collecting = gc.isenabled()
    gc.disable()  # the worst case: no automatic collection between the jobs
    try:
        del graphed, model
        assert finished() is not None  # a cycle: dropping the job's names does not free it
        load_model(config)  # the next job
        assert finished() is None
    finally:
        if collecting:
            gc.enable()
