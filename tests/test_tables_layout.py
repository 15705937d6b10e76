"""Table blocks cover token-stable spans: in every Spider and BIRD dev schema, with any table
order or subset, the trie finds every listed table and only the head and the question remain."""

from __future__ import annotations

import random

import pytest

from headstart.models import load_tokenizer
from headstart.paths import default_bird_dir, default_spider_dir, default_tokenizer_dir
from headstart.prompt import PromptBuilder
from headstart.schema.spider_json import load_spider_tables
from headstart.tables.layout import LayoutError, TableLayout
from headstart.tables.trie import Span

QUESTION = "How many rows are there?\n Hint: 'x' = 1;"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(default_tokenizer_dir())


def _schemas():
    spider = load_spider_tables(default_spider_dir() / "tables.json")
    bird = load_spider_tables(default_bird_dir() / "dev_tables.json")
    return [pytest.param(s, id=f"spider-{k}") for k, s in spider.items()] + \
           [pytest.param(s, id=f"bird-{k}") for k, s in bird.items()]


def layout_of(tokenizer, schema, mode="pfk") -> TableLayout:
    return TableLayout.build(PromptBuilder(tokenizer, schema), model_id="m", dtype="float32", mode=mode)


@pytest.mark.parametrize("schema", _schemas())
def test_every_table_is_found_in_any_order_and_subset(tokenizer, schema):
    layout = layout_of(tokenizer, schema)
    assert all(not t.rest for t in layout.texts.values())  # the whole `table + separator` is stable
    rng = random.Random(schema.db_id)
    names = schema.table_names
    orders = [names, rng.sample(names, len(names)), rng.sample(names, max(1, len(names) // 2))]
    for order in orders:
        ids = PromptBuilder(tokenizer, schema.subset(order)).prompt_ids(QUESTION)
        match = layout.trie.match(ids)
        assert match.table_names == tuple(order)
        head, last_end = len(layout.head_ids), match.tables[-1].end
        assert match.tables[0].start == head
        assert all(a.end == b.start for a, b in zip(match.tables, match.tables[1:]))  # blocks are contiguous
        assert match.compute == (Span(0, head), Span(last_end, len(ids)))
        assert ids[:head] == list(layout.head_ids)


def test_head_is_the_template_before_the_first_table(tokenizer):
    schema = load_spider_tables(default_spider_dir() / "tables.json")["concert_singer"]
    prompt = PromptBuilder(tokenizer, schema)
    layout = layout_of(tokenizer, schema)
    head_text = tokenizer.decode(list(layout.head_ids))
    assert head_text.startswith("<|im_start|>system\n") and head_text.endswith("Database schema:\n")
    assert prompt.base_ids[:len(layout.head_ids)] == list(layout.head_ids)


@pytest.mark.parametrize("mode,groups", [
    ("pfk", (("stadium", "singer", "concert", "singer_in_concert"),)),
    ("independent", (("stadium",), ("singer",), ("concert",), ("singer_in_concert",))),
])
def test_groups_per_mode(tokenizer, mode, groups):
    schema = load_spider_tables(default_spider_dir() / "tables.json")["concert_singer"]
    assert layout_of(tokenizer, schema, mode).groups == groups


def test_pfk_groups_list_their_tables_in_schema_order(tokenizer):
    """pets_1's topological order is Student, Pets, Has_Pet (Has_Pet references both); its
    prompt lists Student, Has_Pet, Pets, and so does its group (issue 30)."""
    schema = load_spider_tables(default_spider_dir() / "tables.json")["pets_1"]
    assert layout_of(tokenizer, schema).groups == (("Student", "Has_Pet", "Pets"),)


@pytest.mark.parametrize("schema", _schemas())
def test_a_single_group_is_the_whole_schema_prompt(tokenizer, schema):
    """Where every table is in one foreign-key group, the group's encode sequence is the
    whole-schema prompt up to the end of its last table: its blocks are exact there."""
    prompt = PromptBuilder(tokenizer, schema)
    layout = TableLayout.build(prompt, model_id="m", dtype="float32", mode="pfk")
    first, _ = layout.group_sequence(layout.groups[0])
    if len(layout.groups) == 1:
        assert prompt.base_ids[:len(first)] == first
    else:  # the first group still starts the prompt with the schema's first table
        assert layout.groups[0][0] == schema.table_names[0]


def test_group_sequence_is_head_then_tables(tokenizer):
    schema = load_spider_tables(default_spider_dir() / "tables.json")["flight_2"]
    layout = layout_of(tokenizer, schema)
    assert layout.groups == (("airlines",), ("airports", "flights"))
    ids, offsets = layout.group_sequence(layout.groups[1])
    n_head, n_airports = len(layout.head_ids), len(layout.texts["airports"].ids)
    assert offsets == {"airports": n_head, "flights": n_head + n_airports}
    assert ids == list(layout.head_ids) + list(layout.texts["airports"].ids) + list(layout.texts["flights"].ids)


def test_mode_head_and_schema_are_in_the_scope(tokenizer):
    spider = load_spider_tables(default_spider_dir() / "tables.json")
    schema = spider["concert_singer"]
    pfk, independent = layout_of(tokenizer, schema, "pfk"), layout_of(tokenizer, schema, "independent")
    other_head = TableLayout.build(PromptBuilder(tokenizer, schema, system_prompt="Be brief."),
                                   model_id="m", dtype="float32", mode="pfk")
    hashes = {pfk.scope.schema_hash, independent.scope.schema_hash, other_head.scope.schema_hash}
    assert len(hashes) == 3
    assert layout_of(tokenizer, schema, "pfk").scope == pfk.scope  # deterministic


def test_unknown_mode_lists_valid_ones(tokenizer):
    schema = load_spider_tables(default_spider_dir() / "tables.json")["singer"]
    with pytest.raises(LayoutError, match="valid: pfk, independent"):
        layout_of(tokenizer, schema, "off")
