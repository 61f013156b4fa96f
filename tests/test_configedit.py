"""kit.configedit: one field of a user's kit.yaml changed in place; every other byte stays as the user wrote it."""

from __future__ import annotations

import pytest

from kit.configedit import set_field


@pytest.mark.parametrize("before,after", [
    # the block kit init writes: the value changes, the comment and the other lines stay
    ("# mine\nmodel:\n  dir: ./models   # where\n  file: old.gguf    # the file\n  name: x\nserve:\n  port: 1\n",
     "# mine\nmodel:\n  dir: ./models   # where\n  file: new.gguf    # the file\n  name: x\nserve:\n  port: 1\n"),
    # no file line in the block: added first in the block, never in the next section
    ("model:\n  dir: ./m\nother:\n  file: keep\n", "model:\n  file: new.gguf\n  dir: ./m\nother:\n  file: keep\n"),
    # the section is the last line
    ("preset: cpu\nmodel:\n", "preset: cpu\nmodel:\n  file: new.gguf\n"),
    # a flow mapping is rewritten on its own line
    ("preset: cpu\nmodel: {dir: ./m}\n", "preset: cpu\nmodel: {dir: ./m, file: new.gguf}\n"),
    # no section: appended
    ("preset: cpu\n", "preset: cpu\nmodel:\n  file: new.gguf\n"),
    ("preset: cpu", "preset: cpu\nmodel:\n  file: new.gguf\n"),
    # a commented-out line inside the block is not the field
    ("model:\n  # file: example.gguf\n  dir: ./m\n", "model:\n  file: new.gguf\n  # file: example.gguf\n  dir: ./m\n"),
    # a comment at the start of a line inside the block does not end the block
    ("model:\n  dir: ./m\n# the model I use\n  file: old.gguf\n", "model:\n  dir: ./m\n# the model I use\n  file: new.gguf\n"),
    # the users' comments are often Chinese: kept byte for byte
    ("model:\n  file: old.gguf  # 模型文件\n", "model:\n  file: new.gguf  # 模型文件\n"),
    # a key that only ends in "file" is another field
    ("model:\n  profile: a\n", "model:\n  file: new.gguf\n  profile: a\n"),
])
def test_set_field(tmp_path, before, after):
    path = tmp_path / "kit.yaml"
    path.write_text(before)
    set_field(path, "model", "file", "new.gguf")
    assert path.read_text() == after


def test_values_that_need_quotes_are_quoted(tmp_path):
    import yaml

    path = tmp_path / "kit.yaml"
    path.write_text("model:\n  file: a\n")
    for value in ("yes", "1.5", "a: b", "#x", "hf:org/repo@v1"):
        set_field(path, "model", "file", value)
        assert yaml.safe_load(path.read_text())["model"]["file"] == value, path.read_text()


@pytest.mark.parametrize("before,after", [
    # a new key in a block: a list is written in flow style on its own line, with kit's comment
    ("engines:\n  llama.cpp:\n    ubatch: 512  # mine\n",
     "engines:\n  llama.cpp:\n    tensor_split: [3, 1]  # kit tune\n    ubatch: 512  # mine\n"),
    # an existing list: replaced on its line, the comment given replaces the user's
    ("engines:\n  llama.cpp:\n    tensor_split: [1, 1]  # mine\n",
     "engines:\n  llama.cpp:\n    tensor_split: [3, 1]  # kit tune\n"),
    # inside a flow mapping: the mapping is rewritten in flow style on its line
    ("engines: {llama.cpp: {ubatch: 512}}\n", "engines: {llama.cpp: {tensor_split: [3, 1], ubatch: 512}}\n"),
])
def test_a_list_value_is_written_in_flow_style(tmp_path, before, after):
    from kit.configedit import set_path

    path = tmp_path / "kit.yaml"
    path.write_text(before)
    set_path(path, ["engines", "llama.cpp", "tensor_split"], [3, 1], comment="kit tune")
    assert path.read_text() == after


@pytest.mark.parametrize("before,after", [
    # no engines section: the whole path is added, two spaces per level
    ("preset: cpu\n", "preset: cpu\nengines:\n  llama.cpp:\n    ubatch: 256\n"),
    # the section holds another engine: the new one goes first in it, the other stays as written
    ("preset: cpu\nengines:\n  vllm:\n    x: 1\n", "preset: cpu\nengines:\n  llama.cpp:\n    ubatch: 256\n  vllm:\n    x: 1\n"),
    # the line exists with no comment: none is added
    ("engines:\n  llama.cpp:\n    ubatch: 512\n", "engines:\n  llama.cpp:\n    ubatch: 256\n"),
])
def test_a_nested_path_is_added_where_it_is_missing(tmp_path, before, after):
    from kit.configedit import set_path

    path = tmp_path / "kit.yaml"
    path.write_text(before)
    set_path(path, ["engines", "llama.cpp", "ubatch"], 256)
    assert path.read_text() == after


@pytest.mark.parametrize("before,after", [
    # a comment indented less than the block's keys (but not at column 0) is still inside the block
    ("engines:\n  llama.cpp:\n  # tuned by hand\n    ubatch: 512\n", "engines:\n  llama.cpp:\n  # tuned by hand\n    ubatch: 256\n"),
    ("engines:\n  # mine\n  llama.cpp:\n    ubatch: 512\n", "engines:\n  # mine\n  llama.cpp:\n    ubatch: 256\n"),
    # a blank line or a comment between a block's key and its first child: the block is not empty
    ("engines:\n\n  llama.cpp:\n    ubatch: 512\n", "engines:\n\n  llama.cpp:\n    ubatch: 256\n"),
    ("engines:\n  llama.cpp:\n # x\n    ubatch: 512\n", "engines:\n  llama.cpp:\n # x\n    ubatch: 256\n"),
    # the key missing from a block that another section follows: added in the block, the file written
    ("engines:\n  llama.cpp:\n    ctx: 1\npreset: cpu\n", "engines:\n  llama.cpp:\n    ubatch: 256\n    ctx: 1\npreset: cpu\n"),
    # an empty block followed by another section or a sibling: the rest of the path goes under it, indented
    ("engines:\npreset: cpu\n", "engines:\n  llama.cpp:\n    ubatch: 256\npreset: cpu\n"),
    ("engines:\n  llama.cpp:\n  vllm:\n    x: 1\n", "engines:\n  llama.cpp:\n    ubatch: 256\n  vllm:\n    x: 1\n"),
    # a sibling block holding the same key is not the one changed
    ("engines:\n  llama.cpp:\n    ctx: 1\n  vllm:\n    ubatch: 2\n",
     "engines:\n  llama.cpp:\n    ubatch: 256\n    ctx: 1\n  vllm:\n    ubatch: 2\n"),
    # a flow mapping that lacks the inner mapping: it is made
    ("engines: {vllm: {x: 1}}\n", "engines: {llama.cpp: {ubatch: 256}, vllm: {x: 1}}\n"),
])
def test_blocks_are_found_through_blank_lines_comments_and_siblings(tmp_path, before, after):
    from kit.configedit import set_path

    path = tmp_path / "kit.yaml"
    path.write_text(before)
    set_path(path, ["engines", "llama.cpp", "ubatch"], 256)
    assert path.read_text() == after


def test_a_comment_given_goes_on_the_line_added_under_an_empty_block(tmp_path):
    from kit.configedit import set_path

    path = tmp_path / "kit.yaml"
    path.write_text("engines:\n  llama.cpp:\nserve:\n  port: 1\n")
    set_path(path, ["engines", "llama.cpp", "tensor_split"], [3, 1], comment="kit tune")
    assert path.read_text() == "engines:\n  llama.cpp:\n    tensor_split: [3, 1]  # kit tune\nserve:\n  port: 1\n"


def test_long_and_nested_values_stay_on_one_line(tmp_path):
    """PyYAML folds lines at 80 columns by default and writes nested mappings in block style: either would break the
    one-line edit. Worked out by hand: 30 paths of 9 characters are far past 80 columns."""
    from kit.configedit import set_path

    paths = [f"/m/{i:02d}.gguf" for i in range(30)]  # "/m/00.gguf" ... 10 characters each
    path = tmp_path / "kit.yaml"
    path.write_text("engines:\n  llama.cpp:\n    extra_args: []\n")
    set_path(path, ["engines", "llama.cpp", "extra_args"], paths)
    assert path.read_text() == f"engines:\n  llama.cpp:\n    extra_args: [{', '.join(paths)}]\n"
    set_path(path, ["engines", "vllm", "local_sources"], {"cutlass": {"path": "/d/c"}})
    assert path.read_text().splitlines()[1] == "  vllm:"
    assert path.read_text().splitlines()[2] == "    local_sources: {cutlass: {path: /d/c}}"
    # inside a flow mapping, the rewritten line is one line too
    path.write_text("engines: {llama.cpp: {ubatch: 1}}\n")
    set_path(path, ["engines", "llama.cpp", "extra_args"], paths)
    assert path.read_text() == f"engines: {{llama.cpp: {{extra_args: [{', '.join(paths)}], ubatch: 1}}}}\n"
