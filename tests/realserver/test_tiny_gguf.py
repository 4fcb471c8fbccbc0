"""The tiny-model generator (scripts/llama/tiny_gguf.py): vocabulary and determinism."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import gguf

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "llama" / "tiny_gguf.py"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tiny_gguf", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("tiny_gguf", module)
    spec.loader.exec_module(module)
    return module


def test_vocabulary_has_specials_every_byte_and_unique_pieces():
    """<unk> <s> </s> come first, then all 256 byte tokens <0x00>..<0xFF>, then unique
    normal pieces including the SentencePiece space marker."""
    tokens, scores, types = generator().vocabulary()
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert tokens[3:259] == [f"<0x{b:02X}>" for b in range(256)]
    assert set(types[3:259]) == {int(gguf.TokenType.BYTE)}
    assert "\u2581" in tokens
    assert len(set(tokens)) == len(tokens) == len(scores) == len(types)


def test_models_are_deterministic_llama_files_with_a_chat_template(tmp_path):
    """Two runs write the same bytes; each file is a llama GGUF with the tokenizer, the
    special token ids and the chat template llama-server needs."""
    module = generator()
    first = module.write_all(tmp_path / "a")
    second = module.write_all(tmp_path / "b")
    for name, path in first.items():
        assert path.read_bytes() == second[name].read_bytes(), name
        reader = gguf.GGUFReader(path)
        fields = reader.fields
        arch = fields["general.architecture"]
        assert bytes(arch.parts[arch.data[0]]).decode() == "llama"
        model = fields["tokenizer.ggml.model"]
        assert bytes(model.parts[model.data[0]]).decode() == "llama"
        assert "tokenizer.chat_template" in fields
        eos = fields["tokenizer.ggml.eos_token_id"]
        assert int(eos.parts[eos.data[0]][0]) == 2
    assert first["tiny-large"].stat().st_size > 10 * first["tiny-small"].stat().st_size
