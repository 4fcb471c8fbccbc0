"""Write tiny llama-architecture GGUF models with random weights, for real ``llama-server`` tests.

No model can be downloaded where Hotseat's tests run, so we make our own with the ``gguf``
package: a real llama graph (token embedding, RMS norms, rotary attention, SwiGLU
feed-forward, output head) with seeded random float32 weights. The text they generate
is noise, but ``llama-server`` loads them, tokenizes, fills its slots, streams and reports
``/slots`` and ``/metrics`` exactly as it does for a real model.

The tokenizer is what makes a model usable by the server, and it is easy to get wrong:
a SentencePiece-style (``llama``) vocabulary with ``<unk>``, ``<s>``, ``</s>``, **all 256
byte tokens** ``<0x00>``..``<0xFF>`` (llama.cpp looks the newline up as ``<0x0A>`` and
falls back to byte tokens for anything else it cannot spell), the ``▁`` space marker,
printable ASCII and a few hundred merges, plus a ChatML chat template (which
``llama-server`` recognises with or without ``--jinja``).

Output is deterministic: the same spec always writes the same bytes.

Usage::

    python scripts/llama/tiny_gguf.py OUT_DIR      # writes OUT_DIR/tiny-small.gguf, tiny-large.gguf
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

GENERATOR_VERSION = 1
"""Bump when the written bytes change, so cached models are regenerated."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

SPACE = "\u2581"  # SentencePiece's word-boundary marker
WORDS = (
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "it",
    "for",
    "you",
    "was",
    "on",
    "are",
    "with",
    "as",
    "be",
    "at",
    "this",
    "have",
    "from",
    "or",
    "one",
    "had",
    "by",
    "but",
    "not",
    "what",
    "all",
    "were",
    "we",
    "when",
    "your",
    "can",
    "said",
    "there",
    "use",
    "an",
    "each",
    "which",
    "she",
    "do",
    "how",
    "their",
    "if",
    "will",
    "up",
    "other",
    "about",
    "out",
    "many",
    "then",
    "them",
    "these",
    "so",
    "some",
    "her",
    "would",
    "make",
    "like",
    "him",
    "into",
    "time",
    "has",
    "look",
    "two",
    "more",
    "write",
    "go",
    "see",
    "number",
    "no",
    "way",
    "could",
    "people",
    "my",
    "than",
    "first",
    "water",
    "been",
    "call",
    "who",
    "oil",
    "its",
    "now",
    "find",
    "long",
    "down",
    "day",
    "did",
    "get",
    "come",
    "made",
    "may",
    "part",
    "hot",
    "seat",
    "model",
    "pool",
    "swap",
    "load",
    "server",
    "token",
    "slot",
    "busy",
    "idle",
    "wait",
    "hello",
    "world",
)


@dataclass(frozen=True)
class ModelSpec:
    """The shape of one generated model."""

    name: str
    embedding: int
    layers: int
    heads: int
    feed_forward: int
    context: int
    seed: int


SMALL = ModelSpec("tiny-small", embedding=64, layers=2, heads=4, feed_forward=192,
                  context=4096, seed=1)  # fmt: skip
"""Under 1 MB: loads in milliseconds, generates thousands of tokens per second."""
LARGE = ModelSpec("tiny-large", embedding=256, layers=4, heads=8, feed_forward=768,
                  context=4096, seed=2)  # fmt: skip
"""About 15 MB: hundreds of tokens per second on one CPU thread, so a request of a few
hundred tokens keeps a slot visibly busy for seconds."""
MODELS = (SMALL, LARGE)


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types of a SentencePiece-style vocabulary with byte fallback."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    pieces: list[str] = [SPACE]
    pieces += [chr(c) for c in range(0x21, 0x7F)]
    # Every prefix of every word, with and without the space marker, so SentencePiece's
    # pairwise merges can reach the whole word.
    for word in WORDS:
        for end in range(2, len(word) + 1):
            pieces.append(SPACE + word[: end - 1])
            pieces.append(word[:end])
        pieces.append(SPACE + word)
    seen: set[str] = set(tokens)
    normal = [p for p in pieces if not (p in seen or seen.add(p))]  # type: ignore[func-returns-value]
    tokens += normal
    types += [gguf.TokenType.NORMAL] * len(normal)
    # Longer pieces score higher, so merges prefer whole words over letters.
    scores = [0.0] * (3 + 256) + [float(len(p)) - i * 1e-4 for i, p in enumerate(normal)]
    return tokens, scores, [int(t) for t in types]


def write_model(spec: ModelSpec, path: Path) -> Path:
    """Write ``spec`` as a GGUF file at ``path`` (atomically) and return the path."""
    tokens, scores, types = vocabulary()
    rng = np.random.default_rng(spec.seed)
    n_vocab, n_embd, n_ff = len(tokens), spec.embedding, spec.feed_forward

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")  # one per writer
    writer = gguf.GGUFWriter(str(partial), "llama")
    writer.add_name(spec.name)
    writer.add_context_length(spec.context)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(spec.layers)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.heads)
    writer.add_rope_dimension_count(n_embd // spec.heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    writer.add_tensor("token_embd.weight", weights(n_vocab, n_embd))
    for layer in range(spec.layers):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{block}.{name}.weight", weights(n_embd, n_embd))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", weights(n_ff, n_embd))
        writer.add_tensor(f"{block}.ffn_up.weight", weights(n_ff, n_embd))
        writer.add_tensor(f"{block}.ffn_down.weight", weights(n_embd, n_ff))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    head = weights(n_vocab, n_embd)
    head[:3] = 0.0  # <unk> <s> </s>: a zero row is almost never the likeliest token
    writer.add_tensor("output.weight", head)

    path.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(path)
    return path


def write_all(directory: Path) -> dict[str, Path]:
    """Write every model of :data:`MODELS` into ``directory``; name -> path."""
    return {spec.name: write_model(spec, directory / f"{spec.name}.gguf") for spec in MODELS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="directory to write the models into")
    args = parser.parse_args(argv)
    for name, path in write_all(args.out_dir).items():
        print(f"{name} {path} {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
