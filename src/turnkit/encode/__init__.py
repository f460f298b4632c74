"""Encoding conversations to token ids: safe by default, with loss masks for any template.

* :mod:`.options`: everything an encode takes besides the messages;
* :mod:`.marking`: breaking control-token strings in data, tagging data with its source;
* :mod:`.encoder`: the encoding pipeline (render with provenance, tokenize, check, attribute, mask);
* :mod:`.prefix`: prefix stability and train-vs-serve prompt diffs;
* :mod:`.encoding`: the result.

The tokenizer it encodes with lives in :mod:`turnkit.tokenizer`; its errors in :mod:`turnkit.errors`.
"""

from turnkit.encode.encoder import Encoder, TrustedDataWarning
from turnkit.encode.encoding import IGNORE_INDEX, Encoding
from turnkit.encode.options import EncodeOptions
from turnkit.errors import EmptyMaskError, EncodeError, TokenizerError

__all__ = [
    "IGNORE_INDEX",
    "EmptyMaskError",
    "EncodeError",
    "EncodeOptions",
    "Encoder",
    "Encoding",
    "TokenizerError",
    "TrustedDataWarning",
]
