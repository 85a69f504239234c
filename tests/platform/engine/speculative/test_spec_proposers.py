"""Proposers: prompt lookup over a request's own tokens (latest and longest match first, loops
continued through the draft) and per-adapter suffix tables of past outputs (kept apart per
adapter, bounded)."""

from __future__ import annotations

import pytest

from loraplex.platform.engine.speculative import SpecConfig
from loraplex.platform.engine.speculative.ngram import NgramIndex
from loraplex.platform.engine.speculative.suffix_table import AdapterTables


def own(tokens: list[int], k: int, n_min: int = 1, n_max: int = 3) -> list[int]:
    index = NgramIndex(n_min, n_max)
    index.extend(tokens)
    return index.propose(tokens[-n_max:], k, own=True)


def test_prompt_lookup_takes_the_latest_occurrence_of_the_longest_match():
    assert own([1, 2, 3, 9, 9, 2, 3, 7, 7, 2, 3], 2) == [7, 7]  # latest "2 3"
    # "1 2 3" (n=3) beats the later "2 3" (n=2)
    assert own([1, 2, 3, 4, 5, 8, 2, 3, 6, 1, 2, 3], 2, n_max=3) == [4, 5]
    assert own([5, 6, 7, 8], 3) == []  # nothing repeats
    assert own([4, 4, 4], 0) == []


def test_prompt_lookup_continues_a_loop_through_its_own_draft():
    assert own([9, 1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]
    assert own([3, 3, 3], 4) == [3, 3, 3, 3]


def test_index_grows_incrementally_like_a_fresh_one():
    toks = [1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 1, 2]
    index = NgramIndex(1, 3)
    for i in range(0, len(toks), 3):
        index.extend(toks[i : i + 3])
    assert index.propose(toks[-3:], 3, own=True) == own(toks, 3)


def test_adapter_tables_draft_from_that_adapters_outputs_only():
    tables = AdapterTables(2, 3, max_tokens=1024)
    tables.add_output("a", [10, 11, 12, 13, 14])
    tables.add_output(None, [10, 11, 20, 21])
    assert tables.propose("a", [5, 10, 11], 3) == [12, 13, 14]
    assert tables.propose(None, [5, 10, 11], 3) == [20, 21]  # stops at the output's end
    assert tables.propose("b", [5, 10, 11], 3) == []
    # a continuation never runs from one output into the next
    tables.add_output("a", [30, 31])
    assert tables.propose("a", [13, 14], 3) == []


def test_adapter_tables_are_bounded():
    tables = AdapterTables(2, 2, max_tokens=1024, max_adapters=2)
    for i in range(400):
        tables.add_output("a", [i % 50, 1000 + i, 2000 + i])
    assert tables.num_tokens("a") <= 1024
    assert tables.propose("a", [399 % 50, 1399], 1) == [2399]  # the newest survive
    tables.add_output("b", [1, 2, 3])
    tables.add_output("c", [1, 2, 3])
    assert tables.num_tokens("a") == 0  # least recently used adapter dropped


def test_spec_config_refuses_what_is_not_built_by_name():
    with pytest.raises(NotImplementedError, match="eagle.*not built"):
        SpecConfig(method="eagle")
    with pytest.raises(ValueError, match="a draft_model is given with method 'draft_model' or"):
        SpecConfig(method="draft_model")
    with pytest.raises(ValueError, match="unknown speculative method"):
        SpecConfig(method="lookahead")
    with pytest.raises(ValueError, match="K bounds"):
        SpecConfig(k_min=3, k_max=2)
