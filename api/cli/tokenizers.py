"""Tokenizers of `hydraplan data convert`: a byte-level one (always there) and tiktoken's (optional).

- `bytes` (the default, and what the tests use): each UTF-8 byte is one token (ids 0..255) and
  every document ends with the end-of-text token 256, so the vocabulary has 257 ids. It needs no
  file and no network.
- `tiktoken:NAME` (e.g. `tiktoken:gpt2`, `tiktoken:cl100k_base`): the BPE encodings of the
  `tiktoken` package (`pip install tiktoken`), each document ending with the encoding's
  `<|endoftext|>`. tiktoken downloads its BPE files on first use; without network it needs them in
  its cache (`TIKTOKEN_CACHE_DIR`), and says so in one line when they are not there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["ByteTokenizer", "TokenizerError", "Tokenizer", "make_tokenizer"]

BYTE_EOS = 256


class TokenizerError(ValueError):
    """The tokenizer cannot be made (unknown name, package or files missing); one line."""


class Tokenizer(Protocol):
    """What the converter needs: ids of a text, the vocabulary size and the end-of-text id."""

    name: str
    vocab_size: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes as tokens, plus one end-of-text id."""

    name: str = "bytes"
    vocab_size: int = BYTE_EOS + 1
    eos_id: int = BYTE_EOS

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


@dataclass(frozen=True)
class TiktokenTokenizer:
    """A tiktoken encoding; special tokens in the text are encoded as plain text."""

    name: str
    vocab_size: int
    eos_id: int
    encoding: object

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)


def make_tokenizer(spec: str) -> Tokenizer:
    """`bytes` or `tiktoken:NAME`."""
    if spec == "bytes":
        return ByteTokenizer()
    kind, _, name = spec.partition(":")
    if kind != "tiktoken" or not name:
        raise TokenizerError(f"--tokenizer {spec}: one of 'bytes' or 'tiktoken:NAME' (e.g. tiktoken:gpt2)")
    try:
        import tiktoken
    except ImportError:
        raise TokenizerError(
            f"--tokenizer {spec}: the tiktoken package is not installed (pip install tiktoken)"
        ) from None
    try:
        encoding = tiktoken.get_encoding(name)
    except ValueError as exc:
        raise TokenizerError(f"--tokenizer {spec}: {exc}") from None
    except Exception as exc:  # tiktoken fetches its BPE file over the network on first use
        raise TokenizerError(
            f"--tokenizer {spec}: tiktoken could not load the {name} BPE file ({type(exc).__name__}); without "
            "network, put it in TIKTOKEN_CACHE_DIR or use --tokenizer bytes"
        ) from None
    return TiktokenTokenizer(f"tiktoken:{name}", encoding.n_vocab, encoding.eot_token, encoding)
