"""The tokenizer a chat format encodes and decodes with, beneath both :mod:`turnkit.encode` and :mod:`turnkit.parse`.

* :mod:`.binding`: the checkpoint's tokenizer, its added tokens, and a twin with every added token disabled;
* :mod:`.fast` (+ :mod:`.probe`): the exact tiktoken path for byte-level BPE, and its self-check at load;
* :mod:`.bytetable`: the bytes of every token id, for constant-time streaming decoding;
* :mod:`.stops`: the one set of ids that end a reply, shared by loss masks and by generation.
"""

from turnkit.tokenizer.binding import AddedToken, TokenizerBinding
from turnkit.tokenizer.bytetable import ByteTable
from turnkit.tokenizer.stops import StopSet

__all__ = ["AddedToken", "ByteTable", "StopSet", "TokenizerBinding"]
